"""How long does the static stage take on real torch + sgl-kernel environments, cold and warm?

Cold: an empty cache, every ELF file's dynamic symbols and fatbin headers read once. Warm: a new process
(a new ElfCache object) over a filled cache, which is what the second and later cells of a matrix see.
Three cells: three environments in a row sharing one warm cache.

The environments are real venvs (``uv pip install torch==X sgl-kernel==0.3.21``); point
``COMPATLAB_BENCH_VENVS`` at the directories (``os.pathsep``-separated), default /work/venvs/t291,
/work/venvs/t2100, /work/venvs/t2110. Missing ones are skipped.

    PYTHONPATH=src python benchmarks/bench_static.py            # prints figures
    PYTHONPATH=src python -m pytest benchmarks/bench_static.py  # the same under pytest-benchmark
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from compatlab.stages.static.elf import ElfCache, read_elf
from compatlab.stages.static.stage import check_site_packages

ARCHS = ("sm_90", "sm_120")
DEFAULT_VENVS = ("/work/venvs/t291", "/work/venvs/t2100", "/work/venvs/t2110")


def _site_packages() -> list[Path]:
    raw = os.environ.get("COMPATLAB_BENCH_VENVS")
    venvs = raw.split(os.pathsep) if raw else list(DEFAULT_VENVS)
    found = []
    for venv in venvs:
        hits = sorted(Path(venv).glob("lib/python3.*/site-packages"))
        if hits and (hits[0] / "torch").is_dir():
            found.append(hits[0])
    return found


SITES = _site_packages()
needs_sites = pytest.mark.skipif(not SITES, reason="no torch venv found; set COMPATLAB_BENCH_VENVS")


@pytest.fixture
def cache_root() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="compatlab-bench-"))
    yield root
    shutil.rmtree(root, ignore_errors=True)


@needs_sites
def test_read_libtorch_cpu(benchmark: Any) -> None:
    """One big symbol table (libtorch_cpu.so, ~78k dynamic symbols), no cache."""
    lib = SITES[0] / "torch" / "lib" / "libtorch_cpu.so"
    info = benchmark(read_elf, lib)
    assert len(info.defined) > 50_000


@needs_sites
def test_one_cell_cold(benchmark: Any, cache_root: Path) -> None:
    def cold() -> str:
        shutil.rmtree(cache_root, ignore_errors=True)
        return check_site_packages(SITES[0], archs=ARCHS, cache=ElfCache(cache_root)).state

    benchmark.pedantic(cold, rounds=1, iterations=1)


@needs_sites
def test_one_cell_warm(benchmark: Any, cache_root: Path) -> None:
    check_site_packages(SITES[0], archs=ARCHS, cache=ElfCache(cache_root))
    report = benchmark.pedantic(
        lambda: check_site_packages(SITES[0], archs=ARCHS, cache=ElfCache(cache_root)), rounds=3, iterations=1
    )
    assert report.cache_misses == 0


@needs_sites
def test_three_cells_warm(benchmark: Any, cache_root: Path) -> None:
    for sp in SITES:
        check_site_packages(sp, archs=ARCHS, cache=ElfCache(cache_root))

    def three() -> int:
        return sum(check_site_packages(sp, archs=ARCHS, cache=ElfCache(cache_root)).cache_misses for sp in SITES)

    assert benchmark.pedantic(three, rounds=2, iterations=1) == 0


def main() -> None:
    if not SITES:
        raise SystemExit("no torch venv found; set COMPATLAB_BENCH_VENVS")
    with tempfile.TemporaryDirectory(prefix="compatlab-bench-") as tmp:
        root = Path(tmp)
        for sp in SITES:
            t0 = time.perf_counter()
            cold = check_site_packages(sp, archs=ARCHS, cache=ElfCache(root))
            t1 = time.perf_counter()
            warm = check_site_packages(sp, archs=ARCHS, cache=ElfCache(root))
            t2 = time.perf_counter()
            print(
                f"{sp}: {cold.state}, {cold.modules} modules; cold {t1 - t0:.1f} s "
                f"({cold.cache_misses} files read), warm {t2 - t1:.1f} s ({warm.cache_misses} read)"
            )
        t0 = time.perf_counter()
        for sp in SITES:
            check_site_packages(sp, archs=ARCHS, cache=ElfCache(root))
        print(f"{len(SITES)} cells warm, a new ElfCache each: {time.perf_counter() - t0:.1f} s")
        size = subprocess.run(["du", "-sh", str(root)], capture_output=True, text=True, check=False, timeout=60)
        # Cold means an empty lab cache; the OS page cache may still hold the files.
        print(f"cache size: {size.stdout.split()[0] if size.stdout else '?'}")


if __name__ == "__main__":
    main()
