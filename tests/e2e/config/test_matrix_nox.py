"""`nox -l` over a matrix file: a matrix over max-cells is refused before nox lists anything."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def _big(sizes: dict[str, int]) -> str:
    return "".join(f'[[axes.{axis}]]\nversion = "{i + 1}.0"\n' for axis, n in sizes.items() for i in range(n))


def test_nox_lists_nothing_and_returns_at_once_for_a_huge_matrix(tmp_path: Path) -> None:
    path = tmp_path / "huge.toml"
    path.write_text(_big({"torch": 60, "sgl-kernel": 40, "flashinfer": 30, "cuda": 6}))
    done = subprocess.run(
        [sys.executable, "-m", "nox", "-f", str(ROOT / "noxfile.py"), "-l"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "COMPATLAB_MATRIX": str(path)},
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.endswith(
        f"error: {path}: axes: 432,000 cells (torch 60 × sgl-kernel 40 × flashinfer 30 × "
        "cuda 6), more than max-cells = 2,000; drop values from an axis, or raise "
        "max-cells (a top-level key) if that many are meant\n"
    )
