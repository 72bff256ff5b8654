"""scripts/compare_check.py: it finds a false red and a false green against real imports (gcc-built modules)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fixtures.sofix import EXT_SUFFIX, compile_so, ext_module

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "compare_check.py"


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv whose package `pkg` imports `pkg._good` and never `pkg._bad` (it needs an absent library)."""
    root = tmp_path_factory.mktemp("cmp")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / "venv")], check=True, timeout=120)
    site = next((root / "venv" / "lib").glob("python3*/site-packages"))
    pkg = site / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from pkg import _good\n", encoding="utf-8")
    ext_module(pkg, "_good")
    compile_so(root / "lib" / "libgone.so", "void gone(void) {}\n", soname="libgone.so")
    ext_module(pkg, "_bad", "gone();", f"-L{root / 'lib'}", "-lgone", prelude="void gone(void);")
    return root / "venv"


def _results(tmp_path: Path, good: dict[str, Any], bad: dict[str, Any]) -> Path:
    modules = [
        {"module": "pkg", "dist": "pkg", "ok": True},
        {"module": f"pkg/_good{EXT_SUFFIX}", "dist": "pkg", **good},
        {"module": f"pkg/_bad{EXT_SUFFIX}", "dist": "pkg", **bad},
    ]
    cell = {
        "state": "pass",
        "reason": "",
        "stages": [
            {"name": "import", "state": "pass", "seconds": 1.0, "details": {"modules": modules, "warnings": []}}
        ],
    }
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"cells": [cell]}), encoding="utf-8")
    return path


def _compare(tmp_path: Path, venv: Path, results: Path, *cache: str) -> tuple[int, dict[str, Any]]:
    done = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            str(results),
            "--python",
            str(venv / "bin" / "python"),
            "--json",
            str(tmp_path / "out.json"),
            "-j",
            "2",
            *cache,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    return done.returncode, json.loads((tmp_path / "out.json").read_text(encoding="utf-8"))


MISSING = {"ok": False, "failure": {"kind": "missing-library"}, "reason": "missing shared library libgone.so"}


def test_right_verdicts_agree(tmp_path: Path, venv: Path) -> None:
    rc, out = _compare(tmp_path, venv, _results(tmp_path, {"ok": True}, {**MISSING, "needed": False}))
    assert (rc, out["agree"], out["false_red"], out["false_green"]) == (0, 2, [], [])


def test_a_red_module_that_import_does_not_need_is_a_false_red(tmp_path: Path, venv: Path) -> None:
    rc, out = _compare(tmp_path, venv, _results(tmp_path, {"ok": True}, MISSING))
    assert rc == 1
    assert out["false_red"] == [
        {
            "module": f"pkg/_bad{EXT_SUFFIX}",
            "compatlab": MISSING["reason"],
            "real": "cannot load; `import pkg` works without it",
        }
    ]


def test_a_red_module_that_loads_is_a_false_red_and_a_green_one_that_cannot_is_a_false_green(
    tmp_path: Path, venv: Path
) -> None:
    rc, out = _compare(tmp_path, venv, _results(tmp_path, MISSING, {"ok": True}))
    assert rc == 1
    assert [r["module"] for r in out["false_red"]] == [f"pkg/_good{EXT_SUFFIX}"]
    assert out["false_red"][0]["real"] == "loads"
    assert [g["module"] for g in out["false_green"]] == [f"pkg/_bad{EXT_SUFFIX}"]


def test_a_static_red_the_import_stage_did_not_load_is_compared_too(tmp_path: Path, venv: Path) -> None:
    results = _results(tmp_path, {"ok": True}, {"ok": True})
    data = json.loads(results.read_text(encoding="utf-8"))
    [cell] = data["cells"]
    cell["stages"][0]["details"]["modules"].pop()  # the import stage never saw pkg/_bad
    cell["stages"].insert(
        0,
        {
            "name": "static",
            "state": "fail",
            "seconds": 0.1,
            "details": {
                "findings": [
                    {
                        "severity": "fail",
                        "module": f"pkg/_bad{EXT_SUFFIX}",
                        "kind": "library",
                        "message": "libgone.so not found",
                    }
                ]
            },
        },
    )
    results.write_text(json.dumps(data), encoding="utf-8")
    rc, out = _compare(tmp_path, venv, results)
    assert rc == 1
    assert out["false_red"] == [
        {
            "module": f"pkg/_bad{EXT_SUFFIX}",
            "compatlab": "static: libgone.so not found",
            "real": "cannot load; `import pkg` works without it",
        }
    ]


def test_a_build_is_judged_by_its_own_file_not_by_the_one_its_name_imports(tmp_path: Path, venv: Path) -> None:
    # mpi4py ships MPI.mpich and MPI.openmpi, both PyInit_MPI: `import mpi4py.MPI` loads the one mpi4py picks,
    # which says nothing of the other. Here pkg/_bad.alt.so (needs an absent library) beside a good pkg/_bad.so.
    site = next((venv / "lib").glob("python3*/site-packages"))
    bad = site / "pkg" / f"_bad{EXT_SUFFIX}"
    alt = bad.with_name(f"_bad.alt{EXT_SUFFIX}")
    bad.rename(alt)
    ext_module(site / "pkg", "_bad")
    try:
        results = _results(tmp_path, {"ok": True}, {"ok": True})
        data = json.loads(results.read_text(encoding="utf-8"))
        data["cells"][0]["stages"][0]["details"]["modules"][2]["module"] = f"pkg/_bad.alt{EXT_SUFFIX}"
        results.write_text(json.dumps(data), encoding="utf-8")
        rc, out = _compare(tmp_path, venv, results)
    finally:
        bad.unlink()
        alt.rename(bad)
    assert rc == 1
    assert [g["module"] for g in out["false_green"]] == [f"pkg/_bad.alt{EXT_SUFFIX}"]


def test_a_kept_truth_is_read_again_only_while_the_environment_is_as_it_was(tmp_path: Path, venv: Path) -> None:
    cache = tmp_path / "truth"
    results = _results(tmp_path, {"ok": True}, {**MISSING, "needed": False})
    first = _compare(tmp_path, venv, results, "--cache", str(cache))
    again = _compare(tmp_path, venv, results, "--cache", str(cache))
    assert (first[1]["truth"], again[1]["truth"]) == ("ran", "cached")
    for out in (first[1], again[1]):
        del out["truth"], out["truth_seconds"]
    assert first == again
    assert (first[0], first[1]["agree"]) == (0, 2)
    # A file of the environment changed (pkg/_good now needs the absent library): the truth is asked again,
    # and finds the verdict that was right before wrong now.
    site = next((venv / "lib").glob("python3*/site-packages"))
    good = site / "pkg" / f"_good{EXT_SUFFIX}"
    kept = good.with_name("kept")
    good.rename(kept)
    good.write_bytes((site / "pkg" / f"_bad{EXT_SUFFIX}").read_bytes())
    try:
        rc, out = _compare(tmp_path, venv, results, "--cache", str(cache))
    finally:
        good.unlink()
        kept.rename(good)
    assert (rc, out["truth"]) == (1, "ran")
    assert [g["module"] for g in out["false_green"]] == [f"pkg/_good{EXT_SUFFIX}"]
    # As it was again: the first answers are read once more.
    rc, out = _compare(tmp_path, venv, results, "--cache", str(cache))
    assert (rc, out["truth"], out["agree"]) == (0, "cached", 2)
