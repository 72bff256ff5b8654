"""A cell killed outright takes its servers along (issue 33, class 1, for the serve, perf and NCCL stages): the
server runs in a process group of its own, which the kernel does not end with its parent, so it is started
through compatlab.incell.tether. Here a real lab process starts one (ServerProcess, as the serve stage does) and
is SIGKILLed; within seconds nothing of the server's group is left."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from compatlab.stages.sglang.server import group_members

TESTS = Path(__file__).resolve().parents[1]
SRC = TESTS.parent / "src"


def test_a_killed_lab_process_leaves_no_server(tmp_path: Path) -> None:
    parent = subprocess.Popen(
        [sys.executable, "-m", "fixtures.server_parent", str(tmp_path / "server.log")],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": f"{TESTS}{os.pathsep}{SRC}"},
    )
    assert parent.stdout is not None
    group = int(parent.stdout.readline())
    deadline = time.monotonic() + 10
    while len(group_members(group)) < 2 and time.monotonic() < deadline:  # sh and its sleep (and the tether)
        time.sleep(0.1)
    assert len(group_members(group)) >= 2, group_members(group)
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait(timeout=10)
    parent.stdout.close()
    deadline = time.monotonic() + 20
    while group_members(group) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert group_members(group) == []
