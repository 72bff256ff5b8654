"""A library a package loads at import by a computed path, judged as an extension module is.

Tiny real wheels, installed by real uv: a "torch" whose import loads its libc10.so with RTLD_GLOBAL (as
torch's _load_global_deps does), and "bnb", whose import loads ``f"libbnb_cuda{v}.so"`` with ctypes (as
bitsandbytes does). That library needs c10_alloc from torch without naming libc10 (what `import torch`
mapped first provides it) and cuLibraryLoadData from the driver, an entry point of CUDA 12.0 that the
target's min-driver 520.61 lacks. The static stage sees no extension module load it: notes only (before,
the bare ``.so`` counted as an extension module that "`import bnb` does not need"). The import stage saw
`import bnb` map it: the driver floor is a failure, and c10_alloc is no finding at all.
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

import pytest

from compatlab.cli.check import run_check
from compatlab.existing import inspect_environment
from compatlab.incell import fakecuda
from compatlab.runner import ExistingRequest
from compatlab.runs.model import StageState
from fixtures.sofix import compile_so
from fixtures.wheels import build_wheel, venv_with

TORCH_INIT = """
import ctypes, os
ctypes.CDLL(os.path.join(os.path.dirname(__file__), "lib", "libc10.so"), mode=ctypes.RTLD_GLOBAL)
"""
BNB_INIT = """
import ctypes, glob, os
import torch

here = os.path.dirname(__file__)
version = "130"
lib = ctypes.CDLL(os.path.join(here, f"libbnb_cuda{version}.so"))
for ops in glob.glob(os.path.join(here, "lib", "*.so")):  # as torch.ops.load_library over a glob
    ctypes.CDLL(ops)
"""
LIB = "bnb/libbnb_cuda130.so"
OPS = "bnb/lib/libbnb_ops.so"


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("bypath")
    build = tmp / "build"
    c10 = compile_so(build / "libc10.so", "void c10_alloc(void) {}\n", soname="libc10.so")
    compile_so(build / "libcuda.so.1", "int cuLibraryLoadData(void) { return 0; }\n", soname="libcuda.so.1")
    bnb = compile_so(
        build / "libbnb_cuda130.so",
        """
        void c10_alloc(void);
        int cuLibraryLoadData(void);
        int bnb_op(void) { c10_alloc(); return cuLibraryLoadData(); }
        """,
        f"-L{build}",
        "-l:libcuda.so.1",
        soname="libbnb_cuda130.so",
    )
    ops = compile_so(build / "ops" / "libbnb_ops.so", "void c10_alloc(void);\nvoid op(void) { c10_alloc(); }\n")
    wheels = [
        build_wheel(
            tmp / "wheels",
            "torch",
            "2.14.1",
            files={"torch/__init__.py": TORCH_INIT, "torch/lib/libc10.so": c10.read_bytes()},
        ),
        build_wheel(
            tmp / "wheels",
            "bnb",
            "0.49.0",
            requires=["torch"],
            files={"bnb/__init__.py": BNB_INIT, LIB: bnb.read_bytes(), OPS: ops.read_bytes()},
        ),
    ]
    python = venv_with(tmp / "venv", wheels)
    # The suites run with pytest: the venv sees the lab's own (nothing is installed from an index).
    site = next((tmp / "venv" / "lib").glob("python3*/site-packages"))
    (site / "devenv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n", encoding="utf-8")
    return python.parents[1]


@pytest.mark.slow
def test_a_library_an_import_loads_by_a_computed_path_is_judged_like_an_extension_module(
    venv: Path, tmp_path: Path
) -> None:
    if fakecuda.real_driver() is not None:
        pytest.skip("this machine has a real NVIDIA driver: the cuda stage would run")
    env = inspect_environment(venv / "bin" / "python")
    done = run_check(env, ExistingRequest(packages=("bnb",), min_driver="520.61"), out=tmp_path / "out")
    stages = {s.name: s for s in done.result.stages}
    static = stages["static"]
    # Static sees no extension module load either (no PyInit_: they are libraries), and never calls them not
    # needed: no Python code spells the computed name.
    assert static.state == StageState.PASS
    mine = [f for f in static.details["findings"] if f["module"] in (LIB, OPS)]
    assert {f["severity"] for f in mine} == {"note"}
    assert not any("does not need" in f["message"] for f in mine)
    imported = stages["import"]
    assert (imported.state, imported.reason) == (
        "fail",
        (
            f"{LIB} imports cuLibraryLoadData from libcuda, an entry point of CUDA 12.0 (driver 525.60.13 or newer): "
            "target this-box's min-driver 520.61 is older (`import bnb` loads it by path)"
        ),
    )
    assert imported.details["loaded_by_path"] == {LIB: "bnb", OPS: "bnb"}
    # Resolved after `import torch`: torch's libc10.so provides c10_alloc, to both.
    assert [
        (f["module"], f["kind"]) for f in imported.details["loaded_by_path_findings"] if f["severity"] != "note"
    ] == [(LIB, "driver-api")]
