"""Whole-matrix wall time, before and after, in one run; and a static-only preflight over 30 cells.

    python benchmarks/bench_matrix.py --before 8f55f23 [--matrix examples/pinned-2026-01.toml]

For each checkout (``--before`` a commit, checked out into a temporary worktree, and this tree) it runs
``nox -s matrix`` on the same matrix with the same uv cache, twice in a row: the first run warms the
cache for that code, the second is the figure. Then the preflight: a matrix of 30 live cells (the pinned
matrix times five versions of ``six``, a small extra package axis) with ``-- --until static``, warm,
seconds per cell. Prints every figure and the ratios. Needs the package index (or a warm uv cache).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SIX = ["1.13.0", "1.14.0", "1.15.0", "1.16.0", "1.17.0"]


def _nox(tree: Path, matrix: Path, work: Path, *posargs: str) -> tuple[float, list[dict[str, object]]]:
    env = {
        **os.environ,
        "COMPATLAB_MATRIX": str(matrix),
        "COMPATLAB_REPORTS": str(work / "reports"),
        "COMPATLAB_VENVS": str(work / "venvs"),
        "COMPATLAB_LAB_VENV": str(work / "lab"),
        "UV_PYTHON_DOWNLOADS": "never",
        "COMPATLAB_REPORT": "0",
    }
    env.pop("COMPATLAB_RUN_ID", None)
    argv = [sys.executable, "-m", "nox", "-f", str(tree / "noxfile.py"), "-s", "matrix"]
    if posargs:
        argv += ["--", *posargs]
    start = time.monotonic()
    done = subprocess.run(argv, cwd=tree, env=env, capture_output=True, text=True, timeout=7200, check=False)
    wall = time.monotonic() - start
    runs = sorted((work / "reports" / "runs").glob("*/results.json"), key=lambda p: p.stat().st_mtime)
    if not runs:
        raise SystemExit(f"no results from {tree}: {done.stdout[-2000:]}{done.stderr[-2000:]}")
    cells = json.loads(runs[-1].read_text(encoding="utf-8"))["cells"]
    return wall, cells


def _verdicts(cells: list[dict[str, object]]) -> dict[str, str]:
    return {str(c["id"]): str(c["state"]) for c in cells}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default="8f55f23", help="the commit to compare with")
    parser.add_argument("--matrix", type=Path, default=ROOT / "examples" / "pinned-2026-01.toml")
    parser.add_argument("--skip-preflight", action="store_true")
    args = parser.parse_args()
    matrix = args.matrix.resolve()
    scratch = Path(tempfile.mkdtemp(prefix="compatlab-bench-"))
    before = scratch / "before"
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(before), args.before],
        check=True,
        capture_output=True,
    )
    try:
        figures: dict[str, float] = {}
        verdicts = {}
        for name, tree in (("before", before), ("after", ROOT)):
            work = scratch / name
            _nox(tree, matrix, work)  # warms this code's venvs and the uv cache
            wall, cells = _nox(tree, matrix, work)
            live = [c for c in cells if c["state"] != "n/a"]
            figures[name] = wall
            verdicts[name] = _verdicts(cells)
            per = [float(c["seconds"]) for c in live]  # type: ignore[arg-type]
            print(
                f"{name:>6} ({tree if name == 'after' else args.before}): whole matrix warm {wall:.1f} s, "
                f"{len(live)} live cells, median {statistics.median(per):.1f} s a cell"
            )
        print(
            f"ratio after/before: {figures['after'] / figures['before']:.2f} "
            f"(target <= 0.33); same verdicts: {verdicts['before'] == verdicts['after']}"
        )
        if not args.skip_preflight:
            wide = scratch / "wide.toml"
            text = matrix.read_text(encoding="utf-8")
            six = "\n".join(f'[[axes.six]]\npackage = "six"\nversion = "{v}"' for v in SIX)
            wide.write_text(text.replace("[[axes.cuda]]", six + "\n\n[[axes.cuda]]", 1), encoding="utf-8")
            work = scratch / "preflight"
            _nox(ROOT, wide, work, "--until", "static", "-q")
            wall, cells = _nox(ROOT, wide, work, "--until", "static", "-q")
            live = [c for c in cells if c["state"] != "n/a"]
            per = [float(c["seconds"]) for c in live]  # type: ignore[arg-type]
            print(
                f"preflight --until static, warm: {len(live)} live cells in {wall:.1f} s = "
                f"{wall / len(live):.2f} s a cell (median cell {statistics.median(per):.2f} s; target <= 5 s)"
            )
    finally:
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(before)], check=False, capture_output=True
        )
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
