"""compatlab.stages.static.fatbin on fatbins that nvcc builds in the test (skipped without nvcc)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from compatlab.proc import run
from compatlab.stages.static.elf import read_elf
from compatlab.stages.static.fatbin import coverage, parse_fatbin

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
    fat = nvcc_build(
        tmp_path / "k.fatbin",
        "-gencode=arch=compute_90a,code=sm_90a",
        "-gencode=arch=compute_90,code=compute_90",
        shared=False,
    )
    containers = parse_fatbin(fat.read_bytes())
    assert containers == [["compute_90", "sm_90a"]]
    assert coverage(containers, 90).covered
    # sm_90a runs only on sm_90, but the PTX JIT-compiles for newer GPUs.
    assert coverage(containers, 120).covered
    only_a = [["sm_90a"]]
    assert coverage(only_a, 100).describe() == "no kernel image for sm_100 (has sm_90a; PTX none)"
