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
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

__all__ = ["Completed", "InCellCommand", "bytecode_prefix", "held_while_starting", "module_command", "run"]

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
    pid: int | None = None  # the process's id, where a caller needs it (a fork server's child: its log lines)

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


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class InCellCommand:
    """A module of ``compatlab.incell`` as a command: run *argv* with *cwd* as its working directory."""

    argv: list[str]
    cwd: str


# The folder this compatlab.incell was imported from: in a cell, the lab's copy of the package (proc.py's
# ``incell_path``), which holds nothing else of the lab.
HERE = str(Path(__file__).resolve().parents[2])


def bytecode_prefix() -> str | None:
    """The folder this process keeps its bytecode in (``PYTHONPYCACHEPREFIX``, set by the lab for a suite:
    stages/bytecode.py), for the processes it starts; None where it writes none."""
    return None if sys.dont_write_bytecode else sys.pycache_prefix


def module_command(
    python: str | os.PathLike[str],
    module: str,
    *args: str,
    root: str | os.PathLike[str],
    bytecode: str | None = None,
) -> InCellCommand:
    """The one way a program of ``compatlab.incell`` runs in a cell: ``python -E -s -B -u -m
    compatlab.incell.<module> ARGS`` in the folder *root*, which holds ``compatlab/incell`` and nothing else of
    the lab (the lab passes ``proc.incell_path()``; code already in a cell passes ``HERE``).

    The interpreter sees the standard library, its own site-packages and *root*, nothing else:

    - ``-E`` ignores every PYTHON* variable: the user's PYTHONPATH and PYTHONHOME, and PYTHONSAFEPATH too, so
      ``-m`` puts the working directory, *root*, first on ``sys.path``, on Python 3.10 to 3.14 alike. ``-I``
      would also imply ``-P`` on 3.11+ (no working directory on ``sys.path``: *root* could not be found), and
      3.10 has no ``-P``; putting *root* on PYTHONPATH instead would need the variables ``-E`` drops.
    - ``-s``: no user site directory (``-E`` ignores PYTHONNOUSERSITE). ``-E -s`` is ``-I`` without ``-P``.
    - ``-B``: no bytecode written: an existing environment (``compatlab check``) is read, never changed. With
      *bytecode* (code in a suite passes ``bytecode_prefix()``), ``-X pycache_prefix=BYTECODE`` instead: it
      is written to that folder of the lab's, outside the environment, and read from there by the next
      process (stages/bytecode.py).
    - ``-u``: unbuffered output (``-E`` ignores PYTHONUNBUFFERED): a program killed at its timeout, or a rank
      hung in NCCL, leaves all it wrote.

    The working directory is *root*, so a program that needs another (a rank writes its files beside its
    config) takes that directory as an argument and changes to it itself. A child the program starts without
    these flags (torch's own helpers) sees the environment it was given.
    """
    writes = ["-X", f"pycache_prefix={bytecode}"] if bytecode else ["-B"]
    argv = [os.fspath(python), "-E", "-s", *writes, "-u", "-m", f"compatlab.incell.{module}", *args]
    return InCellCommand(argv=argv, cwd=os.fspath(root))


def _kill_group(proc: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


_STOPS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}


@contextlib.contextmanager
def _stops_held() -> Iterator[None]:
    """A second stop signal waits until the block is done (it is then raised, as it would have been). nox
    follows a Ctrl-C with SIGTERM after 0.3 s: arriving before the group was killed, it unwound past the kill,
    and the command (a hung ``uv pip install``) went on with no parent to end it."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _STOPS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


# A stop signal (compatlab.proc.signals_interrupt's handlers) that comes while ``run`` starts its command: raised
# inside Popen, after the fork, it unwound before ``run`` had the process to kill, and the command ran on with
# no parent to end it (a loaded machine: 1 in tens of tries). The handlers hold it here instead, and it is sent
# again once Popen has returned, inside the block whose clean-up kills the group.
_STARTING: list[int] = []  # one entry per command being started (threads may start several at once)
_HELD: list[int] = []  # the stop signals that came meanwhile, oldest first


def held_while_starting(signum: int) -> bool:
    """A stop signal's handler asks first: True where a command is starting, and *signum* is then held (sent
    again once it has started); False where it should be raised now."""
    if not _STARTING:
        return False
    _HELD.append(signum)
    return True


@contextlib.contextmanager
def _starting() -> Iterator[None]:
    _STARTING.append(1)
    try:
        yield
    finally:
        _STARTING.pop()
        if not _STARTING and _HELD:
            signum = _HELD[0]  # the first one; the ones after it would not be raised either
            _HELD.clear()
            os.kill(os.getpid(), signum)


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
    proc: subprocess.Popen[str] | None = None
    timed_out = False
    try:
        with _starting():  # a stop signal meanwhile is raised as the block ends, where the group is killed below
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
        out, err = proc.communicate(input=input_text, timeout=timeout)
    except subprocess.TimeoutExpired:
        assert proc is not None  # only communicate times out
        timed_out = True
        _kill_group(proc)
        out, err = proc.communicate()
    except BaseException:  # Ctrl-C, SIGTERM, a stage's deadline: the group goes, its pipes are closed
        if proc is None:  # it never started (no such program), or the signal came first
            raise
        with _stops_held():
            _kill_group(proc)
            with contextlib.suppress(subprocess.TimeoutExpired):  # a process stuck in the kernel: not forever
                proc.wait(timeout=60)
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
