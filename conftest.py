"""The lab's own tests: `tests/fixtures` (wheels, .so files, stand-in servers) is importable as `fixtures`,
and tests/unit starts no process (fixtures/in_process.py)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent / "tests"))

pytest_plugins = ["fixtures.in_process"]
