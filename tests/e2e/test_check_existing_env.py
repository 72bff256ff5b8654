"""`compatlab check` on a real environment from the index, each module's verdict against a real import."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fixtures.envs import env_or_skip

SRC = Path(__file__).resolve().parents[2] / "src"

pytestmark = [pytest.mark.network, pytest.mark.slow]


def _imports(python: Path, module: str) -> bool:
    done = subprocess.run([str(python), "-c", f"import {module}"], capture_output=True, timeout=300, check=False)
    return done.returncode == 0


def _check(venv: Path, out: Path) -> dict[str, dict[str, Any]]:
    """`compatlab check --venv VENV --out OUT`, which must exit 0 with pass or partial; its stages by name."""
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    env.pop("VIRTUAL_ENV", None)
    done = subprocess.run(
        [sys.executable, "-m", "compatlab", "check", "--venv", str(venv), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    [cell] = json.loads((out / "results.json").read_text(encoding="utf-8"))["cells"]
    assert cell["state"] in ("pass", "partial"), cell["reason"]
    return {s["name"]: s for s in cell["stages"]}


COMPARE = Path(__file__).resolve().parents[2] / "scripts" / "compare_check.py"


def _compare(tmp_path: Path, venv: Path) -> dict[str, Any]:
    """scripts/compare_check.py over the check in *tmp_path*/out, which must agree: its figures."""
    compared = subprocess.run(
        [
            sys.executable,
            str(COMPARE),
            str(tmp_path / "out" / "results.json"),
            "--python",
            str(venv / "bin" / "python"),
            "--json",
            str(tmp_path / "compare.json"),
            # The environment is built once and kept (fixtures/envs.py): so are the real imports' answers,
            # asked again whenever a file of its site-packages changed (scripts/compare_check.py).
            "--cache",
            str(venv / ".compare-truth"),
        ],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert compared.returncode == 0, compared.stdout + compared.stderr
    return dict(json.loads((tmp_path / "compare.json").read_text(encoding="utf-8")))


@pytest.mark.long
def test_numba_environment_is_green_with_a_warning_for_its_tbb_layer(tmp_path: Path) -> None:
    venv = env_or_skip("numba")
    stages = _check(venv, tmp_path / "out")
    python = venv / "bin" / "python"
    modules = [m for m in stages["import"]["details"]["modules"] if m["module"].endswith(".so")]
    assert len(modules) > 20
    # Each module against a real import of it (by name, by path, mapped by its package): none red that
    # loads or that `import numba` does without, none green that cannot load.
    figures = _compare(tmp_path, venv)
    assert figures["modules"] == len(modules)
    assert figures["agree"] == len(modules)
    assert figures["false_red"] == figures["false_green"] == figures["packages_disagree"] == []
    for entry in modules:
        if not entry["ok"]:
            # Cannot load, and `import numba` does not need it: a warning naming it, never a failure.
            assert entry.get("needed") is False, entry
            assert entry["verdict"] in stages["import"]["details"]["warnings"]
    tbb = next(m for m in modules if m["module"].startswith("numba/np/ufunc/tbbpool."))
    assert not _imports(python, "numba.np.ufunc.tbbpool")
    assert tbb["verdict"] == (
        f"{tbb['module']}: missing shared library libtbb.so.12; `import numba` does not need it: it loads without "
        "mapping it (only imported inside _launch_threads.select_known_backend() (numba/np/ufunc/parallel.py:401), "
        "under try/except ImportError); numba says it is for: Loads a specific threading layer backend based on "
        "string"
    )
    assert stages["static"]["state"] == "warn"
    assert _imports(python, "numba")


@pytest.mark.long
def test_a_gpu_box_environment_is_red_only_where_import_is(tmp_path: Path) -> None:
    venv = env_or_skip("gpubox")
    stages = _check(venv, tmp_path / "out")
    modules = [m for m in stages["import"]["details"]["modules"] if m["module"].endswith(".so")]
    packages = {
        m["dist"]: m["module"] for m in stages["import"]["details"]["modules"] if not m["module"].endswith(".so")
    }
    assert packages["cuda-core"] == "cuda.core"
    assert packages["mpi4py"] == "mpi4py"
    # Each module against a real import of it in the same venv (by name, by path, mapped by its package).
    figures = _compare(tmp_path, venv)
    assert figures["modules"] == len(modules) > 100
    assert figures["agree"] == len(modules)
    assert figures["false_red"] == figures["false_green"] == figures["packages_disagree"] == []
    by = {m["module"]: m for m in modules}
    cv2 = by["cv2/cv2.abi3.so"]
    assert cv2["ok"]
    assert cv2["loaded"].startswith("by `import cv2`, which maps it; loaded alone, cv2/cv2.abi3.so: ")
    mpich = next(m for m in modules if m["module"].startswith("mpi4py/MPI.mpich."))
    assert mpich["verdict"] == (
        f"{mpich['module']}: missing shared library libmpi.so.12; `import mpi4py` does not need it here: it loads "
        "without mapping it, though mpi4py/__init__.py, which `import mpi4py` runs, names 'MPI': it may load it by path"
    )
    cu12 = [m for m in modules if m["module"].startswith("cuda/core/cu12/")]
    assert cu12
    assert all(m.get("needed") is False for m in cu12 if not m["ok"])
    assert not any(
        m["module"].startswith("cuda/core/cu13/") and not m["ok"] and m.get("needed") is not False for m in modules
    )
