"""`compatlab check` on a real venv over a gcc-built package with an optional native part."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from compatlab.cli import main
from compatlab.cli.check import run_check
from compatlab.config.pins import parse_pins
from compatlab.errors import ConfigError, UsageError
from compatlab.existing import Environment, inspect_environment
from compatlab.incell import fakecuda
from compatlab.runner import ExistingRequest, existing_stages
from compatlab.runs.model import CellState, StageState
from fixtures.sofix import EXT_SUFFIX, compile_so, ext_module

LAYERS = '''
def fast_path():
    """Use the optional vectorised kernels."""
    from optpkg import _opt
    return _opt
'''


def _venv(tmp: Path, init: str) -> Path:
    """A venv (no pip) that sees the dev env's pytest, with 'optpkg': _core loads, _opt lacks libabsent.so.1."""
    venv = tmp / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = Path(next((venv / "lib").glob("python3*/site-packages")))
    (site / "devenv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n", encoding="utf-8")
    pkg = site / "optpkg"
    build = tmp / "build"
    absent = compile_so(build / "libabsent.so.1", "int absent(void) { return 1; }\n", soname="libabsent.so.1")
    ext_module(pkg, "_core")
    ext_module(pkg, "_opt", "absent();", f"-L{build}", f"-l:{absent.name}", prelude="int absent(void);")
    (pkg / "__init__.py").write_text(init, encoding="utf-8")
    (pkg / "layers.py").write_text(LAYERS, encoding="utf-8")
    info = site / "optpkg-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: optpkg\nVersion: 1.0\n", encoding="utf-8")
    (info / "top_level.txt").write_text("optpkg\n", encoding="utf-8")
    files = sorted(p.relative_to(site).as_posix() for p in pkg.rglob("*") if p.is_file())
    files += [f"optpkg-1.0.dist-info/{n}" for n in ("METADATA", "top_level.txt", "RECORD")]
    (info / "RECORD").write_text("".join(f"{f},,\n" for f in files), encoding="utf-8")
    return venv


@pytest.fixture(scope="module")
def optional_env(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _venv(tmp_path_factory.mktemp("check"), "from optpkg import _core\nfrom optpkg import layers\n")


OPT = f"optpkg/_opt{EXT_SUFFIX}"
WHY = "only imported inside fast_path() (optpkg/layers.py:4)"
FEATURE = "optpkg says it is for: Use the optional vectorised kernels."


@pytest.mark.slow
def test_an_optional_module_that_cannot_load_is_a_warning_in_both_stages(optional_env: Path, tmp_path: Path) -> None:
    if fakecuda.real_driver() is not None:
        pytest.skip("this machine has a real NVIDIA driver: the cuda stage would run")
    env = inspect_environment(optional_env / "bin" / "python")
    assert "optpkg" in env.native  # beside the dev env's own, which the venv sees for pytest
    assert env.is_venv
    done = run_check(env, ExistingRequest(packages=("optpkg",)), out=tmp_path / "out")
    stages = {s.name: s for s in done.result.stages}
    assert list(stages) == ["pins", "static", "import", "cuda", "serve"]
    assert (stages["static"].state, stages["static"].reason) == (
        "warn",
        (
            f"{OPT}: libabsent.so.1 not found: not in site-packages nor in the system's library cache; "
            f"`import optpkg` does not need it ({WHY}); {FEATURE}"
        ),
    )
    assert (stages["import"].state, stages["import"].reason) == (
        "warn",
        (
            f"{OPT}: missing shared library libabsent.so.1; `import optpkg` does not need it: it loads without "
            f"mapping it ({WHY}); {FEATURE}"
        ),
    )
    by_module = {m["module"]: m for m in stages["import"].details["modules"]}
    assert by_module["optpkg"]["mapped"] == [f"optpkg/_core{EXT_SUFFIX}"]
    assert (done.result.state, done.result.reason) == (
        "partial",
        "ran pins, static, import (2/3 modules load); 1 warning; not run here: cuda — no NVIDIA driver on this "
        "machine (no libcuda.so.1)",
    )
    [row] = done.packages
    assert (row.name, row.version, row.state, row.modules) == ("optpkg", "1.0", "warn", 2)
    out = tmp_path / "out"
    assert {p.name for p in out.iterdir()} == {
        "runs",
        "index.html",
        "compat.md",
        "answers.json",
        "results.json",
        "packages.md",
        "packages.json",
    }
    results = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert [c["state"] for c in results["cells"]] == ["partial"]
    assert json.loads((out / "packages.json").read_text(encoding="utf-8"))["packages"][0]["state"] == "warn"


@pytest.mark.slow
def test_a_module_that_import_needs_fails_the_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    venv = _venv(tmp_path, "from optpkg import _core, _opt\n")
    code = main(
        ["check", "--venv", str(venv), "--out", str(tmp_path / "out"), "--pin", "optpkg==2.0", "--package", "optpkg"]
    )
    printed = capsys.readouterr().out
    assert code == 1
    assert "  static: fail " in printed
    assert (
        "  pins: fail (0.0 s) — optpkg 2.0 was replaced by 1.0; no installed package names it; "
        "check the index's versions"
    ) in printed
    verdict = next(line for line in printed.splitlines() if line.startswith("verdict "))
    assert verdict.startswith("verdict python")
    assert verdict.endswith(": fail in " + verdict.split(": fail in ")[1])
    assert "— 2 causes: pins: optpkg 2.0 was replaced by 1.0" in verdict
    assert f"; also import: {OPT}: missing shared library libabsent.so.1" in verdict


def test_a_python_that_is_not_a_venv_and_has_no_pytest_runs_every_stage() -> None:
    env = Environment(
        python=Path("/usr/bin/python3"),
        version="3.12.3",
        prefix=Path("/usr"),
        is_venv=False,
        site=Path("/usr/lib/python3/dist-packages"),
        dists={},
        native=(),
        sites={},
        has_pytest=False,
        has_pip=False,
    )
    stages = {s.name: s for s in existing_stages(env)}
    assert list(stages) == ["pins", "static", "import", "cuda", "serve"]
    assert all("install" not in s.needs for s in stages.values())
    # pytest comes from the overlay (tests/e2e/test_check_untouched.py): nothing is skipped for want of it.
    assert (stages["pins"].run.__name__, stages["import"].run.__name__) == ("run_pins_stage", "run_import_stage")


def test_pins_are_exact(tmp_path: Path) -> None:
    assert parse_pins(["torch==2.9.1+cu130"]) == {"torch": "2.9.1+cu130"}
    with pytest.raises(UsageError) as bad:
        parse_pins(["torch>=2.9"])
    assert str(bad.value) == "--pin: 'torch>=2.9' is not a pin; expected NAME==VERSION, e.g. torch==2.9.1"
    constraints = tmp_path / "c.txt"
    constraints.write_text("# the stack\n-c other.txt\nflashinfer-python==0.6.4\nsgl-kernel~=0.3\n", encoding="utf-8")
    with pytest.raises(ConfigError) as file_bad:
        parse_pins([], constraints)
    assert str(file_bad.value) == (
        f"{constraints}: line 4: 'sgl-kernel~=0.3' is not a pin; expected NAME==VERSION, e.g. sgl-kernel==2.9.1"
    )


def test_which_environment_must_be_said(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("VIRTUAL_ENV", raising=False)
    assert main(["check"]) == 2
    assert capsys.readouterr().err == (
        "error: which environment? pass --python PATH (e.g. --python /usr/bin/python3) or --venv DIR\n"
    )


# optpkg picks a build of _opt by path, as sgl_kernel picks sm90/common_ops and mpi4py MPI.mpich: no import
# statement names it, a string does.
BY_PATH = """
import importlib.util, pathlib
from optpkg import _core, layers
_BUILDS = {"vectorised": "_opt"}
def load(kind):
    path = next(pathlib.Path(__file__).parent.glob(_BUILDS[kind] + ".*.so"))
    spec = importlib.util.spec_from_file_location("optpkg._opt", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
"""
NAMED = "optpkg/__init__.py, which `import optpkg` runs, names '_opt': it may load it by path"


@pytest.mark.slow
def test_a_build_named_by_path_that_import_leaves_alone_is_a_warning(tmp_path: Path) -> None:
    if fakecuda.real_driver() is not None:
        pytest.skip("this machine has a real NVIDIA driver: the cuda stage would run")
    env = inspect_environment(_venv(tmp_path, BY_PATH) / "bin" / "python")
    done = run_check(env, ExistingRequest(packages=("optpkg",)), out=tmp_path / "out")
    stages = {s.name: s for s in done.result.stages}
    assert (stages["static"].state, stages["static"].reason) == (
        "warn",
        (
            f"{OPT}: libabsent.so.1 not found: not in site-packages nor in the system's library cache; "
            f"`import optpkg` may not need it ({NAMED}): the import stage decides"
        ),
    )
    assert (stages["import"].state, stages["import"].reason) == (
        "warn",
        (
            f"{OPT}: missing shared library libabsent.so.1; `import optpkg` does not need it here: it loads without "
            f"mapping it, though {NAMED}"
        ),
    )
    assert done.result.state == CellState.PARTIAL


@pytest.mark.slow
def test_a_build_a_working_import_tries_and_goes_on_without_is_a_warning(tmp_path: Path) -> None:
    # cupy's import tries cuTENSOR's module (libcutensor.so.2 absent on the box), goes on without it and works.
    if fakecuda.real_driver() is not None:
        pytest.skip("this machine has a real NVIDIA driver: the cuda stage would run")
    init = BY_PATH + "try:\n    _ops = load('vectorised')\nexcept ImportError:\n    _ops = None\n"
    env = inspect_environment(_venv(tmp_path, init) / "bin" / "python")
    done = run_check(env, ExistingRequest(packages=("optpkg",)), out=tmp_path / "out")
    stages = {s.name: s for s in done.result.stages}
    verdict = (
        f"{OPT}: missing shared library libabsent.so.1; `import optpkg` does not need it: it tried to load it "
        "and went on without it (what needs it will not work)"
    )
    assert (stages["import"].state, stages["import"].reason) == ("warn", verdict)
    package = next(m for m in stages["import"].details["modules"] if m["module"] == "optpkg")
    assert (package["ok"], [(f["name"], f["judged"]) for f in package["failed_loads"]]) == (True, [(OPT, "feature")])
    assert [w for w in stages["import"].details["warnings"] if OPT in w] == [verdict]  # told once, not again
    assert done.result.state == CellState.PARTIAL


@pytest.mark.slow
def test_a_build_named_by_path_that_import_loads_stays_red(tmp_path: Path) -> None:
    env = inspect_environment(_venv(tmp_path, BY_PATH + '_ops = load("vectorised")\n') / "bin" / "python")
    done = run_check(env, ExistingRequest(packages=("optpkg",)), out=tmp_path / "out")
    stages = {s.name: s for s in done.result.stages}
    assert stages["static"].state == StageState.WARN  # static cannot tell; the import stage can
    assert stages["import"].state == StageState.FAIL
    assert stages["import"].details["failures"] == [
        f"{OPT}: missing shared library libabsent.so.1",
        "optpkg: missing shared library libabsent.so.1",
    ]
    entry = next(m for m in stages["import"].details["modules"] if m["module"] == OPT)
    assert entry["needed_why"] == "`import optpkg` tried to load it and failed on it"
    assert done.result.state == CellState.FAIL


# Like opencv's cv2.abi3.so: its init refuses any name but the one cv2/__init__.py loads it under, so it fails
# loaded alone (by path or by name) and loads whenever users `import optpkg`.
NATIVE = r"""
#include <Python.h>
static PyObject *create(PyObject *spec, PyModuleDef *def) {
    PyObject *name = PyObject_GetAttrString(spec, "name");
    if (name == NULL) return NULL;
    if (PyUnicode_CompareWithASCIIString(name, "_native") != 0) {
        PyErr_Format(PyExc_ImportError, "optpkg's native part loads only as _native, not %U", name);
        Py_DECREF(name);
        return NULL;
    }
    Py_DECREF(name);
    return PyModule_New("_native");
}
static PyModuleDef_Slot slots[] = {{Py_mod_create, (void *)create}, {0, NULL}};
static struct PyModuleDef def = {PyModuleDef_HEAD_INIT, "_native", NULL, 0, NULL, slots};
PyMODINIT_FUNC PyInit__native(void) { return PyModuleDef_Init(&def); }
"""
BOOTSTRAP = """
import importlib.util, pathlib
from optpkg import _core, layers
_path = next(pathlib.Path(__file__).parent.glob("_native.*.so"))
_spec = importlib.util.spec_from_file_location("_native", _path)  # as cv2 loads cv2.abi3.so as cv2
native = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(native)
"""


@pytest.mark.slow
def test_a_module_only_its_package_can_load_counts_as_loaded(tmp_path: Path) -> None:
    venv = _venv(tmp_path, BOOTSTRAP)
    site = Path(next((venv / "lib").glob("python3*/site-packages")))
    compile_so(site / "optpkg" / f"_native{EXT_SUFFIX}", NATIVE)
    record = site / "optpkg-1.0.dist-info" / "RECORD"
    record.write_text(record.read_text(encoding="utf-8") + f"optpkg/_native{EXT_SUFFIX},,\n", encoding="utf-8")
    assert subprocess.run([str(venv / "bin" / "python"), "-c", "import optpkg"], check=False).returncode == 0
    env = inspect_environment(venv / "bin" / "python")
    done = run_check(env, ExistingRequest(packages=("optpkg",)), out=tmp_path / "out")
    stages = {s.name: s for s in done.result.stages}
    entry = next(m for m in stages["import"].details["modules"] if m["module"] == f"optpkg/_native{EXT_SUFFIX}")
    assert entry["ok"]
    assert entry["loaded"] == (
        f"by `import optpkg`, which maps it; loaded alone, optpkg/_native{EXT_SUFFIX}: ImportError: optpkg's "
        "native part loads only as _native, not optpkg._native"
    )
    assert stages["import"].state == StageState.WARN  # for _opt, which only layers.fast_path() imports
    assert stages["import"].reason.startswith(f"{OPT}: missing shared library libabsent.so.1; ")


@pytest.mark.slow
def test_a_relative_out_is_the_folder_under_where_check_was_run(
    optional_env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    if fakecuda.real_driver() is not None:
        pytest.skip("this machine has a real NVIDIA driver: the cuda stage would run")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    code = main(["check", "--venv", str(optional_env), "--out", "reports/box", "--package", "optpkg"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    states = dict(re.findall(r"^  (\w+): (\w+) \(", printed, flags=re.MULTILINE))
    assert states == {"pins": "pass", "static": "warn", "import": "warn", "cuda": "skip", "serve": "skip"}
    out = elsewhere / "reports" / "box"
    assert f"reports: {out / 'index.html'}, {out / 'packages.md'}" in printed
    assert json.loads((out / "results.json").read_text(encoding="utf-8"))["cells"][0]["state"] == "partial"


@pytest.mark.slow
@pytest.mark.parametrize("how", ["--venv", "--python"])
def test_a_relative_venv_or_python_is_a_path_under_where_check_was_run(
    optional_env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], how: str
) -> None:
    if fakecuda.real_driver() is not None:
        pytest.skip("this machine has a real NVIDIA driver: the cuda stage would run")
    monkeypatch.chdir(optional_env.parent)
    given = optional_env.name if how == "--venv" else f"{optional_env.name}/bin/python"
    code = main(["check", how, given, "--out", str(tmp_path / "out"), "--package", "optpkg", "--stage", "pins"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "pins: pass (" in printed


def _dist(site: Path, name: str, init: str) -> None:
    """Distribution *name* 1.0 in *site*: package *name* with *init* and one extension module, ``_native``."""
    pkg = site / name
    ext_module(pkg, "_native")
    (pkg / "__init__.py").write_text(init, encoding="utf-8")
    info = site / f"{name}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n", encoding="utf-8")
    files = sorted(p.relative_to(site).as_posix() for p in pkg.rglob("*") if p.is_file())
    files += [f"{name}-1.0.dist-info/{n}" for n in ("METADATA", "RECORD")]
    (info / "RECORD").write_text("".join(f"{f},,\n" for f in files), encoding="utf-8")


def test_an_adoption_that_imports_a_package_no_requirement_names_orders_the_next_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # apkg imports zdep, which its METADATA does not require: by name apkg goes first, its adoption brings
    # zdep in, and zdep's loads are refused there. The second run loads zdep first: nothing refused.
    monkeypatch.setenv("COMPATLAB_CACHE", str(tmp_path / "cache"))
    venv = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = Path(next((venv / "lib").glob("python3*/site-packages")))
    (site / "devenv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n", encoding="utf-8")
    _dist(site, "apkg", "import zdep\n")
    _dist(site, "zdep", "from zdep import _native\n")
    env = inspect_environment(venv / "bin" / "python")
    runs = []
    for n in (1, 2):
        done = run_check(env, ExistingRequest(packages=("apkg", "zdep"), only=("import",)), out=tmp_path / f"o{n}")
        runs.append(next(s for s in done.result.stages if s.name == "import"))
    first, second = runs
    kept = tmp_path / "cache" / "import-order"
    [file] = kept.iterdir()
    assert first.details["order"] == {"learned_before": 0, "learned_now": 1, "file": str(file)}
    assert second.details["order"] == {"learned_before": 1, "learned_now": 0, "file": str(file)}
    assert json.loads(file.read_text(encoding="utf-8"))["before"] == {"apkg": ["zdep"]}
    assert re.search(r"for [1-9]\d* load\(s\) whose own package the first had imported", first.details["loader"])
    assert "whose own package" not in second.details["loader"]
    # The same verdicts both ways.
    told = [[{k: v for k, v in m.items() if k != "seconds"} for m in s.details["modules"]] for s in runs]
    assert told[0] == told[1]
    assert len(told[0]) == 4
    assert first.state == second.state == "pass"
