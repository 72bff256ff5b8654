"""fakecuda: the stand-in libcuda.so.1, built with gcc, answering CUDA_ERROR_NO_DEVICE to a real module."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from compatlab.incell import fakecuda, loadcheck
from compatlab.incell.loading.elf import dynamic_symbols
from compatlab.incell.loading.failure import describe
from fixtures.sofix import cc, ext_module

_CUINIT_MODULE = """
    int rc = cuInit(0);
    if (rc != 0) {
        PyErr_Format(PyExc_RuntimeError, "cuInit returned %d (CUDA_ERROR_NO_DEVICE)", rc);
        return NULL;
    }
"""


@pytest.fixture
def stand_in(tmp_path: Path) -> Path:
    cc()
    return fakecuda.build_stand_in(fakecuda.driver_symbols([]) | {"cuTensorMapEncodeTiled"}, tmp_path / "cache")


def test_build_is_cached_by_content(tmp_path: Path, stand_in: Path) -> None:
    again = fakecuda.build_stand_in(fakecuda.driver_symbols([]) | {"cuTensorMapEncodeTiled"}, tmp_path / "cache")
    assert again == stand_in
    other = fakecuda.build_stand_in({"cuMemAlloc_v2"}, tmp_path / "cache")
    assert other != stand_in
    syms = dynamic_symbols(stand_in / "libcuda.so.1")
    assert syms is not None
    assert {"cuInit", "cuGetProcAddress_v2", "cuTensorMapEncodeTiled"} <= syms.defined


def test_a_module_that_needs_cuinit_loads_and_gets_no_device(tmp_path: Path, stand_in: Path) -> None:
    if fakecuda.real_driver() is not None:
        pytest.skip("this machine has a real NVIDIA driver; the stand-in is never used there")
    mod = ext_module(
        tmp_path / "mod",
        "needscuda",
        _CUINIT_MODULE,
        str(stand_in / "libcuda.so.1"),
        prelude="int cuInit(unsigned int);",
    )
    # Without a driver the loader stops at libcuda.so.1: nothing about the module can be judged.
    failure, _ = loadcheck.load_module(sys.executable, path=str(mod), name="needscuda")
    assert failure is not None
    assert (failure.kind, failure.library) == ("no-driver", "libcuda.so.1")
    assert not failure.stack
    # With the stand-in it links, runs PyInit, and cuInit answers CUDA_ERROR_NO_DEVICE (100).
    env = fakecuda.stand_in_env(stand_in, dict(os.environ))
    failure, _ = loadcheck.load_module(sys.executable, path=str(mod), name="needscuda", env=env)
    assert failure is not None
    assert failure.kind == "no-driver"
    assert failure.message == "cuInit returned 100 (CUDA_ERROR_NO_DEVICE)"
    assert describe("pkg/needscuda.so", failure) == (
        "pkg/needscuda.so: no NVIDIA driver (cuInit returned 100 (CUDA_ERROR_NO_DEVICE))"
    )


def test_stand_in_answers(stand_in: Path) -> None:
    # In a subprocess: a stand-in loaded here would answer every later dlopen("libcuda.so.1") of this process.
    script = textwrap.dedent(f"""
        import ctypes
        lib = ctypes.CDLL({str(stand_in / "libcuda.so.1")!r})
        n, v = ctypes.c_int(7), ctypes.c_int(7)
        fn = ctypes.c_void_p(); st = ctypes.c_int(9); s = ctypes.c_char_p()
        print(lib.cuInit(0), lib.cuDeviceGetCount(ctypes.byref(n)), n.value,
              lib.cuDriverGetVersion(ctypes.byref(v)), v.value,
              lib.cuGetProcAddress_v2(b"cuMemAlloc", ctypes.byref(fn), 12000, 0, ctypes.byref(st)), st.value,
              ctypes.CFUNCTYPE(ctypes.c_int)(fn.value)(),
              lib.cuGetErrorName(100, ctypes.byref(s)), s.value.decode(),
              lib.cuTensorMapEncodeTiled())
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["100", "100", "0", "0", "13020", "0", "0", "100", "0", "CUDA_ERROR_NO_DEVICE", "100"]


def test_driver_symbols_are_collected_from_modules(tmp_path: Path) -> None:
    mod = ext_module(
        tmp_path,
        "tma",
        "cuTensorMapEncodeTiled(); cudaFree(0); cublasCreate_v2(0);",
        "-Wl,--unresolved-symbols=ignore-all",
        prelude="int cuTensorMapEncodeTiled(void); int cudaFree(void*); int cublasCreate_v2(void*);",
    )
    names = fakecuda.driver_symbols([mod, tmp_path / "not-there.so"])
    assert "cuTensorMapEncodeTiled" in names
    assert "cuInit" in names
    assert "cuGetProcAddress" in names
    assert "cudaFree" not in names
    assert "cublasCreate_v2" not in names


def test_source_exports_only_c_identifiers() -> None:
    src = fakecuda.stand_in_source(["cuFoo", "cu;rm -rf", "_ZN3c10cuInit"])
    assert "int cuFoo(void) { return NO_DEVICE; }" in src
    assert "rm -rf" not in src
    assert "_ZN3c10" not in src


# --- never where a real driver exists ---------------------------------------------------------------------


def _no(_: str) -> None:
    return None


def _fail_dlopen(_: str) -> object:
    raise OSError("libcuda.so.1: cannot open shared object file: No such file or directory")


def test_no_driver_anywhere(tmp_path: Path) -> None:
    assert (
        fakecuda.real_driver(proc_version=tmp_path / "absent", ldconfig=str, find_library=_no, dlopen=_fail_dlopen)
        is None
    )


def test_the_kernel_module_counts(tmp_path: Path) -> None:
    proc = tmp_path / "version"
    proc.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.03\n")
    assert fakecuda.real_driver(proc_version=proc, ldconfig=str, find_library=_no, dlopen=_fail_dlopen) == (
        f"{proc} exists"
    )


def test_the_linker_cache_counts(tmp_path: Path) -> None:
    cache = "\tlibcuda.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so.1\n"
    assert (
        fakecuda.real_driver(
            proc_version=tmp_path / "absent", ldconfig=lambda: cache, find_library=_no, dlopen=_fail_dlopen
        )
        == "ldconfig -p lists /usr/lib/x86_64-linux-gnu/libcuda.so.1"
    )


def test_find_library_counts_but_not_toolkit_stubs(tmp_path: Path) -> None:
    def found(_: str) -> str:
        return "libcuda.so.1"

    def stub(_: str) -> str:
        return "/usr/local/cuda/lib64/stubs/libcuda.so"

    absent = tmp_path / "absent"
    assert fakecuda.real_driver(proc_version=absent, ldconfig=str, find_library=found, dlopen=_fail_dlopen) == (
        "find_library('cuda') found libcuda.so.1"
    )
    assert fakecuda.real_driver(proc_version=absent, ldconfig=str, find_library=stub, dlopen=_fail_dlopen) is None


def test_our_own_stand_in_on_the_path_is_not_a_driver(tmp_path: Path) -> None:
    class Handle:
        _name = str(tmp_path / "fakecuda-0123" / "libcuda.so.1")

    def ours(_: str) -> object:
        return Handle()

    def theirs(_: str) -> object:
        h = Handle()
        h._name = "/opt/driver/libcuda.so.1"
        return h

    absent = tmp_path / "absent"
    assert (
        fakecuda.real_driver(
            proc_version=absent, ldconfig=str, find_library=_no, dlopen=ours, stand_in_dirs=[tmp_path / "fakecuda-0123"]
        )
        is None
    )
    assert fakecuda.real_driver(
        proc_version=absent, ldconfig=str, find_library=_no, dlopen=theirs, stand_in_dirs=[tmp_path / "fakecuda-0123"]
    ) == ("dlopen(libcuda.so.1) loaded /opt/driver/libcuda.so.1")
