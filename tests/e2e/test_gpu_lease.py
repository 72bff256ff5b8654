"""GPU leases between real processes (issue 35): cells side by side never share a GPU. Six lab processes take
leases of 1, 2 and 4 of 4 stand-in GPUs at once (``total=4``: the count ``$COMPATLAB_GPUS`` gives a machine
without nvidia-smi); the leases' log shows, per GPU, no two holders at one time, and that holders of different
GPUs did run at the same time. A holder killed with SIGKILL gives its GPUs back, and a waiter says who holds them."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
SRC = TESTS.parent / "src"


def _worker(folder: Path, name: str, *counts: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": f"{TESTS}{os.pathsep}{SRC}"}
    return subprocess.Popen(
        [sys.executable, "-m", "fixtures.lease_worker", str(folder), "4", name, *counts],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )


def test_side_by_side_leases_never_share_a_gpu(tmp_path: Path) -> None:
    workers = [_worker(tmp_path, f"cell{i}", "1", "2", "4", "1") for i in range(6)]
    outs = [w.communicate(timeout=120)[0] for w in workers]
    assert [w.returncode for w in workers] == [0] * 6, outs
    records = [json.loads(line) for line in (tmp_path / "leases.jsonl").read_text().splitlines()]
    assert len(records) == 24
    assert sorted(len(r["gpus"]) for r in records) == sorted([1, 2, 4, 1] * 6)
    per_gpu: dict[int, list[tuple[float, float, str]]] = {}
    for r in records:
        assert len(set(r["gpus"])) == len(r["gpus"])
        assert all(0 <= g < 4 for g in r["gpus"])
        for g in r["gpus"]:
            per_gpu.setdefault(g, []).append((r["start"], r["end"], r["holder"]))
    for g, spans in per_gpu.items():
        spans.sort()
        for (_s0, e0, h0), (s1, _e1, h1) in itertools.pairwise(spans):
            assert e0 <= s1, f"GPU {g}: {h0} until {e0}, {h1} from {s1}"
    # Side by side, not one after another: some two leases of different GPUs overlapped in time.
    overlapped = any(
        a["start"] < b["end"] and b["start"] < a["end"] and not set(a["gpus"]) & set(b["gpus"])
        for i, a in enumerate(records)
        for b in records[i + 1 :]
    )
    assert overlapped


def test_a_killed_holder_gives_its_gpus_back_and_a_waiter_says_who_held_them(tmp_path: Path) -> None:
    holder = _worker(tmp_path, "cellA serve", "hold")
    assert holder.stdout is not None
    assert holder.stdout.readline().startswith("got 0,1,2,3")
    assert holder.stdout.readline().strip() == "held"
    waiter = _worker(tmp_path, "cellB cuda", "1")
    time.sleep(1.5)
    assert waiter.poll() is None  # still waiting: every GPU is held
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait(timeout=30)
    holder.stdout.close()
    out = waiter.communicate(timeout=60)[0]
    assert waiter.returncode == 0, out
    said = [line for line in out.splitlines() if line.startswith("say: ")]
    assert said, out
    assert said[0].startswith("say: waiting for 1 of 4 GPUs (0 s): held by cellA serve #0 (pid ")
    assert "got 0" in out
