"""Reachability: a module that cannot load is red only when `import <its package>` needs it (gcc-built)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from compatlab.incell.loading.elf import dynamic_symbols
from compatlab.incell.reach import ImportGraph, package_of
from compatlab.runs.model import StageState
from compatlab.runs.records.static import Severity
from compatlab.stages.static.elf import ElfCache
from compatlab.stages.static.stage import check_site_packages
from fixtures.sofix import EXT_SUFFIX, compile_so, ext_module


def _site(root: Path) -> Path:
    sp = root / "venv" / "lib" / "python3.11" / "site-packages"
    sp.mkdir(parents=True)
    return sp


def _package(root: Path, init: str, **modules: str) -> Path:
    """Package 'pkg': _core loads; _opt needs libabsent.so.1, which is not installed; *modules* are .py files."""
    sp = _site(root)
    pkg = sp / "pkg"
    build = root / "build"
    absent = compile_so(build / "libabsent.so.1", "int absent(void) { return 1; }\n", soname="libabsent.so.1")
    ext_module(pkg, "_core")
    ext_module(pkg, "_opt", "absent();", f"-L{build}", f"-l:{absent.name}", prelude="int absent(void);")
    (pkg / "__init__.py").write_text(textwrap.dedent(init), encoding="utf-8")
    for name, source in modules.items():
        (pkg / f"{name}.py").write_text(textwrap.dedent(source), encoding="utf-8")
    info = sp / "pkg-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: pkg\nVersion: 1.0\n", encoding="utf-8")
    files = sorted(p.relative_to(sp).as_posix() for p in pkg.rglob("*") if p.is_file())
    (info / "RECORD").write_text("".join(f"{f},,\n" for f in files), encoding="utf-8")
    return sp


MISSING = f"pkg/_opt{EXT_SUFFIX}: libabsent.so.1 not found: not in site-packages nor in the system's library cache"


@pytest.fixture
def cache(tmp_path: Path) -> ElfCache:
    return ElfCache(tmp_path / "cache")


def test_a_module_imported_only_inside_a_function_is_a_warning_naming_the_feature(
    tmp_path: Path, cache: ElfCache
) -> None:
    sp = _package(
        tmp_path,
        "from pkg import _core\nfrom pkg import layers\n",
        layers='''
        def fast_path():
            """Use the optional vectorised kernels."""
            from pkg import _opt
            return _opt
    ''',
    )
    report = check_site_packages(sp, archs=[], cache=cache)
    assert report.state == StageState.WARN
    assert report.reason == (
        f"{MISSING}; `import pkg` does not need it (only imported inside fast_path() (pkg/layers.py:4)); "
        "pkg says it is for: Use the optional vectorised kernels."
    )
    [warn] = report.of(Severity.WARN)
    assert warn.details["import_needs"] == "no"
    assert warn.details["dist"] == "pkg"
    assert report.not_needed == {
        f"pkg/_opt{EXT_SUFFIX}": {
            "package": "pkg",
            "why": "only imported inside fast_path() (pkg/layers.py:4)",
            "feature": "Use the optional vectorised kernels.",
            "needed": "no",
        }
    }


def test_an_import_under_an_import_error_guard_says_what_the_package_raises(tmp_path: Path, cache: ElfCache) -> None:
    sp = _package(
        tmp_path,
        """
        from pkg import _core
        try:
            from pkg import _opt
        except ImportError as exc:
            _opt = None
            _why = "the MPI transport needs libabsent; install it to use pkg.mpi"
    """,
    )
    report = check_site_packages(sp, archs=[], cache=cache)
    assert report.state == StageState.WARN
    assert report.reason == (
        f"{MISSING}; `import pkg` does not need it (pkg/__init__.py:4 imports it under try/except ImportError)"
    )


def test_a_module_that_import_needs_stays_red(tmp_path: Path, cache: ElfCache) -> None:
    sp = _package(tmp_path, "from pkg import helpers\n", helpers="from . import _core, _opt\n")
    report = check_site_packages(sp, archs=[], cache=cache)
    assert (report.state, report.reason) == ("fail", MISSING)
    [fail] = report.of(Severity.FAIL)
    assert fail.details["import_needs"] == "yes"
    assert fail.details["import_needs_why"] == "`import pkg` imports it: pkg → pkg.helpers → pkg._opt"
    assert report.not_needed == {}


LOADER = """
    import importlib.util, pathlib
    from pkg import _core
    def _load():
        path = next(pathlib.Path(__file__).parent.glob("_opt.*.so"))
        spec = importlib.util.spec_from_file_location("_opt", path)
        return spec
    _ops = _load()
    def later():
        from pkg import _opt
"""
NAMED = "pkg/__init__.py, which `import pkg` runs, names '_opt': it may load it by path"


def test_a_host_module_named_by_a_string_that_import_runs_is_left_to_the_import_stage(
    tmp_path: Path, cache: ElfCache
) -> None:
    # mpi4py picks MPI.mpich or MPI.openmpi by path, for the MPI library it finds: whether `import` loads it
    # here is for the import stage to see (and it stays red there when `import` does load it).
    sp = _package(tmp_path, LOADER)
    report = check_site_packages(sp, archs=[], cache=cache)
    assert (report.state, report.reason) == (
        "warn",
        f"{MISSING}; `import pkg` may not need it ({NAMED}): the import stage decides",
    )
    assert report.of(Severity.WARN)[0].details["import_needs"] == "unknown"
    assert report.not_needed == {
        f"pkg/_opt{EXT_SUFFIX}": {"package": "pkg", "why": NAMED, "feature": "", "needed": "unknown"}
    }


# An empty fat binary (magic, version 1, header of 16 bytes, no entries) in the section nvcc writes.
FATBIN = (
    '__attribute__((section(".nv_fatbin"), used)) static const unsigned char fatbin[16] = '
    "{0x50, 0xed, 0x55, 0xba, 1, 0, 16, 0};"
)


@pytest.mark.parametrize("where", ["device code", "sm90/"])
def test_a_build_the_loader_may_pick_by_gpu_stays_red(tmp_path: Path, cache: ElfCache, where: str) -> None:
    # sgl_kernel picks sm90/ or sm100/common_ops by the GPU it finds: the GPU here need not be the target's.
    sp = _site(tmp_path)
    pkg = sp / "pkg"
    build = tmp_path / "build"
    absent = compile_so(build / "libabsent.so.1", "int absent(void) { return 1; }\n", soname="libabsent.so.1")
    ext_module(pkg, "_core")
    folder = pkg / "sm90" if where == "sm90/" else pkg
    ext_module(
        folder,
        "_opt",
        "absent();",
        f"-L{build}",
        f"-l:{absent.name}",
        prelude="int absent(void);" + (FATBIN if where == "device code" else ""),
    )
    (pkg / "__init__.py").write_text(textwrap.dedent(LOADER).replace('"_opt.*.so"', '"**/_opt.*.so"'), encoding="utf-8")
    rel = folder.relative_to(sp).as_posix()
    (sp / "pkg-1.0.dist-info").mkdir()
    (sp / "pkg-1.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: pkg\nVersion: 1.0\n", encoding="utf-8"
    )
    (sp / "pkg-1.0.dist-info" / "RECORD").write_text(
        f"pkg/__init__.py,,\npkg/_core{EXT_SUFFIX},,\n{rel}/_opt{EXT_SUFFIX},,\n", encoding="utf-8"
    )
    symbols = dynamic_symbols(folder / f"_opt{EXT_SUFFIX}")
    assert symbols is not None
    assert symbols.device_code is (where == "device code")
    report = check_site_packages(sp, archs=[], cache=cache)
    assert report.state == StageState.FAIL
    [fail] = report.of(Severity.FAIL)
    assert fail.module == f"{rel}/_opt{EXT_SUFFIX}"
    assert fail.details["import_needs"] == "unknown"
    assert report.not_needed == {}


def test_a_module_no_python_code_imports_or_names_is_a_warning(tmp_path: Path, cache: ElfCache) -> None:
    sp = _package(tmp_path, "")
    report = check_site_packages(sp, archs=[], cache=cache)
    assert (report.state, report.reason) == (
        "warn",
        MISSING + "; `import pkg` does not need it (no Python code of pkg imports it or names it)",
    )
    assert report.of(Severity.WARN)[0].details["import_needs"] == "no"


def test_a_package_without_python_code_stays_red(tmp_path: Path, cache: ElfCache) -> None:
    sp = _package(tmp_path, "")
    (sp / "pkg" / "__init__.py").unlink()  # nothing to read: what `import pkg.…` needs is unknown
    report = check_site_packages(sp, archs=[], cache=cache)
    assert (report.state, report.reason) == ("fail", MISSING)
    assert report.of(Severity.FAIL)[0].details["import_needs"] == "unknown"


def test_the_graph_follows_class_bodies_and_skips_type_checking_and_functions(tmp_path: Path) -> None:
    pkg = tmp_path / "p"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text(
        textwrap.dedent("""
        from typing import TYPE_CHECKING
        if TYPE_CHECKING:
            from p import typed
        class Registry:
            from .sub import eager
        def f():
            import p.lazy
    """),
        encoding="utf-8",
    )
    for name in ("typed.py", "lazy.py", "sub/__init__.py", "sub/eager.py"):
        (pkg / name).write_text("", encoding="utf-8")
    graph = ImportGraph(tmp_path, "p")
    chains, guarded = graph.reach()
    assert sorted(chains) == ["p", "p.sub", "p.sub.eager"]
    assert guarded == set()
    assert graph.need("p.sub.eager").needed == "yes"
    assert (graph.need("p.lazy").needed, graph.need("p.lazy").why) == (
        "no",
        "only imported inside f() (p/__init__.py:8)",
    )
    assert (graph.need("p.typed").needed, graph.need("p.typed").why) == (
        "no",
        "no Python code of p imports it or names it",
    )


def _dist_info(sp: Path, name: str, version: str) -> None:
    info = sp / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n", encoding="utf-8")
    (info / "RECORD").write_text(f"{info.name}/METADATA,,\n", encoding="utf-8")


def test_flashinfer_packages_of_different_versions_fail_naming_both(tmp_path: Path, cache: ElfCache) -> None:
    sp = _site(tmp_path)
    _dist_info(sp, "flashinfer-python", "0.6.4")
    _dist_info(sp, "flashinfer-cubin", "0.6.4")
    _dist_info(sp, "flashinfer-jit-cache", "0.6.3+cu130")
    report = check_site_packages(sp, archs=[], cache=cache)
    assert (report.state, report.reason) == (
        "fail",
        (
            "flashinfer-python 0.6.4 and flashinfer-jit-cache 0.6.3+cu130 are one family (flashinfer) and must be the "
            "same version: flashinfer compares their versions at import and raises on a mismatch"
        ),
    )
    [fail] = report.of(Severity.FAIL)
    assert (fail.kind, fail.details["versions"]) == (
        "family",
        {"flashinfer-python": "0.6.4", "flashinfer-jit-cache": "0.6.3+cu130"},
    )


def test_one_family_at_one_version_is_clean_whatever_the_local_label(tmp_path: Path, cache: ElfCache) -> None:
    sp = _site(tmp_path)
    _dist_info(sp, "flashinfer-python", "0.6.4")
    _dist_info(sp, "flashinfer-jit-cache", "0.6.4+cu130")
    assert check_site_packages(sp, archs=[], cache=cache).state == StageState.PASS


def _by_name_site(root: Path) -> Path:
    """A CUDA 13.0 torch, and 'kern' whose C code dlopen()s libnvrtc.so.12 and whose Python preloads two libs."""
    sp = _site(root)
    (sp / "torch").mkdir()
    (sp / "torch" / "version.py").write_text("cuda: Optional[str] = '13.0'\n", encoding="utf-8")
    _dist_info(sp, "torch", "2.10.0")
    kern = sp / "kern"
    ext_module(kern, "_jit", 'const char *volatile lib = "libnvrtc.so.12"; (void)lib;')
    compile_so(kern / "lib" / "libshipped.so.1", "int shipped(void) { return 0; }\n", soname="libshipped.so.1")
    (kern / "__init__.py").write_text(
        textwrap.dedent("""
        import ctypes, os
        ctypes.CDLL(os.path.join(os.path.dirname(__file__), "lib", "libshipped.so.1"))
        try:
            ctypes.CDLL("libgone.so.3")
        except OSError:
            pass
    """),
        encoding="utf-8",
    )
    info = sp / "kern-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kern\nVersion: 1.0\n", encoding="utf-8")
    files = sorted(p.relative_to(sp).as_posix() for p in kern.rglob("*") if p.is_file())
    (info / "RECORD").write_text("".join(f"{f},,\n" for f in files), encoding="utf-8")
    return sp


def test_libraries_loaded_by_name_are_resolved_here(tmp_path: Path, cache: ElfCache) -> None:
    sp = _by_name_site(tmp_path)
    report = check_site_packages(sp, archs=[], packages=["kern"], cache=cache)
    by_name = [(f.severity, f.message) for f in report.findings if f.kind == "by-name"]
    assert by_name == [
        (
            "warn",
            "kern/__init__.py:5 loads libgone.so.3 by name at run time, which ld.so would not find here: "
            "not in site-packages nor in the system's library cache",
        ),
        (
            "warn",
            f"kern/_jit{EXT_SUFFIX} names libnvrtc.so.12 (a library it may dlopen at run time): CUDA 12, but "
            "this environment's torch is CUDA 13.0, and nothing here provides it",
        ),
    ]
    assert report.state == StageState.WARN


def test_a_file_naming_many_absent_libraries_is_one_finding(tmp_path: Path, cache: ElfCache) -> None:
    # cuda-pathfinder's descriptor_catalog.py lists every library it may look for, 92 of them absent here.
    sp = _site(tmp_path)
    (sp / "cat").mkdir()
    names = [f"libgone{i}.so.{i}" for i in range(6)]
    (sp / "cat" / "__init__.py").write_text("".join(f'LIB{i} = "{n}"\n' for i, n in enumerate(names)), encoding="utf-8")
    _dist_info(sp, "cat", "1.0")
    report = check_site_packages(sp, archs=[], packages=["cat"], cache=cache)
    by_name = [f for f in report.findings if f.kind == "by-name"]
    assert [(f.severity, f.message) for f in by_name] == [
        (
            "warn",
            "cat/__init__.py names 6 libraries to load by name at run time that ld.so would not find here: "
            "libgone0.so.0, libgone1.so.1, libgone2.so.2, libgone3.so.3 and 2 more (each is needed only when the "
            "package loads it)",
        )
    ]
    assert by_name[0].details["libraries"] == names


def test_a_module_import_does_not_need_that_lacks_many_symbols_is_one_warning(tmp_path: Path, cache: ElfCache) -> None:
    sp = _site(tmp_path)
    ext_module(
        sp / "pkg",
        "_opt",
        "gone_a(); gone_b(); gone_c();",
        prelude="void gone_a(void); void gone_b(void); void gone_c(void);",
    )
    (sp / "pkg" / "__init__.py").write_text("", encoding="utf-8")
    _dist_info(sp, "pkg", "1.0")
    report = check_site_packages(sp, archs=[], cache=cache)
    symbols = [f for f in report.findings if f.kind == "symbol"]
    assert [(f.severity, f.message) for f in symbols] == [
        (
            "warn",
            f"pkg/_opt{EXT_SUFFIX} needs 3 symbols that no library in its load set defines: gone_a, gone_b, "
            "gone_c; `import pkg` does not need it (no Python code of pkg imports it or names it)",
        )
    ]
    assert symbols[0].details["symbols"] == ["gone_a", "gone_b", "gone_c"]


def _driver_site(root: Path) -> Path:
    """'drv' whose extension links libcuda.so.1 and imports cuInit (CUDA 2.0) and cuTensorMapEncodeIm2colWide
    (CUDA 12.8, driver 570.26); `import drv` imports it."""
    sp = _site(root)
    build = root / "build"
    compile_so(
        build / "libcuda.so.1",
        "int cuInit(int f) { return 0; }\nint cuTensorMapEncodeIm2colWide(void) { return 0; }\n",
        soname="libcuda.so.1",
    )
    pkg = sp / "drv"
    ext_module(
        pkg,
        "_ops",
        "cuInit(0); cuTensorMapEncodeIm2colWide();",
        f"-L{build}",
        "-l:libcuda.so.1",
        prelude="int cuInit(int); int cuTensorMapEncodeIm2colWide(void);",
    )
    (pkg / "__init__.py").write_text("from drv import _ops\n", encoding="utf-8")
    info = sp / "drv-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: drv\nVersion: 1.0\n", encoding="utf-8")
    files = sorted(p.relative_to(sp).as_posix() for p in pkg.rglob("*") if p.is_file())
    (info / "RECORD").write_text("".join(f"{f},,\n" for f in files), encoding="utf-8")
    return sp


def test_an_entry_point_newer_than_the_min_driver_fails(tmp_path: Path, cache: ElfCache) -> None:
    sp = _driver_site(tmp_path)
    old = check_site_packages(sp, archs=[], min_driver="550.54", cache=cache)
    assert (old.state, old.reason) == (
        "fail",
        (
            f"drv/_ops{EXT_SUFFIX} imports cuTensorMapEncodeIm2colWide from libcuda, an entry point of CUDA 12.8 "
            "(driver 570.26 or newer): the min-driver 550.54 is older"
        ),
    )
    assert old.of(Severity.FAIL)[0].details["entry_points"] == [
        {"symbol": "cuTensorMapEncodeIm2colWide", "cuda": "12.8", "driver": "570.26"}
    ]
    assert [
        f
        for f in check_site_packages(sp, archs=[], min_driver="570.26", cache=cache).findings
        if f.kind == "driver-api"
    ] == []


def test_the_driver_table_is_generated_from_the_toolkit_headers(tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    include = tmp_path / "include"
    include.mkdir()
    (include / "cuda.h").write_text(
        textwrap.dedent("""
        #define CUDA_VERSION 13000
        #define cuCtxCreate                         cuCtxCreate_v4
        #define cuMemcpyHtoD                        __CUDA_API_PTDS(cuMemcpyHtoD_v2)
        #define cuMemPrefetchAsync                  __CUDA_API_PTSZ(cuMemPrefetchAsync_v2)
        #define cuStreamGetCtx                      __CUDA_API_PTSZ(cuStreamGetCtx)
        #define cuStreamGetCtx_v2                   __CUDA_API_PTSZ(cuStreamGetCtx_v2)
        CUresult CUDAAPI cuStreamGetCtx_v2(CUstream hStream, CUcontext *pCtx, CUgreenCtx *pGreenCtx);
    """),
        encoding="utf-8",
    )
    (include / "cudaTypedefs.h").write_text(
        textwrap.dedent("""
        typedef CUresult (CUDAAPI *PFN_cuInit_v2000)(unsigned int Flags);
        typedef CUresult (CUDAAPI *PFN_cuCtxCreate_v3020)(CUcontext *pctx);
        typedef CUresult (CUDAAPI *PFN_cuCtxCreate_v11040)(CUcontext *pctx);
        typedef CUresult (CUDAAPI *PFN_cuCtxCreate_v12050)(CUcontext *pctx);
        typedef CUresult (CUDAAPI *PFN_cuMemcpyHtoD_v7000_ptds)(CUdeviceptr_v2 dstDevice);
        typedef CUresult (CUDAAPI *PFN_cuMemcpyHtoD_v3020)(CUdeviceptr_v2 dstDevice);
            typedef CUresult (CUDAAPI *PFN_cuCtxCreate_v2000)(CUcontext *pctx);
        typedef CUresult (CUDAAPI *PFN_cuMemPrefetchAsync_v8000_ptsz)(CUdeviceptr_v2 devPtr);
        typedef CUresult (CUDAAPI *PFN_cuMemPrefetchAsync_v12020_ptsz)(CUdeviceptr_v2 devPtr);
        typedef CUresult (CUDAAPI *PFN_cuMemPrefetchAsync_v8000)(CUdeviceptr_v2 devPtr);
        typedef CUresult (CUDAAPI *PFN_cuMemPrefetchAsync_v12020)(CUdeviceptr_v2 devPtr);
        typedef CUresult (CUDAAPI *PFN_cuStreamGetCtx_v9020_ptsz)(CUstream hStream, CUcontext *pctx);
        typedef CUresult (CUDAAPI *PFN_cuStreamGetCtx_v9020)(CUstream hStream, CUcontext *pctx);
        typedef CUresult (CUDAAPI *PFN_cuStreamGetCtx_v12050)(CUstream hStream, CUcontext *pctx);
        typedef CUresult (CUDAAPI *PFN_cuStreamGetCtx_v12050_ptsz)(CUstream hStream, CUcontext *pctx);
    """),
        encoding="utf-8",
    )
    script = Path(__file__).resolve().parents[4] / "scripts" / "gen_driver_api.py"
    out = tmp_path / "driver_api.json"
    done = subprocess.run(
        [sys.executable, str(script), "--include", str(include), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    data = json.loads(out.read_text(encoding="utf-8"))
    assert data["from"] == "cuda.h and cudaTypedefs.h of CUDA 13.0"
    assert data["entry_points"] == {
        "cuCtxCreate": {"cuda": "2.0", "driver": None},
        "cuCtxCreate_v2": {"cuda": "3.2", "driver": None},
        "cuCtxCreate_v3": {"cuda": "11.4", "driver": None},
        "cuCtxCreate_v4": {"cuda": "12.5", "driver": "555.42.02"},
        "cuInit": {"cuda": "2.0", "driver": None},
        "cuMemcpyHtoD_v2": {"cuda": "3.2", "driver": None},
        "cuMemcpyHtoD_v2_ptds": {"cuda": "7.0", "driver": None},
        # each per-thread form with the version of its own number, whatever order the header lists them in
        "cuMemPrefetchAsync": {"cuda": "8.0", "driver": None},
        "cuMemPrefetchAsync_ptsz": {"cuda": "8.0", "driver": None},
        "cuMemPrefetchAsync_v2": {"cuda": "12.2", "driver": "535.54.03"},
        "cuMemPrefetchAsync_v2_ptsz": {"cuda": "12.2", "driver": "535.54.03"},
        # the bare name maps to itself, and the newer version is an API of its own (cuStreamGetCtx_v2)
        "cuStreamGetCtx": {"cuda": "9.2", "driver": None},
        "cuStreamGetCtx_ptsz": {"cuda": "9.2", "driver": None},
        "cuStreamGetCtx_v2": {"cuda": "12.5", "driver": "555.42.02"},
        "cuStreamGetCtx_v2_ptsz": {"cuda": "12.5", "driver": "555.42.02"},
    }


def test_a_namespace_package_is_judged_by_the_package_below_it(tmp_path: Path, cache: ElfCache) -> None:
    # cuda-core: cuda/ has no __init__.py; cuda/core/__init__.py imports the cu12/ or cu13/ build by a name it
    # computes, inside a function. `import cuda` runs none of it: the package is cuda.core.
    sp = _site(tmp_path)
    build = tmp_path / "build"
    absent = compile_so(build / "libabsent.so.1", "int absent(void) { return 1; }\n", soname="libabsent.so.1")
    core = sp / "cuda" / "core"
    ext_module(core / "cu12", "_device", "absent();", f"-L{build}", f"-l:{absent.name}", prelude="int absent(void);")
    (core / "__init__.py").write_text(
        textwrap.dedent("""
        def _versioned():
            import importlib
            return importlib.import_module(f".cu{12}", __package__)
        _versioned()
    """),
        encoding="utf-8",
    )
    (core / "cu12" / "__init__.py").write_text("from cuda.core.cu12 import _device\n", encoding="utf-8")
    _dist_info(sp, "cuda-core", "1.0")
    assert package_of(sp, f"cuda/core/cu12/_device{EXT_SUFFIX}") == "cuda.core"
    assert package_of(sp, f"pkg/_x{EXT_SUFFIX}") == "pkg"  # no __init__.py anywhere: its top folder
    report = check_site_packages(sp, archs=[], cache=cache)
    assert report.reason == (
        f"cuda/core/cu12/_device{EXT_SUFFIX}: libabsent.so.1 not found: not in site-packages nor in the system's "
        "library cache; `import cuda.core` does not need it (imported only by cuda/core/cu12/__init__.py:1, "
        "which `import cuda.core` does not run)"
    )
    assert ImportGraph(sp, "cuda.core").reach()[0] == {"cuda.core": ("cuda.core",)}
