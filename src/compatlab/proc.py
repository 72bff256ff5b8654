"""Subprocesses for the lab: ``run`` (from ``incell.proc``, which the cell shares) and ``which``."""

from __future__ import annotations

import shutil

from compatlab.errors import LabError
from compatlab.incell.proc import Completed, run

__all__ = ["Completed", "ProgramNotFound", "run", "which"]


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
