"""Run a program tethered to the lab process that started it: when that process dies, ``kill -9`` included,
the program's whole process group goes too.

    python -E -s -B -u -m compatlab.incell.tether PARENT_PID CWD -- PROGRAM ARGS...

An SGLang server or an NCCL rank runs in a process group of its own (so that a time-out can kill all it
started), which the kernel does not end with its parent: a cell killed outright (the OOM killer, ``kill -9``)
would leave a server holding the GPU's memory. ``PR_SET_PDEATHSIG`` ends a child with the *thread* that
forked it, which is not the lab process's life when a stage starts servers from a thread. So this program
stays between the two: it starts PROGRAM in its own group (it leads it), watches its parent's pid every
half second, and when the parent is gone sends the group SIGTERM, then SIGKILL after a grace. Otherwise it
waits for PROGRAM and ends as PROGRAM did (its status, or the same signal); a signal sent to it goes to
PROGRAM. Standard library only: it runs with any interpreter.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

_POLL = 0.5
_GRACE = 10.0


def _parent_alive(parent: int) -> bool:
    return os.getppid() == parent


def _end_group(pgid: int, proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGTERM)
    end = time.monotonic() + _GRACE
    while time.monotonic() < end and proc.poll() is None:
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[2] != "--" or not argv[0].isdigit():
        print("usage: python -m compatlab.incell.tether PARENT_PID CWD -- PROGRAM ARGS...", file=sys.stderr)
        return 2
    parent, cwd, program = int(argv[0]), argv[1], argv[3:]
    if not _parent_alive(parent):
        return 128 + signal.SIGTERM  # the lab died before this started: start nothing
    # This process leads the group its starter made (start_new_session); PROGRAM joins it, so that killing
    # the group from outside (the lab's stop) and from here (the parent died) both reach all of it.
    pgid = os.getpgid(0)
    try:
        proc = subprocess.Popen(program, cwd=cwd)
    except OSError as exc:
        print(f"tether: {program[0]}: {exc.strerror or exc}", file=sys.stderr)
        return 127
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, lambda s, _f: proc.send_signal(s))
    while proc.poll() is None:
        if not _parent_alive(parent):
            _end_group(pgid, proc)
            break
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=_POLL)
    code = proc.wait()
    if code < 0:  # died on a signal: so does this process, and its starter sees what it would have seen
        with contextlib.suppress(OSError, ValueError):  # SIGKILL and SIGSTOP have no handler to reset
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        return 128 - code
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
