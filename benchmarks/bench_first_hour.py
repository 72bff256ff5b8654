"""What a new user's `nox -s matrix` costs outside the stages, before and after, on one machine and uv cache.

    python benchmarks/bench_first_hour.py --before e2b0207 [--matrix matrix.toml] [--preflight]

For each tree (``--before``, a commit exported with ``git archive`` into a temporary folder, and this tree):

1. n/a overhead: the matrix's n/a cells only, their nox sessions named one by one
   (``nox -s 'matrix(<id>)' …``), run twice (the first makes the lab's venv); of the second, the wall time
   and the sum of nox's own per-session durations (``nox --report``).
2. with ``--preflight``: ``nox -s matrix -- --until static`` (install, pins and static of every live cell)
   twice in a row with one venvs folder, so that the second run finds the first's venvs, as a warm nightly
   run does; of the second: the wall time, each cell's seconds (median), and what each cell spent outside
   its stages (its seconds minus its stages'). The first run of the first tree also fills the uv cache.

Prints every figure measured; nothing is estimated. Needs the package index (or a warm uv cache) for 2.
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
sys.path.insert(0, str(ROOT / "src"))


def _env(matrix: Path, work: Path) -> dict[str, str]:
    env = {
        **os.environ,
        "COMPATLAB_MATRIX": str(matrix),
        "COMPATLAB_REPORTS": str(work / "reports"),
        "COMPATLAB_VENVS": str(work / "venvs"),
        "COMPATLAB_LAB_VENV": str(work / "lab"),
        "UV_PYTHON_DOWNLOADS": "never",
        "COMPATLAB_REPORT": "0",
        "NO_COLOR": "1",
    }
    env.pop("COMPATLAB_RUN_ID", None)
    return env


def _nox(tree: Path, matrix: Path, work: Path, *args: str, timeout: float) -> tuple[float, str, Path]:
    work.mkdir(parents=True, exist_ok=True)
    report = work / f"nox-report-{time.monotonic_ns()}.json"
    argv = [sys.executable, "-m", "nox", "-f", str(tree / "noxfile.py"), "--report", str(report), *args]
    start = time.monotonic()
    done = subprocess.run(
        argv,
        cwd=tree,
        env=_env(matrix, work),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
        check=False,
    )
    return time.monotonic() - start, done.stdout, report


def na_overhead(tree: Path, matrix: Path, work: Path, na_ids: list[str]) -> tuple[float, float]:
    sessions = [f"matrix({cid})" for cid in na_ids]
    for _ in range(2):
        wall, _out, report = _nox(tree, matrix, work, "-s", *sessions, timeout=1800)
    summed = sum(
        float(s["duration"])
        for s in json.loads(report.read_text(encoding="utf-8"))["sessions"]
        if s["name"] == "matrix"
    )
    return wall, summed


def preflight(tree: Path, matrix: Path, work: Path) -> tuple[dict[str, object], list[str]]:
    """The figures of the second run, and its first 30 lines of output."""
    figures: dict[str, object] = {}
    head: list[str] = []
    for attempt in ("first", "second"):
        wall, out, _report = _nox(tree, matrix, work, "-s", "matrix", "--", "--until", "static", timeout=7200)
        figures[f"{attempt}_wall_s"] = round(wall, 1)
        head = out.splitlines()[:30]
    runs = sorted((work / "reports" / "runs").glob("*/results.json"), key=lambda p: p.stat().st_mtime)
    cells = [c for c in json.loads(runs[-1].read_text(encoding="utf-8"))["cells"] if c["state"] != "n/a"]
    seconds = [float(c["seconds"]) for c in cells]
    outside = [float(c["seconds"]) - sum(float(s["seconds"]) for s in c["stages"]) for c in cells]
    figures.update(
        cells=len(cells),
        cell_median_s=round(statistics.median(seconds), 1),
        outside_median_s=round(statistics.median(outside), 1),
        outside_total_s=round(sum(outside), 1),
        states={c["id"]: c["state"] for c in cells},
    )
    return figures, head


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default="e2b0207", help="the commit to compare with")
    parser.add_argument("--matrix", type=Path, default=ROOT / "matrix.toml")
    parser.add_argument("--preflight", action="store_true", help="also the --until static runs (installs)")
    args = parser.parse_args()
    from compatlab.cells import expand
    from compatlab.config.matrix import load_matrix

    matrix = args.matrix.resolve()
    na_ids = [c.id for c in expand(load_matrix(matrix)) if c.na is not None]
    scratch = Path(tempfile.mkdtemp(prefix="compatlab-bench-"))
    before = scratch / "before"
    before.mkdir()
    # An export, not a worktree: nothing is added to the repository's shared metadata.
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", args.before], check=True, capture_output=True, timeout=120
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(before)], input=archive, check=True, timeout=120)
    try:
        for name, tree in (("before", before), ("after", ROOT)):
            work = scratch / f"work-{name}"
            wall, summed = na_overhead(tree, matrix, work, na_ids)
            print(
                f"{name}: {len(na_ids)} n/a cells: wall {wall:.1f} s, nox sessions {summed:.2f} s in all, "
                f"{summed / len(na_ids) * 1000:.1f} ms each",
                flush=True,
            )
            if args.preflight:
                figures, head = preflight(tree, matrix, work)
                print(f"{name}: preflight --until static: {json.dumps(figures)}", flush=True)
                print(f"{name}: the second run's first 30 lines:", *(f"  | {line}" for line in head), sep="\n")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
