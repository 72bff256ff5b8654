"""How long does the import stage take on a real venv: one process per module, against the fork server?

In one run on one machine: the median of N fresh ``python -c "import torch"`` in the venv, then the import
stage (``compatlab check --stage import``: every distribution with native code) with
COMPATLAB_IMPORT_FORKSERVER=0 (a fresh
interpreter per module, each importing torch again) and with the fork server (one interpreter imports torch,
a child per module), M times each, interleaved. Prints the medians, their ratios to one ``import torch``, and
whether both ways reached the same verdict for every module (they must).

    PYTHONPATH=src python benchmarks/bench_import_stage.py VENV [--imports 5] [--runs 1]

With --fork-only the per-process way is left out. Each run also times the floor: one interpreter of the venv
importing, one after another, the modules the stage loaded (benchmarks/_import_floor.py). Last, where the
CPU of the last fork-server run went, as each fork server told it at its end (the stage's ``cpu``): the
adopting server's own (its imports and its forks, one after another) and its children's (the loads, side by
side), the same for the server that adopts nothing, and the suite's own process; beside it the floor's CPU.

Nothing is written into the venv; the results, the stand-in driver and all bytecode go to a temporary folder.
Bytecode is fair to every side: the stage keeps its own outside the venv (stages/bytecode.py), so its first
run compiles and the runs after it read; ``import torch`` and the floor get a folder of their own the same
way, their first run untimed (compiling), the median of the runs after it. With --runs 2 or more, the
first stage run (cold bytecode) is printed apart and the medians are of the warm runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from compatlab.stages.base import cell_env

REPO_ROOT = Path(__file__).resolve().parents[1]

_WAYS = {"per process": "0", "fork server": "1"}


def _bytecode_env(venv: Path, folder: Path) -> dict[str, str]:
    env = cell_env(venv, {"PYTHONPYCACHEPREFIX": str(folder)})
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def _import_torch(python: Path, venv: Path, bytecode: Path) -> float:
    env = _bytecode_env(venv, bytecode)
    start = time.monotonic()
    done = subprocess.run(
        [str(python), "-c", "import torch"], env=env, capture_output=True, text=True, timeout=600, check=False
    )
    seconds = time.monotonic() - start
    if done.returncode != 0:
        raise SystemExit(f"import torch failed in {venv}: {(done.stderr.strip().splitlines() or ['?'])[-1]}")
    return seconds


def _stage(venv: Path, switch: str, out: Path, cache: Path) -> tuple[float, float, dict[str, Any]]:
    """One import stage: (its own seconds, wall seconds of the whole command, the stage result)."""
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO_ROOT / "src"),
        "PYTHONDONTWRITEBYTECODE": "1",  # the lab's own; the stage's processes keep theirs under *cache*
        "COMPATLAB_IMPORT_FORKSERVER": switch,
        "COMPATLAB_CACHE": str(cache / switch),
    }
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "compatlab", "check", "-q", "--venv", str(venv), "--stage", "import", "--out", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=3600,
        check=False,
    )
    wall = time.monotonic() - start
    results = out / "results.json"
    if done.returncode not in (0, 1) or not results.is_file():  # 1: the stage failed, which is a verdict
        raise SystemExit(f"the import stage did not run: {done.stderr.strip()}")
    [cell] = json.loads(results.read_text(encoding="utf-8"))["cells"]
    stage = cell["stages"][0]
    return float(stage["seconds"]), wall, stage


def _floor(python: Path, venv: Path, stage: dict[str, Any], tmp: Path) -> tuple[float, float]:
    """Seconds for one interpreter to import, one after another, the modules *stage* loaded (bytecode in
    *tmp*/bytecode: the first call compiles it), and the CPU seconds it and what it started used."""
    listed = tmp / "modules.json"
    listed.write_text(json.dumps(stage["details"].get("modules", [])), encoding="utf-8")
    done = subprocess.run(
        [str(python), str(REPO_ROOT / "benchmarks" / "_import_floor.py"), str(listed)],
        env=_bytecode_env(venv, tmp / "bytecode"),
        capture_output=True,
        text=True,
        timeout=3600,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"the floor did not run: {done.stderr.strip()[-500:]}")
    told = json.loads(done.stdout.strip().splitlines()[-1])
    return float(told["all"]), float(told["cpu"])


_KINDS = {"adopting": "the adopting server", "plain": "the one(s) that adopt nothing", "watched": "the watched one(s)"}


def _where_the_cpu_went(details: dict[str, Any], seconds: float) -> str:
    """The last fork-server run's CPU, by process (the stage's ``cpu``, told by each server at its end)."""
    cpu = details.get("cpu") or {}
    parts, total = [], 0.0
    for kind, label in _KINDS.items():
        if kind in cpu:
            told = cpu[kind]
            own, children = told["self_user"] + told["self_system"], told["children_user"] + told["children_system"]
            total += own + children
            parts.append(
                f"{label}: itself {own:.1f} (system {told['self_system']:.1f}; {told.get('forks', 0)} forks "
                f"{told.get('fork_cpu', 0.0):.1f}), its children {children:.1f} (system {told['children_system']:.1f})"
            )
    if "suite" in cpu:
        suite = cpu["suite"]["self_user"] + cpu["suite"]["self_system"]
        total += suite
        parts.append(f"the suite's own process {suite:.1f}")
    if not parts:
        return "where the CPU went: not told (a server that died, or code from before the stage said it)"
    return (
        f"where the CPU went, last run, core-seconds: {'; '.join(parts)}; in all {total:.1f} = "
        f"{total / seconds:.1f} cores over the stage's last {seconds:.1f} s"
    )


def _verdicts(stage: dict[str, Any]) -> dict[str, tuple[bool, str]]:
    return {m["module"]: (m["ok"], m.get("reason", "")) for m in stage["details"].get("modules", [])}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("venv", type=Path, help="a cell's virtual environment, with torch and pytest installed")
    parser.add_argument("--imports", type=int, default=5, help="fresh `import torch` runs (default 5)")
    parser.add_argument("--runs", type=int, default=1, help="import stage runs per way (default 1)")
    parser.add_argument(
        "--fork-only", action="store_true", help="leave out the per-process way (it takes minutes on a big stack)"
    )
    args = parser.parse_args(argv)
    venv: Path = args.venv.absolute()
    python = venv / "bin" / "python"
    ways = {w: v for w, v in _WAYS.items() if not (args.fork_only and w == "per process")}

    stage_s: dict[str, list[float]] = {way: [] for way in ways}
    wall_s: dict[str, list[float]] = {way: [] for way in ways}
    cold: dict[str, float] = {}
    floor_s: list[float] = []
    floor_cpu = 0.0
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="compatlab-bench-import-") as tmp:
        bytecode = Path(tmp) / "bytecode"
        _import_torch(python, venv, bytecode)  # compiles torch's bytecode: untimed
        torch_s = [_import_torch(python, venv, bytecode) for _ in range(args.imports)]
        for run in range(args.runs):
            for way, switch in ways.items():
                seconds, wall, results[way] = _stage(venv, switch, Path(tmp) / f"{switch}-{run}", Path(tmp) / "cache")
                if run == 0 and args.runs > 1:
                    cold[way] = seconds
                    continue
                stage_s[way].append(seconds)
                wall_s[way].append(wall)
            if run == 0:
                _floor(python, venv, results["fork server"], Path(tmp))  # compiles the floor's bytecode: untimed
            floor_wall, floor_cpu = _floor(python, venv, results["fork server"], Path(tmp))
            floor_s.append(floor_wall)
        torch_s += [_import_torch(python, venv, bytecode) for _ in range(args.imports)]  # before and after

    one = statistics.median(torch_s)
    floor = statistics.median(floor_s)
    first = results["per process" if "per process" in ways else "fork server"]
    print(f"venv: {venv}")
    print(
        f"stage: {first['state']}"
        + (f" - {first['reason']}" if first["reason"] else "")
        + f"; {len(_verdicts(first))} modules and packages"
    )
    print(
        f"import torch, fresh interpreter: median {one:.2f} s of {len(torch_s)} "
        f"(min {min(torch_s):.2f}, max {max(torch_s):.2f})"
    )
    print(
        f"floor, one interpreter importing the same modules one after another: median {floor:.2f} s of "
        f"{len(floor_s)} = {floor / one:.1f} x import torch"
    )
    for way, seconds in cold.items():
        print(
            f"import stage, {way + ':':13} first run (its bytecode compiled) {seconds:6.2f} s = "
            f"{seconds / floor:4.1f} x the floor"
        )
    for way in ways:
        med = statistics.median(stage_s[way])
        print(
            f"import stage, {way + ':':13} median {med:6.2f} s of {len(stage_s[way])} = {med / one:5.1f} x import "
            f"torch = {med / floor:4.1f} x the floor (whole command {statistics.median(wall_s[way]):.2f} s); loader: "
            f"{results[way]['details'].get('loader', 'one process per module')}"
        )
    last = results["fork server"]
    print(_where_the_cpu_went(last["details"], float(last["seconds"])) + f"; the floor's, last run: {floor_cpu:.1f}")
    if args.fork_only:
        return 0
    old, new = (statistics.median(stage_s[w]) for w in _WAYS)
    print(f"fork server / per process: {new / old:.2f} ({old / new:.1f} times faster)")
    same = _verdicts(results["per process"]) == _verdicts(results["fork server"])
    print("verdicts: the same for every module" if same else "verdicts DIFFER:")
    if not same:
        for module in sorted(set(_verdicts(first)) | set(_verdicts(results["fork server"]))):
            a, b = _verdicts(first).get(module), _verdicts(results["fork server"]).get(module)
            if a != b:
                print(f"  {module}: per process {a}, fork server {b}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
