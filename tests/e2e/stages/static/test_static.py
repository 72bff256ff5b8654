"""compatlab.stages.static.stage end to end: fake site-packages of gcc/nvcc-built modules, the library API and the CLI."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from compatlab.cells import expand
from compatlab.config.matrix import parse_matrix
from compatlab.proc import run
from compatlab.runs.model import StageState
from compatlab.runs.records.static import Severity
from compatlab.stages.base import CellContext
from compatlab.stages.static.elf import CACHE_SCHEMA, ElfCache
from compatlab.stages.static.ldso import ld_cache
from compatlab.stages.static.stage import check_site_packages, run_static_stage

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")

SRC = Path(__file__).resolve().parents[4] / "src"
CHECK_INT = "namespace c10 { void check(int) {} }\n"
CHECK_UNSIGNED = "namespace c10 { void check(unsigned int) {} }\n"
CONSUMER = 'namespace c10 { void check(int); }\nextern "C" void entry(void) { c10::check(1); }\n'


def _cc(out: Path, source: str, *args: str) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    src = out.parent.parent / f"{out.parent.name}-{out.name}.cpp"  # outside site-packages
    src.write_text(source, encoding="utf-8")
    done = run(["g++", "-shared", "-fPIC", "-o", str(out), str(src), *args], timeout=120)
    assert done.ok, done.stderr
    return out


def _record_hash(path: Path) -> str:
    digest = hashlib.sha256(path.read_bytes()).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def _dist(
    sp: Path,
    name: str,
    version: str,
    files: list[str],
    *,
    requires: tuple[str, ...] = (),
    tag: str = "cp311-cp311-manylinux_2_28_x86_64",
) -> None:
    """A .dist-info whose RECORD lists *files* (relative to *sp*) with their real hashes."""
    info = sp / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    meta = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    meta += [f"Requires-Dist: {r}" for r in requires]
    (info / "METADATA").write_text("\n".join(meta) + "\n", encoding="utf-8")
    (info / "WHEEL").write_text(f"Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: {tag}\n", encoding="utf-8")
    rows = [f"{f},{_record_hash(sp / f)},{(sp / f).stat().st_size}" for f in files]
    rows += [f"{info.name}/{n}," for n in ("METADATA", "WHEEL", "RECORD")]
    (info / "RECORD").write_text("\n".join(rows) + "\n", encoding="utf-8")


def _site(root: Path) -> Path:
    sp = root / "venv" / "lib" / "python3.11" / "site-packages"
    sp.mkdir(parents=True)
    return sp


def _torch_and_kern(root: Path, torch_version: str, check_source: str, *, kern_requires: tuple[str, ...] = ()) -> Path:
    """A site-packages with a fake torch (torch/lib/libc10.so) and 'kern', built against c10::check(int)."""
    sp = _site(root)
    build = root / "build"
    # kern is linked against the torch it was built with, which is not the one installed here.
    built_with = _cc(build / "libc10.so", CHECK_INT, "-Wl,-soname,libc10.so")
    _cc(sp / "kern" / "_ops.abi3.so", CONSUMER, f"-L{built_with.parent}", "-lc10")
    _cc(sp / "torch" / "lib" / "libc10.so", check_source, "-Wl,-soname,libc10.so")
    # `import kern` loads its extension, as a real kernel package does: what fails here, `import` needs.
    (sp / "kern" / "__init__.py").write_text("from . import _ops\n", encoding="utf-8")
    _dist(sp, "torch", torch_version, ["torch/lib/libc10.so"])
    _dist(
        sp,
        "kern",
        "1.0",
        ["kern/_ops.abi3.so", "kern/__init__.py"],
        requires=kern_requires,
        tag="cp310-abi3-manylinux_2_28_x86_64",
    )
    return sp


@pytest.fixture
def cache(tmp_path: Path) -> ElfCache:
    return ElfCache(tmp_path / "cache")


def test_abi_break_names_the_near_miss(tmp_path: Path, cache: ElfCache) -> None:
    sp = _torch_and_kern(tmp_path, "2.10.0", CHECK_UNSIGNED, kern_requires=("torch",))
    report = check_site_packages(sp, archs=["sm_90"], cache=cache)
    assert report.state == StageState.FAIL
    assert report.reason == (
        "kern/_ops.abi3.so needs c10::check(int); torch 2.10.0 (libc10.so) exports c10::check(unsigned int): "
        "kern was built against another torch."
    )
    [fail] = report.of(Severity.FAIL)
    assert fail.kind == "symbol"
    assert fail.details["symbol"] == "_ZN3c105checkEi"
    assert fail.details["near_misses"] == [{"demangled": "c10::check(unsigned int)", "provider": "torch/lib/libc10.so"}]


def test_matching_torch_passes_but_warns_about_metadata(tmp_path: Path, cache: ElfCache) -> None:
    sp = _torch_and_kern(tmp_path, "2.9.1", CHECK_INT)
    report = check_site_packages(sp, archs=["sm_90"], cache=cache)
    assert report.state == StageState.WARN
    assert report.reason == (
        "kern 1.0: kern/_ops.abi3.so links libc10.so but METADATA has no Requires-Dist on torch: a resolver "
        "may pair it with any torch"
    )
    assert report.of(Severity.FAIL) == []


def test_cache_makes_the_second_run_read_nothing(tmp_path: Path, cache: ElfCache) -> None:
    sp = _torch_and_kern(tmp_path, "2.9.1", CHECK_INT, kern_requires=("torch>=2.9",))
    first = check_site_packages(sp, archs=[], cache=cache)
    assert first.state == StageState.PASS
    assert first.cache_misses > 0
    again = check_site_packages(sp, archs=[], cache=ElfCache(tmp_path / "cache"))
    assert again.cache_misses == 0
    assert again.cache_hits > 0
    # The file's own content is the key: kern's module is stored under the sha256 of its bytes.
    digest = hashlib.sha256((sp / "kern" / "_ops.abi3.so").read_bytes()).hexdigest()
    assert (tmp_path / "cache" / f"elf-v{CACHE_SCHEMA}" / digest[:2] / f"{digest}.json").is_file()


def test_missing_library(tmp_path: Path, cache: ElfCache) -> None:
    sp = _site(tmp_path)
    gone = _cc(tmp_path / "build" / "libgone.so.1", "int gone(void) { return 1; }\n", "-Wl,-soname,libgone.so.1")
    _cc(
        sp / "pkg" / "_ext.abi3.so",
        "int gone(void);\nint f(void) { return gone(); }\n",
        f"-L{gone.parent}",
        "-l:libgone.so.1",
    )
    _dist(sp, "pkg", "0.1", ["pkg/_ext.abi3.so"])
    report = check_site_packages(sp, archs=[], cache=cache)
    assert report.reason == (
        "pkg/_ext.abi3.so: libgone.so.1 not found: not in site-packages nor in the system's library cache"
    )
    # The symbol it would have provided is not counted as a second failure.
    assert [f.kind for f in report.of(Severity.FAIL)] == ["library"]
    assert [f.details["symbol"] for f in report.of(Severity.NOTE) if f.kind == "symbol"] == ["_Z4gonev"]


def test_library_in_site_packages_but_off_the_search_path(tmp_path: Path, cache: ElfCache) -> None:
    sp = _site(tmp_path)
    lib = _cc(
        sp / "nvidia" / "thing" / "lib" / "libthing.so.3",
        "int thing(void) { return 3; }\n",
        "-Wl,-soname,libthing.so.3",
    )
    _cc(
        sp / "pkg" / "_ext.abi3.so",
        "int thing(void);\nint f(void) { return thing(); }\n",
        f"-L{lib.parent}",
        "-l:libthing.so.3",
    )
    _dist(sp, "nvidia-thing", "3.0", ["nvidia/thing/lib/libthing.so.3"])
    _dist(sp, "pkg", "0.1", ["pkg/_ext.abi3.so"])
    report = check_site_packages(sp, archs=[], packages=["pkg"], cache=cache)
    assert report.reason == (
        "pkg/_ext.abi3.so: libthing.so.3 not found: nvidia-thing 3.0 ships it at "
        "nvidia/thing/lib/libthing.so.3, but nothing on pkg/_ext.abi3.so's search path points there"
    )


def test_origin_runpath_resolves(tmp_path: Path, cache: ElfCache) -> None:
    sp = _site(tmp_path)
    _cc(sp / "pkg" / "lib" / "libhelper.so", "int helper(void) { return 2; }\n", "-Wl,-soname,libhelper.so")
    _cc(
        sp / "pkg" / "_ext.abi3.so",
        "int helper(void);\nint f(void) { return helper(); }\n",
        f"-L{sp / 'pkg' / 'lib'}",
        "-lhelper",
        "-Wl,-rpath,$ORIGIN/lib",
        "-Wl,--enable-new-dtags",
    )
    _dist(sp, "pkg", "0.1", ["pkg/_ext.abi3.so", "pkg/lib/libhelper.so"])
    report = check_site_packages(sp, archs=[], cache=cache)
    assert report.state == StageState.PASS, report.reason
    assert report.modules == 2
    assert report.findings == []


def test_symbol_version_newer_than_the_provider(tmp_path: Path, cache: ElfCache) -> None:
    sp = _site(tmp_path)
    build = tmp_path / "build"
    build.mkdir()
    (build / "v1.map").write_text("VERS_1 { global: prov_fn; local: *; };\n", encoding="utf-8")
    (build / "v2.map").write_text(
        "VERS_1 { global: prov_fn; local: *; };\nVERS_2 { global: prov_new; } VERS_1;\n", encoding="utf-8"
    )
    new = _cc(
        build / "v2" / "libprov.so",
        ('extern "C" int prov_fn(void) { return 1; }\nextern "C" int prov_new(void) { return 2; }\n'),
        "-Wl,-soname,libprov.so",
        f"-Wl,--version-script={build / 'v2.map'}",
    )
    _cc(
        sp / "ver" / "_ext.abi3.so",
        'extern "C" int prov_new(void);\nint f(void) { return prov_new(); }\n',
        f"-L{new.parent}",
        "-lprov",
        "-Wl,-rpath,$ORIGIN/lib",
    )
    _cc(
        sp / "ver" / "lib" / "libprov.so",
        'extern "C" int prov_fn(void) { return 1; }\n',
        "-Wl,-soname,libprov.so",
        f"-Wl,--version-script={build / 'v1.map'}",
    )
    _dist(sp, "ver", "0.1", ["ver/_ext.abi3.so", "ver/lib/libprov.so"])
    report = check_site_packages(sp, archs=[], cache=cache)
    assert report.reason == ("ver/_ext.abi3.so needs VERS_2 from libprov.so; ver/lib/libprov.so offers only VERS_1")
    [fail] = report.of(Severity.FAIL)
    assert fail.details["symbols"] == ["prov_new"]


def test_driver_library_is_a_note_without_a_driver(tmp_path: Path, cache: ElfCache) -> None:
    if "libcuda.so.1" in ld_cache():
        pytest.skip("this machine has an NVIDIA driver (libcuda.so.1 is in the ld.so cache)")
    sp = _site(tmp_path)
    stub = _cc(
        tmp_path / "build" / "libcuda.so.1",
        'extern "C" int cuInit(unsigned f) { return (int)f; }\n',
        "-Wl,-soname,libcuda.so.1",
    )
    _cc(
        sp / "pkg" / "_ext.abi3.so",
        'extern "C" int cuInit(unsigned);\nint f(void) { return cuInit(0); }\n',
        f"-L{stub.parent}",
        "-l:libcuda.so.1",
    )
    _dist(sp, "pkg", "0.1", ["pkg/_ext.abi3.so"])
    report = check_site_packages(sp, archs=[], cache=cache)
    assert report.state == StageState.PASS
    assert [f.message for f in report.findings] == [
        "pkg/_ext.abi3.so: libcuda.so.1 not found: it comes with the NVIDIA driver, not with a wheel"
    ]


def test_plugin_nothing_imports_is_only_a_note(tmp_path: Path, cache: ElfCache) -> None:
    sp = _site(tmp_path)
    gone = _cc(tmp_path / "build" / "libmpi.so.40", "int mpi(void) { return 1; }\n", "-Wl,-soname,libmpi.so.40")
    _cc(
        sp / "nvidia" / "x" / "lib" / "bootstrap_mpi.so.3",
        "int mpi(void);\nint f(void) { return mpi(); }\n",
        f"-L{gone.parent}",
        "-l:libmpi.so.40",
    )
    report = check_site_packages(sp, archs=[], cache=cache)
    assert report.state == StageState.PASS
    assert report.findings[0].message == (
        "nvidia/x/lib/bootstrap_mpi.so.3: libmpi.so.40 not found: not in site-packages nor in the system's "
        "library cache (no extension module loads it)"
    )


def test_wheel_tag_lint(tmp_path: Path, cache: ElfCache) -> None:
    sp = _site(tmp_path)
    _cc(sp / "pkg" / "_ext.abi3.so", "int f(void) { return 1; }\n")
    _dist(sp, "pkg", "0.1", ["pkg/_ext.abi3.so"], tag="cp312-abi3-linux_x86_64")
    report = check_site_packages(sp, archs=[], cache=cache)
    assert [f.message for f in report.of(Severity.WARN)] == [
        "pkg 0.1: WHEEL says Tag: cp312-abi3-linux_x86_64; an index only takes manylinux/musllinux wheels, "
        "so the file name and WHEEL disagree (renamed without rewriting WHEEL?)",
        "pkg 0.1: WHEEL says Tag: cp312-abi3-linux_x86_64, which Python 3.11 cannot use",
    ]


@pytest.fixture(scope="module")
def gpu_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """site-packages with one module built by nvcc for sm_90 only."""
    from test_fatbin_nvcc import nvcc_build

    root = tmp_path_factory.mktemp("gpu")
    sp = _site(root)
    nvcc_build(sp / "gpu" / "_k.abi3.so", "-gencode=arch=compute_90,code=sm_90")
    _dist(sp, "gpu", "0.1", ["gpu/_k.abi3.so"])
    return sp


@pytest.mark.slow
def test_arch_coverage(gpu_site: Path, cache: ElfCache) -> None:
    red = check_site_packages(gpu_site, archs=["sm_120"], cache=cache)
    assert red.state == StageState.FAIL
    assert red.reason == "gpu/_k.abi3.so: no kernel image for sm_120 (has sm_90; PTX none)"
    assert red.of(Severity.FAIL)[0].details["cubins"] == ["sm_90"]
    green = check_site_packages(gpu_site, archs=["sm_90"], cache=cache)
    assert green.state == StageState.PASS, green.reason
    skipped = check_site_packages(gpu_site, archs=["sm_120"], not_needed=["gpu/*"], cache=cache)
    assert skipped.state == StageState.PASS
    assert [f.message for f in skipped.of(Severity.NOTE)] == [
        "gpu/_k.abi3.so: no kernel image for sm_120 (has sm_90; PTX none) (not needed here)"
    ]


def _matrix(kernel_package: str) -> dict[str, Any]:
    """A cell whose sgl-kernel axis is the fake distribution: the stage checks declared packages only."""
    return {
        "axes": {
            "torch": ["2.10.0"],
            "sgl-kernel": [{"version": "0.3.21", "package": kernel_package}],
            "flashinfer": ["0.6.4"],
            "cuda": ["12.8"],
        },
        "targets": {
            "h200": {"arch": ["sm_90"]},
            "rtx": {"arch": ["sm_120"], "not-needed": ["gpu/*"]},
        },
    }


@pytest.mark.slow
def test_stage_uses_every_target(gpu_site: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMPATLAB_CACHE", str(tmp_path / "cache"))
    matrix = parse_matrix(_matrix("gpu"))
    ctx = CellContext(
        matrix=matrix,
        cell=expand(matrix)[0],
        venv=gpu_site.parents[2],
        python=gpu_site.parents[2] / "bin" / "python",
        site_packages=gpu_site,
        work_dir=tmp_path,
    )
    result = run_static_stage(ctx)
    assert (result.name, result.state, result.reason) == ("static", "pass", "")
    assert result.details["counts"] == {"fail": 0, "warn": 0, "note": 1}
    assert result.details["findings"][0]["message"] == (
        "gpu/_k.abi3.so: no kernel image for sm_120 (has sm_90; PTX none) (not needed on target rtx)"
    )
    json.dumps(result.to_json())


def test_stage_reports_the_first_failure_and_counts_the_rest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMPATLAB_CACHE", str(tmp_path / "cache"))
    sp = _torch_and_kern(tmp_path, "2.10.0", CHECK_UNSIGNED)
    _cc(sp / "kern" / "_more.abi3.so", CONSUMER, f"-L{tmp_path / 'build'}", "-lc10")
    (sp / "kern" / "__init__.py").write_text("from . import _more, _ops\n", encoding="utf-8")
    # A package the cell does not declare is not judged, however broken.
    _cc(sp / "other" / "_x.abi3.so", CONSUMER, f"-L{tmp_path / 'build'}", "-lc10")
    _dist(sp, "other", "0.1", ["other/_x.abi3.so"])
    matrix = parse_matrix(_matrix("kern"))
    ctx = CellContext(
        matrix=matrix,
        cell=expand(matrix)[0],
        venv=sp.parents[2],
        python=sp.parents[2] / "bin" / "python",
        site_packages=sp,
        work_dir=tmp_path,
    )
    result = run_static_stage(ctx)
    assert result.state == StageState.FAIL
    assert result.reason == (
        "kern/_more.abi3.so needs c10::check(int); torch 2.10.0 (libc10.so) exports "
        "c10::check(unsigned int): kern was built against another torch. (and 1 more)"
    )
    assert result.details["counts"] == {"fail": 2, "warn": 1, "note": 0}
    assert json.loads(json.dumps(result.details))["cache"]["misses"] >= 3


# --- the command line, in a real subprocess -----------------------------------------------------------


def _cli(*args: str, cache: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(SRC), "COMPATLAB_CACHE": str(cache)}
    return subprocess.run(
        [sys.executable, "-m", "compatlab", "static", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def test_cli_exit_1_on_failure(tmp_path: Path) -> None:
    sp = _torch_and_kern(tmp_path, "2.10.0", CHECK_UNSIGNED, kern_requires=("torch",))
    done = _cli("--site-packages", str(sp), "--target", "sm_90", cache=tmp_path / "cache")
    assert done.returncode == 1, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith(f"static: {sp}: fail (1 failures, 0 warnings, 0 notes; 2 modules in ")
    assert lines[1:] == [
        "fail: kern/_ops.abi3.so needs c10::check(int); torch 2.10.0 (libc10.so) exports "
        "c10::check(unsigned int): kern was built against another torch."
    ]
    assert done.stderr == ""


def test_cli_exit_0_and_json(tmp_path: Path) -> None:
    sp = _torch_and_kern(tmp_path, "2.9.1", CHECK_INT, kern_requires=("torch",))
    done = _cli("--site-packages", str(sp), "--target", "sm_90", "--json", cache=tmp_path / "cache")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["state"] == "pass"
    assert data["counts"] == {"fail": 0, "warn": 0, "note": 0}
    assert data["archs"] == ["sm_90"]
    assert data["cache"]["misses"] > 0
    assert data["modules"] == 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--site-packages", "{tmp}/nowhere"],
            "error: {tmp}/nowhere: no such directory; pass the site-packages directory of an environment\n",
        ),
        (
            ["--site-packages", "{tmp}", "--target", "hopper"],
            "error: expected a GPU arch like 'sm_90' or 'sm_120', got 'hopper'\n",
        ),
        ([], "error: the following arguments are required: --site-packages (see --help)\n"),
    ],
)
def test_cli_exit_2_on_bad_usage(tmp_path: Path, args: list[str], message: str) -> None:
    done = _cli(*(a.format(tmp=tmp_path) for a in args), cache=tmp_path / "cache")
    assert done.returncode == 2
    assert done.stderr == message.format(tmp=tmp_path)
    assert done.stdout == ""
