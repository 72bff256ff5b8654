"""`compatlab check` on a real environment from the index, each module's verdict against a real import."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fixtures.envs import env_or_skip

SRC = Path(__file__).resolve().parents[2] / "src"

pytestmark = [pytest.mark.network, pytest.mark.slow]


def _imports(python: Path, module: str) -> bool:
    done = subprocess.run([str(python), "-c", f"import {module}"], capture_output=True, timeout=300, check=False)
    return done.returncode == 0


def test_numba_environment_is_green_with_a_warning_for_its_tbb_layer(tmp_path: Path) -> None:
    venv = env_or_skip("numba")
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    env.pop("VIRTUAL_ENV", None)
    done = subprocess.run([sys.executable, "-m", "compatlab", "check", "--venv", str(venv), "--out",
                           str(tmp_path / "out")], capture_output=True, text=True, timeout=900, env=env, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads((tmp_path / "out" / "results.json").read_text(encoding="utf-8"))
    [cell] = results["cells"]
    assert cell["state"] in ("pass", "partial"), cell["reason"]
    stages = {s["name"]: s for s in cell["stages"]}
    python = venv / "bin" / "python"
    modules = [m for m in stages["import"]["details"]["modules"] if m["module"].endswith(".so")]
    assert len(modules) > 20
    for entry in modules:
        dotted = entry["module"].split(".", 1)[0].replace("/", ".")
        really = _imports(python, dotted)
        if really:
            assert entry["ok"], entry
        else:
            # Cannot load, and `import numba` does not need it: a warning naming it, never a failure.
            assert entry.get("needed") is False, entry
            assert entry["verdict"] in stages["import"]["details"]["warnings"]
    tbb = next(m for m in modules if m["module"].startswith("numba/np/ufunc/tbbpool."))
    assert not _imports(python, "numba.np.ufunc.tbbpool")
    assert tbb["verdict"] == (
        f"{tbb['module']}: missing shared library libtbb.so.12; `import numba` does not need it: it loads without "
        "mapping it (only imported inside _launch_threads.select_known_backend() (numba/np/ufunc/parallel.py:401), "
        "under try/except ImportError); numba says it is for: Loads a specific threading layer backend based on "
        "string")
    assert stages["static"]["state"] == "warn"
    assert _imports(python, "numba")
