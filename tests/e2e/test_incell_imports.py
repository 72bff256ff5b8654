"""incell/ on the standard library alone, proven: each module imported in a fresh interpreter that cannot import
the lab's dependencies. The rules read from the source are in
tests/unit/test_layout.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from compatlab.proc import incell_path

PACKAGE = Path(incell_path()) / "compatlab" / "incell"
INCELL = sorted(
    ".".join(("compatlab", "incell", *p.relative_to(PACKAGE).with_suffix("").parts)).removesuffix(".__init__")
    for p in PACKAGE.rglob("*.py")
)
UNDER_PYTEST = ("compatlab.incell.plugin", "compatlab.incell.suites.")


@pytest.mark.parametrize("module", [m for m in INCELL if not m.startswith(UNDER_PYTEST)])
def test_each_incell_module_imports_with_the_labs_dependencies_blocked(module: str) -> None:
    blocked = [
        "packaging",
        "elftools",
        "tomli_w",
        "pytest",
        "compatlab.config",
        "compatlab.runs",
        "compatlab.stages",
        "compatlab.errors",
        "compatlab.proc",
    ]
    code = (
        f"import sys; sys.modules.update(dict.fromkeys({blocked!r})); "
        f"import importlib; importlib.import_module({module!r}); print('ok')"
    )
    done = subprocess.run(
        [sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(incell_path())!r}); {code}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "ok\n", "")
