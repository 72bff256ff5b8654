"""Subprocesses: argv lists only, a timeout on everything, the whole process group killed.

Standard library only: the in-cell code runs it with the cell's interpreter, and the lab re-exports it
from ``compatlab.proc`` with its own ``which``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shlex
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence

__all__ = ["Completed", "run"]

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Completed:
    """What a finished (or killed) subprocess did."""

    argv: list[str]
    returncode: int
    stdout: str
    stderr: str
    seconds: float
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    @property
    def signal_name(self) -> str | None:
        """Name of the signal that killed the process, if one did."""
        if self.returncode < 0:
            try:
                return signal.Signals(-self.returncode).name
            except ValueError:
                return f"signal {-self.returncode}"
        return None


def _kill_group(proc: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def run(
    argv: Sequence[str],
    *,
    timeout: float,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    input_text: str | None = None,
    pass_fds: Sequence[int] = (),
) -> Completed:
    """Run *argv* in its own process group; on timeout kill the whole group.

    Never raises for a non-zero exit: the caller classifies the result. *pass_fds* stay open in the child
    (a pipe it reports progress on).
    """
    args = [os.fspath(a) for a in argv]
    log.info("$ %s", shlex.join(args))
    start = time.monotonic()
    proc = subprocess.Popen(
        args,
        stdin=subprocess.PIPE if input_text is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
        env=dict(env) if env is not None else None,
        cwd=cwd,
        start_new_session=True,
        pass_fds=tuple(pass_fds),
    )
    timed_out = False
    try:
        out, err = proc.communicate(input=input_text, timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_group(proc)
        out, err = proc.communicate()
    except BaseException:  # Ctrl-C, SIGTERM, a stage's deadline: the group goes, its pipes are closed
        _kill_group(proc)
        proc.wait()
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()
        raise
    else:
        # Children the process left behind in its group go with it.
        _kill_group(proc)
    return Completed(
        argv=args,
        returncode=proc.returncode,
        stdout=out or "",
        stderr=err or "",
        seconds=time.monotonic() - start,
        timed_out=timed_out,
    )
