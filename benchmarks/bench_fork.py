"""What one child of the import stage's fork server costs before it loads anything: the fork tax.

The import stage forks a child per load from a server that has imported torch and, as the stage goes on, the
packages it adopted. Forking copies the server's page tables and the child's exit tears them down, so a
child's cost grows with what the server holds. This prints that cost for a server of the venv's interpreter
that imported the modules given (``--imports``, comma-separated; default torch), in one run:

    PYTHONPATH=src python benchmarks/bench_fork.py VENV [--imports torch,sglang,transformers] [--forks 30]

Each child ends as the stage's children do (fork/child.py's ExitGuard: the C library's exit, the inherited
handlers dropped). Two servers, one after the other: one whose memory is in 4 KiB pages, as it was before,
and one whose memory is in 2 MiB pages where the kernel could, as the stage's servers keep it now
(fork/pages.py). Printed for each: the server's resident memory and mappings, the medians of
fork-to-parent-return, fork-to-child-running and fork-to-reaped, the children's CPU per child, and that cost
times ``--loads`` (the loads of a stage, default 883: sglang 0.5.23's environment on 2 cores), to hold
against the stage's floor; then the ratio of the two.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]

_CHILD = r"""
import gc, importlib, json, os, resource, statistics, sys, time
from compatlab.incell.fork.child import ExitGuard
for name in [m for m in sys.argv[1].split(",") if m]:
    importlib.import_module(name)
gc.freeze()  # as the server does: what the imports made is shared with the children
huge = 0
if sys.argv[3] == "2m":  # as the server does too: its memory in 2 MiB pages (fork/pages.py)
    from compatlab.incell.fork.pages import Collapser
    pages = Collapser()
    pages.collapse()
    huge = pages.done
forks = int(sys.argv[2])
read, write = os.pipe()
returned, running, reaped = [], [], []
for _ in range(forks):
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:
        guard = ExitGuard()
        os.write(write, repr(time.monotonic()).encode().ljust(32))
        guard.exit(0)
    returned.append(time.monotonic() - start)
    running.append(float(os.read(read, 32)) - start)
    os.waitpid(pid, 0)
    reaped.append(time.monotonic() - start)
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
with open("/proc/self/statm") as f:
    rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
with open("/proc/self/maps") as f:
    maps = sum(1 for _ in f)
print(json.dumps({
    "rss_mib": rss / 2**20, "maps": maps, "huge_mib": huge / 2**20,
    "returned_ms": statistics.median(returned) * 1e3,
    "running_ms": statistics.median(running) * 1e3,
    "reaped_ms": statistics.median(reaped) * 1e3,
    "child_cpu_ms": (usage.ru_utime + usage.ru_stime) / forks * 1e3,
}))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("venv", type=Path, help="a virtual environment with the modules to import")
    parser.add_argument("--imports", default="torch", help="modules the server imports first (default torch)")
    parser.add_argument("--forks", type=int, default=30, help="children to time (default 30)")
    parser.add_argument("--loads", type=int, default=883, help="loads of a stage, for the total (default 883)")
    args = parser.parse_args()
    python = args.venv / "bin" / "python"
    if not python.is_file():
        raise SystemExit(f"{python}: no interpreter there")
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT / "src")}
    reaped = {}
    for pages, said in (("4k", "in 4 KiB pages"), ("2m", "in 2 MiB pages where the kernel could (MADV_COLLAPSE)")):
        done = subprocess.run(
            [str(python), "-c", _CHILD, args.imports, str(args.forks), pages],
            capture_output=True,
            text=True,
            env=env,
            timeout=900,
            check=False,
        )
        if done.returncode != 0:
            raise SystemExit(f"the server failed: {(done.stderr.strip().splitlines() or ['?'])[-1]}")
        got = json.loads(done.stdout.strip().splitlines()[-1])
        print(
            f"server {said}: {args.imports} imported; {got['rss_mib']:.0f} MiB resident "
            f"({got['huge_mib']:.0f} MiB of it in 2 MiB pages), {got['maps']} mappings"
        )
        print(
            f"  one child, medians of {args.forks}: the fork returns in {got['returned_ms']:.1f} ms, the child runs "
            f"after {got['running_ms']:.1f} ms, it is reaped after {got['reaped_ms']:.1f} ms; "
            f"its CPU {got['child_cpu_ms']:.1f} ms"
        )
        total = got["reaped_ms"] * args.loads / 1e3
        print(f"  {args.loads} loads: {total:.1f} s of children's lives before any of them loads anything")
        reaped[pages] = got["reaped_ms"]
    print(f"2 MiB pages / 4 KiB pages, fork to reaped: {reaped['2m'] / reaped['4k']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
