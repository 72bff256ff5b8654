"""`nox -l` on the default matrix reads matrix.lock and never asks an index: it must answer within 2 s.

Each run is a fresh `python -m nox -l` process (the noxfile imports the lab, loads matrix.toml and its
lock, expands the cells), with the network made unusable (a proxy on a closed loopback port), so that a
query slipping into the import path shows as a failure or a timeout rather than a fast answer.

    PYTHONPATH=src python benchmarks/bench_nox_list.py            # prints figures, median of 5; exit 1 over 2 s
    PYTHONPATH=src python -m pytest benchmarks/bench_nox_list.py  # the same under pytest-benchmark
"""

from __future__ import annotations

import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 2.0
RUNS = 5


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def nox_list() -> float:
    """Seconds for one `nox -l` of the default matrix, offline; raises when it fails."""
    proxy = f"http://127.0.0.1:{_closed_port()}"
    env = {k: v for k, v in os.environ.items() if k != "COMPATLAB_MATRIX"}
    env.update({"HTTP_PROXY": proxy, "HTTPS_PROXY": proxy, "http_proxy": proxy, "https_proxy": proxy, "NO_COLOR": "1"})
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "nox", "-f", str(ROOT / "noxfile.py"), "-l"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    seconds = time.perf_counter() - start
    if done.returncode != 0 or "matrix(" not in done.stdout:
        raise RuntimeError(f"nox -l failed (exit {done.returncode}): {done.stderr.strip()}")
    return seconds


def test_nox_list_within_two_seconds(benchmark: Any) -> None:
    seconds = benchmark.pedantic(nox_list, rounds=RUNS, iterations=1)
    assert seconds < LIMIT


def main() -> int:
    times = [nox_list() for _ in range(RUNS)]
    median = statistics.median(times)
    print(
        f"nox -l, default matrix ({ROOT / 'matrix.toml'}): median {median:.2f} s, min {min(times):.2f} s, "
        f"max {max(times):.2f} s over {RUNS} runs (limit {LIMIT:.0f} s)"
    )
    return 0 if median < LIMIT else 1


if __name__ == "__main__":
    sys.exit(main())
