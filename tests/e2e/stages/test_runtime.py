"""End to end: the import and cuda suites run by the lab in a real venv over a fake, gcc-built stack."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

import pytest

from compatlab.incell import fakecuda
from compatlab.runs.model import StageResult, StageState, cell_state
from compatlab.stages import runtime
from fixtures.existing import context_for
from fixtures.sofix import EXT_SUFFIX, abi_broken_module, cc, ext_module, provider

ROOT = Path(__file__).resolve().parents[3]


def _make_cell(tmp: Path) -> tuple[Path, Path]:
    """A venv (no pip) that sees the dev env's pytest, with a dist 'fakestack' of three extension modules."""
    cc()
    venv = tmp / "cell"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = Path(next((venv / "lib").glob("python3*/site-packages")))
    (site / "devenv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n", encoding="utf-8")
    pkg = site / "fakestack"
    (pkg / "sm90").mkdir(parents=True)
    (pkg / "__init__.py").write_text("", encoding="utf-8")
    ext_module(pkg, "ok")
    abi_broken_module(pkg / "sm90", "ops")
    linkdir = fakecuda.build_stand_in(set(), tmp / "link-only")  # something to link -lcuda against
    ext_module(
        pkg,
        "drv",
        "if (cuInit(0) == 100) { PyErr_SetString(PyExc_RuntimeError, "
        '"CUDA_ERROR_NO_DEVICE: no CUDA-capable device is detected"); return NULL; }',
        str(linkdir / "libcuda.so.1"),
        prelude="int cuInit(unsigned int);",
    )
    info = site / "fakestack-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fakestack\nVersion: 1.0\n", encoding="utf-8")
    (info / "top_level.txt").write_text("fakestack\n", encoding="utf-8")
    files = sorted(p.relative_to(site).as_posix() for p in pkg.rglob("*") if p.is_file())
    files += [
        "fakestack-1.0.dist-info/METADATA",
        "fakestack-1.0.dist-info/top_level.txt",
        "fakestack-1.0.dist-info/RECORD",
    ]
    (info / "RECORD").write_text("".join(f"{f},,\n" for f in files), encoding="utf-8")
    # A torch that says which CUDA it is for, the way real torch does (torch/version.py).
    (site / "torch").mkdir()
    (site / "torch" / "version.py").write_text("cuda: Optional[str] = '13.0'\n", encoding="utf-8")
    tinfo = site / "torch-2.10.0.dist-info"
    tinfo.mkdir()
    (tinfo / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.10.0\n", encoding="utf-8")
    (tinfo / "RECORD").write_text("torch/version.py,,\ntorch-2.10.0.dist-info/METADATA,,\n", encoding="utf-8")
    return venv, pkg


def test_an_existing_venvs_context_reads_the_cuda_of_torch(cell: tuple[Path, Path], tmp_path: Path) -> None:
    venv, _ = cell
    ctx = context_for(venv, packages=["torch", "fakestack"], work_dir=tmp_path)
    assert (ctx.cell.id, ctx.cell.cuda) == ("torch2.10.0-cuda13.0", "13.0")
    assert [(v.axis, v.version) for v in ctx.cell.packages] == [("torch", "2.10.0"), ("fakestack", "1.0")]
    assert ctx.site.name == "site-packages"


@pytest.fixture(scope="module")
def cell(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return _make_cell(tmp_path_factory.mktemp("runtime"))


@pytest.mark.slow
def test_import_stage_names_the_abi_break(cell: tuple[Path, Path], tmp_path: Path) -> None:
    if fakecuda.real_driver() is not None:
        pytest.skip("this machine has a real NVIDIA driver: the stand-in path cannot be shown here")
    venv, _ = cell
    ctx = context_for(venv, packages=["fakestack"], work_dir=tmp_path / "work")
    result = runtime.run_import_stage(ctx)
    assert (result.state, result.reason) == ("fail", f"fakestack/sm90/ops{EXT_SUFFIX}: undefined symbol ns::check(int)")
    assert result.details["driver"] == "stand-in (CUDA_ERROR_NO_DEVICE)"
    assert result.details["failures"] == [result.reason]
    assert result.details["needs_gpu"] == [
        f"fakestack/drv{EXT_SUFFIX}: no NVIDIA driver (CUDA_ERROR_NO_DEVICE: no CUDA-capable device is detected)"
    ]
    by_module = {m["module"]: m for m in result.details["modules"]}
    assert sorted(by_module) == sorted(
        ["fakestack", f"fakestack/ok{EXT_SUFFIX}", f"fakestack/drv{EXT_SUFFIX}", f"fakestack/sm90/ops{EXT_SUFFIX}"]
    )
    assert by_module[f"fakestack/ok{EXT_SUFFIX}"]["ok"]
    assert by_module["fakestack"]["ok"]
    assert by_module[f"fakestack/sm90/ops{EXT_SUFFIX}"]["failure"]["symbol"] == "_ZN2ns5checkEi"
    assert (tmp_path / "work" / "import" / "pytest.log").is_file()


@pytest.mark.slow
def test_cuda_stage_skips_without_a_driver_and_the_cell_is_partial(cell: tuple[Path, Path], tmp_path: Path) -> None:
    if fakecuda.real_driver() is not None:
        pytest.skip("this machine has a real NVIDIA driver")
    venv, pkg = cell
    provider(pkg / "sm90", "_ZN2ns5checkEi")  # mend the ABI break: now everything loads
    try:
        ctx = context_for(venv, packages=["fakestack"], work_dir=tmp_path / "work")
        imported = runtime.run_import_stage(ctx)
        # Nothing is broken; drv wants a GPU: amber, not red, and not "not needed" either.
        assert imported.state == "warn"
        assert imported.details["warnings"] == [
            f"needs a GPU to judge: fakestack/drv{EXT_SUFFIX}: no NVIDIA driver (CUDA_ERROR_NO_DEVICE: no "
            "CUDA-capable device is detected)"
        ]
        cuda = runtime.run_cuda_stage(ctx)
    finally:
        provider(pkg / "sm90", "_ZN2ns5checkEj")
    assert (cuda.state, cuda.reason, cuda.required) == (
        "skip",
        "no NVIDIA driver on this machine (no libcuda.so.1)",
        True,
    )
    assert cell_state([imported, cuda]) == "partial"


@pytest.mark.slow
def test_without_a_driver_the_lab_skips_the_cuda_suite_as_the_suite_itself_would(
    cell: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if fakecuda.real_driver() is not None:
        pytest.skip("this machine has a real NVIDIA driver")
    venv, _ = cell
    ctx = context_for(venv, packages=["fakestack"], work_dir=tmp_path / "work")
    early = runtime.run_cuda_stage(ctx)
    assert not (tmp_path / "work" / "cuda").exists()  # no suite was started
    monkeypatch.setattr(runtime, "_no_driver", lambda: False)  # as on a machine with signs of a driver
    ran = runtime.run_cuda_stage(ctx)
    assert (tmp_path / "work" / "cuda" / "pytest.log").is_file()
    assert ran.details["tests"]
    assert [t["outcome"] for t in ran.details["tests"]] == ["skipped"] * len(ran.details["tests"])
    assert (early.state, early.reason, early.required) == (ran.state, ran.reason, ran.required)


@pytest.mark.slow
def test_check_runs_the_import_stage_alone(cell: tuple[Path, Path], tmp_path: Path) -> None:
    """What `compatlab runtime --stage import` did, `compatlab check --stage import` does."""
    venv, _ = cell
    out = tmp_path / "out"
    argv = ["--venv", str(venv), "--package", "fakestack", "--stage", "import", "-q", "--out", str(out)]
    done = subprocess.run(
        [sys.executable, "-m", "compatlab", "check", *argv],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        check=False,
        env={**__import__("os").environ, "PYTHONPATH": str(ROOT / "src")},
    )
    assert done.returncode == 1, done.stderr
    [line] = [s for s in done.stdout.splitlines() if s.startswith("  import: ")]
    assert line.startswith("  import: fail (")
    assert line.endswith(f"s) — fakestack/sm90/ops{EXT_SUFFIX}: undefined symbol ns::check(int)")
    data = json.loads((out / "results.json").read_text(encoding="utf-8"))
    [result] = data["cells"]
    assert (result["id"], result["state"]) == ("torch2.10.0-cuda13.0", "fail")
    assert [s["name"] for s in result["stages"]] == ["import"]


def test_runtime_is_gone_and_says_what_to_run(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "compatlab", "runtime", "--venv", str(tmp_path / "nope"), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        check=False,
        env={**__import__("os").environ, "PYTHONPATH": str(ROOT / "src")},
    )
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        "error: `compatlab runtime` is gone: `compatlab check` runs the same stages on an existing environment, "
        "e.g. compatlab check --venv DIR --stage import --stage cuda --target sm_90 --threshold jit-timeout=900 "
        "--out reports/adhoc\n"
    )


def _verdicts(result: StageResult) -> dict[str, Any]:
    """Each module's verdict, less what differs from run to run (timings, the stderr tail)."""
    out: dict[str, Any] = {}
    for m in result.details["modules"]:
        failure = {k: v for k, v in (m.get("failure") or {}).items() if k != "raw"}
        out[m["module"]] = (m["ok"], m.get("reason"), failure)
    return out


@pytest.mark.slow
def test_import_stage_judges_alike_through_the_fork_server_and_one_process_per_module(
    cell: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    venv, _ = cell
    ctx = context_for(venv, packages=["fakestack"], work_dir=tmp_path / "fork")
    forked = runtime.run_import_stage(ctx)
    monkeypatch.setenv("COMPATLAB_IMPORT_FORKSERVER", "0")
    ctx = context_for(venv, packages=["fakestack"], work_dir=tmp_path / "alone")
    alone = runtime.run_import_stage(ctx)
    # The venv has a torch (its version.py only): check's cell carries the stack, so the server imports it,
    # then fakestack itself; the two failures are asked again of the server that adopts nothing.
    assert re.fullmatch(
        r"fork server: children of 1 interpreter\(s\) that imported torch once \([0-9.]+ s\), then 1 package\(s\) "
        r"that it imported itself, a child ending each; and children of 1 interpreter\(s\) that imported torch once "
        r"\([0-9.]+ s\) for 0 load\(s\) whose own package the first had imported and 2 that failed there "
        r"\(a failure is always this one's\), with the loader's log on; (?:[0-9]+ MiB and [0-9]+ MiB of their memory "
        r"in 2 MiB pages \(a fork costs less\)|their memory in 4 KiB pages \(none collapsed into 2 MiB ones\))",
        forked.details["loader"],
    ), forked.details["loader"]
    assert forked.details["loader_problems"] == []
    assert alone.details["loader"] == "one process per module"
    assert (forked.state, forked.reason) == (alone.state, alone.reason)
    assert _verdicts(forked) == _verdicts(alone)
    assert len(_verdicts(alone)) == 4


@pytest.mark.slow
def test_a_torch_that_will_not_import_falls_back_to_one_process_per_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    venv, _ = _make_cell(tmp_path)
    site = Path(next((venv / "lib").glob("python3*/site-packages")))
    (site / "torch" / "__init__.py").write_text(
        'raise ImportError("libtorch_cuda.so: cannot open shared object file: No such file or directory")\n',
        encoding="utf-8",
    )
    record = site / "torch-2.10.0.dist-info" / "RECORD"
    record.write_text(record.read_text(encoding="utf-8") + "torch/__init__.py,,\n", encoding="utf-8")
    ctx = context_for(venv, packages=["torch", "fakestack"], work_dir=tmp_path / "fork")
    forked = runtime.run_import_stage(ctx)
    monkeypatch.setenv("COMPATLAB_IMPORT_FORKSERVER", "0")
    alone = runtime.run_import_stage(context_for(venv, packages=["torch", "fakestack"], work_dir=tmp_path / "alone"))
    assert forked.details["loader"] == "one process per module"
    assert forked.details["loader_problems"] == [
        "fork server could not start (import torch failed: ImportError: libtorch_cuda.so: cannot open shared "
        "object file: No such file or directory): one process per module"
    ]
    assert (forked.state, forked.reason) == (
        "fail",
        "fakestack/drv" + EXT_SUFFIX + " (import torch failed): missing shared library libtorch_cuda.so (and 4 more)",
    )
    assert (forked.state, forked.reason) == (alone.state, alone.reason)
    assert _verdicts(forked) == _verdicts(alone)


@pytest.mark.slow
def test_a_module_that_crashes_loaded_alone_but_not_through_its_package_is_fine(tmp_path: Path) -> None:
    """Its init needs what its package's __init__ sets up first: by path it dies, by name it loads."""
    if fakecuda.real_driver() is not None:
        pytest.skip("this machine has a real NVIDIA driver: the stand-in path cannot be shown here")
    venv, pkg = _make_cell(tmp_path)
    (pkg / "sm90" / f"ops{EXT_SUFFIX}").unlink()  # only the module under test may fail here
    (pkg / "__init__.py").write_text("import os\nos.environ['FAKESTACK_READY'] = '1'\n", encoding="utf-8")
    ext_module(
        pkg,
        "needs_setup",
        'if (!getenv("FAKESTACK_READY")) raise(SIGSEGV);',
        prelude="#include <signal.h>\n#include <stdlib.h>",
    )
    with (pkg.parent / "fakestack-1.0.dist-info" / "RECORD").open("a", encoding="utf-8") as record:
        record.write(f"fakestack/needs_setup{EXT_SUFFIX},,\n")
    ctx = context_for(venv, packages=["fakestack"], work_dir=tmp_path / "work")
    result = runtime.run_import_stage(ctx)
    entry = next(e for e in result.details["modules"] if e["module"].startswith("fakestack/needs_setup"))
    assert entry["ok"] is True
    assert entry["loaded"] == (
        f"by name (import fakestack.needs_setup): by path, fakestack/needs_setup{EXT_SUFFIX}: "
        "crashed with SIGSEGV while loading"
    )


@pytest.mark.slow
def test_a_clean_linking_module_no_code_imports_is_a_warning_when_its_init_fails(tmp_path: Path) -> None:
    """It links, so static finds nothing; its init raises; `import fakestack` never loads it: a warning."""
    if fakecuda.real_driver() is not None:
        pytest.skip("this machine has a real NVIDIA driver: the stand-in path cannot be shown here")
    from compatlab.stages.static.stage import run_static_stage

    venv, pkg = _make_cell(tmp_path)
    (pkg / "sm90" / f"ops{EXT_SUFFIX}").unlink()
    ext_module(pkg, "tkish", 'PyErr_SetString(PyExc_ImportError, "initialization failed"); return NULL;')
    with (pkg.parent / "fakestack-1.0.dist-info" / "RECORD").open("a", encoding="utf-8") as record:
        record.write(f"fakestack/tkish{EXT_SUFFIX},,\n")
    ctx = context_for(venv, packages=["fakestack"], work_dir=tmp_path / "work")
    assert run_static_stage(ctx).state != StageState.FAIL
    result = runtime.run_import_stage(ctx)
    entry = next(e for e in result.details["modules"] if e["module"] == f"fakestack/tkish{EXT_SUFFIX}")
    assert entry["needed"] is False
    assert result.state == StageState.WARN
