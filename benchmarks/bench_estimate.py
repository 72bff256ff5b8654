"""How good the run's estimate is: the same `nox -s matrix` run several times in a row on one machine.

    python benchmarks/bench_estimate.py [--matrix matrix.toml] [--runs 3] [--until static] [-k EXPR]

Each run shares one reports folder and one venvs folder (a warm nightly run: the second finds the first's
venvs). From the second run on, the start line gives the estimate (plan.Plan.start_line: a range over the
earlier runs, for the stages that will run); the run's cells' seconds (results.json) and its wall time are
measured, and whether they fall inside the range is printed. Nothing is estimated here but by the lab.
Needs the package index or a warm uv cache.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_SPAN = re.compile(r"cells? \(?[^,]*?(?:, (?:about (?P<one>[^a]+?)|(?P<lo>.+?) to (?P<hi>.+?)) as in)")


def seconds_of(words: str) -> float:
    """``9 min 24 s`` / ``45 s`` / ``1 h 05 min`` -> seconds."""
    total = 0.0
    for amount, unit in re.findall(r"(\d+) (h|min|s)\b", words):
        total += int(amount) * {"h": 3600, "min": 60, "s": 1}[unit]
    return total


def estimate(stderr: str) -> tuple[float, float] | None:
    line = next((ln for ln in stderr.splitlines() if ln.startswith("[compatlab] run ")), "")
    m = _SPAN.search(line)
    if m is None:
        return None
    if m.group("one"):
        one = seconds_of(m.group("one"))
        return one, one
    return seconds_of(m.group("lo")), seconds_of(m.group("hi"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--matrix", type=Path, default=ROOT / "matrix.toml")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--until", default="static", help="a preflight's last stage; '' for the whole pipeline")
    parser.add_argument("-k", dest="keyword", default="")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="compatlab-bench-estimate-"))
    env = {
        **os.environ,
        "COMPATLAB_MATRIX": str(args.matrix.resolve()),
        "COMPATLAB_REPORTS": str(work / "reports"),
        "COMPATLAB_VENVS": str(work / "venvs"),
        "UV_PYTHON_DOWNLOADS": os.environ.get("UV_PYTHON_DOWNLOADS", "never"),
    }
    argv = [sys.executable, "-m", "nox", "-f", str(ROOT / "noxfile.py"), "-s", "matrix"]
    argv += ["-k", args.keyword] if args.keyword else []
    argv += ["--", "--until", args.until] if args.until else []
    print(f"work folder {work}; {' '.join(argv[2:])}")
    print("run  estimate (s)        cells' seconds  wall (s)  inside")
    for i in range(1, args.runs + 1):
        run_id = f"bench{i}"
        t0 = time.monotonic()
        done = subprocess.run(
            argv, env={**env, "COMPATLAB_RUN_ID": run_id}, capture_output=True, text=True, check=False
        )
        wall = time.monotonic() - t0
        results = json.loads((work / "reports" / "runs" / run_id / "results.json").read_text(encoding="utf-8"))
        cells = sum(c.get("seconds", 0.0) for c in results["cells"] if c["state"] != "n/a")
        span = estimate(done.stderr)
        said = "none" if span is None else f"{span[0]:.0f}-{span[1]:.0f}"
        # The words are whole seconds: a second either side is the rounding, not a miss.
        inside = "-" if span is None else ("yes" if span[0] - 1 <= cells <= span[1] + 1 else "no")
        print(f"{i:<4} {said:<19} {cells:<15.1f} {wall:<9.1f} {inside}  (exit {done.returncode})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
