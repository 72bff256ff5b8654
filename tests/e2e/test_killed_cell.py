"""A check killed outright (``kill -9``, what the OOM killer does) leaves nothing running (issue 33): its
pytest dies with it (the parent-death signal the incell plugin sets), and the fork server, reading EOF,
takes the load it was running down."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fixtures.labutil import ROOT
from fixtures.wheels import build_wheel, venv_with

pytestmark = pytest.mark.slow


def _processes_naming(marker: str) -> list[str]:
    """The command lines of live processes that name *marker* (zombies left out)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmd = fh.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{pid}/stat", encoding="utf-8") as fh:
                state = fh.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker in cmd and state != "Z":
            found.append(f"{pid}: {cmd}")
    return found


def test_a_check_killed_mid_import_leaves_no_process(tmp_path: Path) -> None:
    wheel = build_wheel(
        tmp_path / "wheels", "slowpkg", "1.0", files={"slowpkg/__init__.py": "import time\ntime.sleep(120)\n"}
    )
    env = tmp_path / "env"
    venv_with(env, [wheel])
    argv = [sys.executable, "-m", "compatlab", "check", "--venv", str(env), "--out", str(tmp_path / "out")]
    argv += ["--package", "slowpkg", "--stage", "import", "-q"]
    check = subprocess.Popen(
        argv,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src"), "COMPATLAB_CACHE": str(tmp_path / "cache")},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 90
        # The fork server is up: pytest runs the import suite (the check's own command line names the env too).
        while not any("compatlab.incell.forkserver" in p for p in _processes_naming(str(env))):
            assert check.poll() is None, "the check ended before its import stage began"
            assert time.monotonic() < deadline, "the import stage never started"
            time.sleep(0.2)
        time.sleep(1.0)  # the load of slowpkg is under way
        assert any("runpytest" in p for p in _processes_naming(str(env))), "the suite's pytest is not running"
        os.kill(check.pid, signal.SIGKILL)
        check.wait(timeout=10)
        deadline = time.monotonic() + 15
        while _processes_naming(str(env)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _processes_naming(str(env)) == []
    finally:
        if check.poll() is None:
            os.killpg(check.pid, signal.SIGKILL)
