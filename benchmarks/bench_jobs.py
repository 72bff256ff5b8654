"""Cells side by side: one matrix with ``-j 1`` and ``-j N`` on the same warm venvs, in one run.

    python benchmarks/bench_jobs.py [--matrix matrix.toml] [--jobs 2] [--rounds 1] [-- extra cell posargs]

First one unmeasured ``nox -s matrix`` warms the uv cache and the cells' venvs (and the lab's own venv). Then,
``--rounds`` times, ``-j 1`` and ``-j N`` alternately, each into its own reports folder and all on the same venvs.
For each: the run's wall time, the CPU time of everything it started (user + system of the child processes),
every stage's wall time summed over the cells, and the verdict of every cell. Prints the medians, the ratio
``-j 1 / -j N``, and whether both gave the same verdict to every cell (they must). Needs the package index, or
a warm uv cache.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _nox(matrix: Path, work: Path, reports: Path, jobs: int, posargs: list[str]) -> dict[str, Any]:
    env = {
        **os.environ,
        "COMPATLAB_MATRIX": str(matrix),
        "COMPATLAB_REPORTS": str(reports),
        "COMPATLAB_VENVS": str(work / "venvs"),
        "COMPATLAB_LAB_VENV": str(work / "lab"),
        "UV_PYTHON_DOWNLOADS": "never",
    }
    env.pop("COMPATLAB_RUN_ID", None)
    argv = [sys.executable, "-m", "nox", "-f", str(ROOT / "noxfile.py"), "-s", "matrix", "--", "-q", "-j", str(jobs)]
    argv += posargs
    cpu0, start = _cpu(), time.monotonic()
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=7200, check=False)
    wall, cpu = time.monotonic() - start, _cpu() - cpu0
    runs = sorted((reports / "runs").glob("*/results.json"), key=lambda p: p.stat().st_mtime)
    if not runs:
        raise SystemExit(f"no results (exit {done.returncode}): {done.stdout[-2000:]}{done.stderr[-2000:]}")
    cells = [c for c in json.loads(runs[-1].read_text(encoding="utf-8"))["cells"] if c["state"] != "n/a"]
    stages: dict[str, float] = defaultdict(float)
    for cell in cells:
        for stage in cell.get("stages", []):
            stages[stage["name"]] += float(stage.get("seconds") or 0)
    return {
        "wall": wall,
        "cpu": cpu,
        "stages": dict(stages),
        "verdicts": {c["id"]: c["state"] for c in cells},
        "exit": done.returncode,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--matrix", type=Path, default=ROOT / "matrix.toml")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--work", type=Path, help="venvs and reports here (default: a temporary folder)")
    parser.add_argument("posargs", nargs="*", help="after --: a cell's posargs (--until static …)")
    args = parser.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="compatlab-bench-jobs-"))
    matrix = args.matrix.resolve()
    print(f"matrix {matrix}, -j 1 against -j {args.jobs}, {args.rounds} round(s); work in {work}", flush=True)
    warm = _nox(matrix, work, work / "reports-warm", 1, args.posargs)
    print(f"warm-up run: {warm['wall']:.0f} s, {len(warm['verdicts'])} live cells", flush=True)
    results: dict[int, list[dict[str, Any]]] = {1: [], args.jobs: []}
    for r in range(args.rounds):
        for jobs in (1, args.jobs) if r % 2 == 0 else (args.jobs, 1):
            got = _nox(matrix, work, work / f"reports-j{jobs}-{r}", jobs, args.posargs)
            results[jobs].append(got)
            print(f"  round {r + 1}, -j {jobs}: {got['wall']:.1f} s wall, {got['cpu']:.1f} s CPU", flush=True)
    one, many = results[1], results[args.jobs]
    names = sorted({s for run in one + many for s in run["stages"]}, key=lambda s: -one[0]["stages"].get(s, 0))
    print(f"\n| | -j 1 | -j {args.jobs} | ratio |")
    print("| --- | ---: | ---: | ---: |")
    for label, key in (("run wall (s)", "wall"), ("CPU of everything it ran (s)", "cpu")):
        a, b = statistics.median(x[key] for x in one), statistics.median(x[key] for x in many)
        print(f"| {label} | {a:.1f} | {b:.1f} | {a / b:.2f} |")
    for name in names:
        a = statistics.median(x["stages"].get(name, 0.0) for x in one)
        b = statistics.median(x["stages"].get(name, 0.0) for x in many)
        print(f"| {name}: wall summed over the cells (s) | {a:.1f} | {b:.1f} | {a / b if b else 0:.2f} |")
    same = all(run["verdicts"] == one[0]["verdicts"] for run in one + many)
    print(f"\nverdicts identical in every run: {'yes' if same else 'NO'} ({one[0]['verdicts']})")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
