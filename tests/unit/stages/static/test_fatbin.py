"""compatlab.stages.static.fatbin: the compatibility rules, and fatbins that nvcc builds in the test."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from compatlab.proc import run
from compatlab.stages.static.elf import read_elf
from compatlab.stages.static.fatbin import GpuCode, coverage, parse_arch, parse_fatbin, runs_on

KERNEL = """
__global__ void add(float* x) { x[threadIdx.x] += 1.0f; }
extern "C" void launch(float* x) { add<<<1, 32>>>(x); }
"""


def _nvcc() -> str | None:
    for cand in (shutil.which("nvcc"), "/usr/local/nvcc/bin/nvcc", "/usr/local/cuda/bin/nvcc"):
        if cand and os.access(cand, os.X_OK):
            return cand
    return None


def nvcc_build(out: Path, *gencode: str, shared: bool = True) -> Path:
    """Compile a one-kernel module with the given ``-gencode`` options (skips without nvcc)."""
    nvcc = _nvcc()
    if nvcc is None:
        pytest.skip("nvcc not found (on PATH, /usr/local/nvcc or /usr/local/cuda)")
    out.parent.mkdir(parents=True, exist_ok=True)
    src = out.parent / f"{out.name}.cu"
    src.write_text(KERNEL, encoding="utf-8")
    kind = ["-shared", "-Xcompiler", "-fPIC"] if shared else ["-fatbin"]
    done = run([nvcc, *kind, *gencode, "-o", str(out), str(src)], timeout=300)
    if not done.ok and "Unsupported gpu architecture" in done.stderr:
        pytest.skip(f"this nvcc cannot build {' '.join(gencode)}")
    assert done.ok, done.stderr
    return out


@pytest.mark.parametrize(
    ("code", "device", "expected"),
    [
        ("sm_90", 90, True),
        ("sm_80", 86, True),  # same major, newer minor
        ("sm_86", 80, False),
        ("sm_90", 100, False),  # a cubin never runs on another major
        ("sm_90", 120, False),
        ("sm_90a", 90, True),
        ("sm_100a", 103, False),  # arch-specific: that arch only
        ("sm_100f", 103, True),  # family-specific: its family
        ("sm_100f", 120, False),
        ("compute_90", 120, True),  # PTX JIT-compiles forward
        ("compute_90", 89, False),
        ("compute_90a", 100, False),
    ],
)
def test_runs_on(code: str, device: int, expected: bool) -> None:
    assert runs_on(GpuCode.parse(code), device) is expected


def test_parse_arch() -> None:
    assert parse_arch("sm_90") == 90
    assert parse_arch("sm_90a") == 90
    assert parse_arch("120") == 120
    with pytest.raises(ValueError, match="expected a GPU arch like 'sm_90' or 'sm_120', got 'hopper'"):
        parse_arch("hopper")


def test_coverage_message() -> None:
    cov = coverage([["sm_90a"], ["sm_100a", "sm_90a"]], 120)
    assert not cov.covered
    assert cov.describe() == "no kernel image for sm_120 (has sm_90a, sm_100a; PTX none)"
    partial = coverage([["sm_90", "compute_90"], ["sm_90a"]], 120)
    assert partial.covered
    assert (partial.containers, partial.uncovered) == (2, 1)


def test_garbage_has_no_fatbin() -> None:
    assert parse_fatbin(b"\x00" * 256) == []


@pytest.mark.slow
def test_nvcc_sm90_module(tmp_path: Path) -> None:
    so = nvcc_build(tmp_path / "k.so", "-gencode=arch=compute_90,code=sm_90")
    info = read_elf(so)
    assert info.fatbins
    assert {name for c in info.fatbins for name in c} == {"sm_90"}
    assert coverage(info.fatbins, 90).covered
    no = coverage(info.fatbins, 120)
    assert no.describe() == "no kernel image for sm_120 (has sm_90; PTX none)"


@pytest.mark.slow
def test_nvcc_arch_specific_and_ptx(tmp_path: Path) -> None:
    fat = nvcc_build(tmp_path / "k.fatbin", "-gencode=arch=compute_90a,code=sm_90a",
                     "-gencode=arch=compute_90,code=compute_90", shared=False)
    containers = parse_fatbin(fat.read_bytes())
    assert containers == [["compute_90", "sm_90a"]]
    assert coverage(containers, 90).covered
    # sm_90a runs only on sm_90, but the PTX JIT-compiles for newer GPUs.
    assert coverage(containers, 120).covered
    only_a = [["sm_90a"]]
    assert coverage(only_a, 100).describe() == "no kernel image for sm_100 (has sm_90a; PTX none)"
