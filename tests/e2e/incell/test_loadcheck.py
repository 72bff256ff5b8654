"""loadcheck: real gcc-built extension modules loaded in real subprocesses, each failure classified."""

from __future__ import annotations

import sys
from pathlib import Path

from compatlab.incell import loadcheck
from compatlab.incell.loading.demangle import demangle
from compatlab.incell.loading.elf import dynamic_symbols, importable_here, is_extension_module
from compatlab.incell.loading.failure import LoadFailure, describe
from compatlab.incell.loading.installed import Installed, package_targets
from fixtures.sofix import EXT_SUFFIX, abi_broken_module, compile_so, ext_module
from fixtures.venvs import python_seeing


def _load(path: Path, name: str, **kw: object) -> LoadFailure | None:
    failure, _ = loadcheck.load_module(sys.executable, path=str(path), name=name, **kw)  # type: ignore[arg-type]
    return failure


def test_a_good_module_loads(tmp_path: Path) -> None:
    mod = ext_module(tmp_path, "good")
    failure, done = loadcheck.load_module(sys.executable, path=str(mod), name="good", pre_import=["json"])
    assert failure is None, done.stderr
    assert is_extension_module(mod) == "good"


def test_undefined_cxx_symbol_is_named_and_demangled(tmp_path: Path) -> None:
    mod = abi_broken_module(tmp_path, "abi")
    failure = _load(mod, "abi")
    assert failure is not None
    assert failure.kind == "undefined-symbol"
    assert failure.symbol == "_ZN2ns5checkEi"
    assert failure.demangled == "ns::check(int)"
    assert failure.message == f"{mod}: undefined symbol: _ZN2ns5checkEi"
    assert failure.stack
    assert describe(f"pkg/abi{EXT_SUFFIX}", failure) == f"pkg/abi{EXT_SUFFIX}: undefined symbol ns::check(int)"
    assert "COMPATLAB-LOAD-RESULT" in failure.raw


def test_missing_shared_library(tmp_path: Path) -> None:
    lib = compile_so(tmp_path / "libgone.so.7", "int gone(void) { return 7; }\n", soname="libgone.so.7")
    mod = ext_module(tmp_path, "needy", "gone();", str(lib), prelude="int gone(void);")
    lib.unlink()
    failure = _load(mod, "needy")
    assert failure is not None
    assert (failure.kind, failure.library) == ("missing-library", "libgone.so.7")
    assert failure.message == "libgone.so.7: cannot open shared object file: No such file or directory"
    assert describe("pkg/needy.so", failure) == "pkg/needy.so: missing shared library libgone.so.7"


def test_crash_at_load_names_the_signal(tmp_path: Path) -> None:
    mod = ext_module(tmp_path, "crash", "raise(SIGSEGV);", prelude="#include <signal.h>")
    failure = _load(mod, "crash")
    assert failure is not None
    assert (failure.kind, failure.signal, failure.message) == ("signal", "SIGSEGV", "killed by SIGSEGV")
    assert describe("pkg/crash.so", failure) == "pkg/crash.so: crashed with SIGSEGV while loading"


def test_hang_at_load_is_killed(tmp_path: Path) -> None:
    mod = ext_module(tmp_path, "hang", "for (;;) sleep(1);", prelude="#include <unistd.h>")
    failure, done = loadcheck.load_module(sys.executable, path=str(mod), name="hang", timeout=2)
    assert failure is not None
    assert done.timed_out
    assert 2 <= done.seconds < 10
    assert (failure.kind, failure.message) == ("timeout", "killed after 2 s")
    assert describe("pkg/hang.so", failure) == "pkg/hang.so: hung while loading, killed after 2 s"


def test_python_import_error_in_a_prerequisite(tmp_path: Path) -> None:
    mod = ext_module(tmp_path, "good")
    failure = _load(mod, "good", pre_import=["compatlab_no_such_module"])
    assert failure is not None
    assert failure.kind == "import-error"
    assert failure.step == "import compatlab_no_such_module"
    assert describe("pkg/good.so", failure) == (
        "pkg/good.so (import compatlab_no_such_module failed): "
        "ModuleNotFoundError: No module named 'compatlab_no_such_module'"
    )


def test_python_exception_raised_by_the_module(tmp_path: Path) -> None:
    mod = ext_module(tmp_path, "raiser", 'PyErr_SetString(PyExc_ImportError, "needs triton"); return NULL;')
    failure = _load(mod, "raiser")
    assert failure is not None
    assert (failure.kind, failure.message) == ("import-error", "ImportError: needs triton")


def test_import_by_name(tmp_path: Path) -> None:
    failure, _ = loadcheck.load_module(sys.executable, path=None, name="compatlab_absent_pkg")
    assert failure is not None
    assert describe("compatlab_absent_pkg", failure) == (
        "compatlab_absent_pkg: ModuleNotFoundError: No module named 'compatlab_absent_pkg'"
    )
    ok, _ = loadcheck.load_module(sys.executable, path=None, name="json")
    assert ok is None


def test_demangle() -> None:
    assert demangle("_ZN3c104cuda29c10_cuda_check_implementationEiPKcS2_ib") == (
        "c10::cuda::c10_cuda_check_implementation(int, char const*, char const*, int, bool)"
    )
    assert demangle("cuInit") is None


def test_dynamic_symbols(tmp_path: Path) -> None:
    mod = ext_module(
        tmp_path,
        "syms",
        "cuTensorMapEncodeTiled();",
        "-Wl,--unresolved-symbols=ignore-all",
        prelude="int cuTensorMapEncodeTiled(void);",
    )
    syms = dynamic_symbols(mod)
    assert syms is not None
    assert "PyInit_syms" in syms.defined
    assert "cuTensorMapEncodeTiled" in syms.undefined
    assert dynamic_symbols(mod) is not syms  # not kept: read again
    kept = dynamic_symbols(mod, keep=True)
    assert dynamic_symbols(mod) is kept  # kept: read once, the same file, not changed since
    assert dynamic_symbols(tmp_path / "syms_so.c") is None  # not ELF
    # Built again in place with other symbols: read again.
    ext_module(
        tmp_path, "syms", "cuMemAlloc_v2();", "-Wl,--unresolved-symbols=ignore-all", prelude="int cuMemAlloc_v2(void);"
    )
    again = dynamic_symbols(mod)
    assert again is not None
    assert again is not kept
    assert ("cuMemAlloc_v2" in again.undefined, "cuTensorMapEncodeTiled" in again.undefined) == (True, False)
    assert is_extension_module(tmp_path / "syms_so.c") is None


def test_an_undeclared_python_dependency_is_its_own_kind(tmp_path: Path) -> None:
    """sgl-kernel's deep_gemm imports setuptools, which nothing declares: a packaging warning, not an ABI break."""
    pkg = tmp_path / "deep_gemm"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("import setuptools_that_is_not_there\n")
    python = python_seeing(tmp_path / "venv", tmp_path)
    failure, _ = loadcheck.load_module(python, path=None, name="deep_gemm", timeout=60)
    assert failure is not None
    assert failure.kind == "missing-dependency"
    assert describe("deep_gemm", failure) == (
        "deep_gemm imports setuptools_that_is_not_there, which is not installed: an undeclared dependency"
    )
    # A module missing from the package itself stays a broken import.
    (pkg / "__init__.py").write_text("from deep_gemm import _gone\n")
    failure, _ = loadcheck.load_module(python, path=None, name="deep_gemm", timeout=60)
    assert failure is not None
    assert failure.kind == "import-error"


def test_builds_of_one_module_and_namespace_packages_are_found(tmp_path: Path) -> None:
    """mpi4py ships MPI.mpich.so and MPI.openmpi.so, both PyInit_MPI; cuda-core installs cuda/core/ under the
    namespace cuda/, which `import cuda` never runs: its package is cuda.core."""
    sp = tmp_path / "site"
    mpich = ext_module(sp / "mpi4py", "MPI")
    mpich = mpich.rename(mpich.with_name(f"MPI.mpich{EXT_SUFFIX}"))
    assert is_extension_module(mpich) == "MPI"
    ext_module(sp / "cuda" / "core" / "cu12", "_device")
    for init in ("mpi4py/__init__.py", "cuda/core/__init__.py", "cuda/core/cu12/__init__.py"):
        (sp / init).write_text("", encoding="utf-8")
    for dist, top, files in (
        ("mpi4py", "mpi4py", ["mpi4py/__init__.py", f"mpi4py/MPI.mpich{EXT_SUFFIX}"]),
        (
            "cuda_core",
            "cuda",
            ["cuda/core/__init__.py", "cuda/core/cu12/__init__.py", f"cuda/core/cu12/_device{EXT_SUFFIX}"],
        ),
    ):
        info = sp / f"{dist}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n", encoding="utf-8")
        (info / "top_level.txt").write_text(top + "\n", encoding="utf-8")
        (info / "RECORD").write_text("".join(f"{f},,\n" for f in files), encoding="utf-8")
    sys.path.insert(0, str(sp))
    try:
        _v, mpi = package_targets("mpi4py")
        _v, core = package_targets("cuda_core")
    finally:
        sys.path.remove(str(sp))
    assert [(t.label, t.name) for t in mpi] == [(f"mpi4py/MPI.mpich{EXT_SUFFIX}", "mpi4py.MPI"), ("mpi4py", "mpi4py")]
    assert [(t.label, t.name) for t in core] == [
        (f"cuda/core/cu12/_device{EXT_SUFFIX}", "cuda.core.cu12._device"),
        ("cuda.core", "cuda.core"),
    ]


def test_a_module_built_for_another_python_is_not_loaded(tmp_path: Path) -> None:
    """sgl-kernel 0.3.21 ships _mscclpp.cpython-310-x86_64-linux-gnu.so in its abi3 wheel: a 3.11 interpreter never
    imports it (and loading it by path crashes); it is listed, not loaded."""
    sp = tmp_path / "site"
    other = f"cpython-{sys.version_info.major}{sys.version_info.minor - 1}-x86_64-linux-gnu.so"
    built = ext_module(sp, "_stray")
    built.rename(sp / f"_stray.{other}")
    ext_module(sp / "pkg", "_core")
    (sp / "pkg" / "__init__.py").write_text("", encoding="utf-8")
    info = sp / "pkg-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: pkg\nVersion: 1.0\n", encoding="utf-8")
    (info / "RECORD").write_text(f"_stray.{other},,\npkg/__init__.py,,\npkg/_core{EXT_SUFFIX},,\n", encoding="utf-8")
    sys.path.insert(0, str(sp))
    try:
        _v, targets = package_targets("pkg")
        stray = Installed("pkg").other_python
    finally:
        sys.path.remove(str(sp))
    assert [t.label for t in targets] == [f"pkg/_core{EXT_SUFFIX}", "pkg"]
    assert stray == [f"_stray.{other}"]
    assert not importable_here(f"_stray.{other}")
    assert importable_here(f"_core{EXT_SUFFIX}")


def test_device_code_is_a_fat_binary_section(tmp_path: Path) -> None:
    host = ext_module(tmp_path, "host")
    device = ext_module(
        tmp_path,
        "device",
        prelude=(
            '__attribute__((section(".nv_fatbin"), used)) static const unsigned char fb[16] = {0x50, 0xed, 0x55, 0xba};'
        ),
    )
    assert [dynamic_symbols(p).device_code for p in (host, device)] == [False, True]  # type: ignore[union-attr]
