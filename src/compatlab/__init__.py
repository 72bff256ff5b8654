"""compatlab: which torch × sgl-kernel × flashinfer × CUDA combinations work on this box, and why not.

Imports are lazy (as in pypa/build): ``compatlab.incell`` runs in a cell's venv, where only the standard
library is importable, and importing it must not pull in the lab's own dependencies through this file.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["__version__"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # Subpackages on first use: `compatlab.config` after `import compatlab`.
    if name in {"cli", "config", "incell", "render", "runs", "stages"}:
        return importlib.import_module(f"compatlab.{name}")
    raise AttributeError(f"module 'compatlab' has no attribute {name!r}")
