"""Subprocesses for the lab: ``run`` (from ``incell.proc``, which the cell shares), ``which``, and signals.

A cell runs in a process that nox started. SIGTERM and SIGHUP are handled like SIGINT (KeyboardInterrupt):
``run`` kills the running command's whole process group and waits for it on the way out, finished cells
are kept, and nothing is written afterwards. If nox itself dies (``kill -9``), the kernel sends the cell
process SIGTERM (Linux's parent-death signal), so an orphan never goes on to write over a newer run.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import sys
from collections.abc import Iterator
from types import FrameType

from compatlab.errors import LabError
from compatlab.incell.proc import Completed, run

__all__ = ["Completed", "ProgramNotFound", "Terminated", "run", "signals_interrupt", "which"]


class ProgramNotFound(LabError):
    """A program the lab needs is not on PATH."""


def which(program: str) -> str:
    """Absolute path of *program*, or a clear error."""
    found = shutil.which(program)
    if found is None:
        raise ProgramNotFound(
            f"program {program!r} not found on PATH; install it (e.g. python -m pip install {program})"
        )
    return found


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP arrived: unwinds like Ctrl-C, so every ``run`` kills its process group on the way."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


_PR_SET_PDEATHSIG = 1


def _raise(signum: int, frame: FrameType | None) -> None:
    raise Terminated(signum)


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


@contextlib.contextmanager
def signals_interrupt(*, parent_death: bool = True) -> Iterator[None]:
    """Within the block, SIGINT raises KeyboardInterrupt, and SIGTERM and SIGHUP ``Terminated`` (one).

    With *parent_death* (Linux), the process also gets SIGTERM when its parent dies, ``kill -9`` included.
    """
    # SIGINT too: a process started in the background by a shell inherits SIGINT ignored, and Python then
    # never turns it into KeyboardInterrupt; a cell must stop on it all the same.
    old = {
        s: signal.signal(s, _raise_interrupt if s == signal.SIGINT else _raise)
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    }
    if parent_death and sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            parent = os.getppid()
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
            if os.getppid() != parent:  # the parent died before the call: it will not be signalled
                raise Terminated(signal.SIGTERM)
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
