"""Where a run tells its progress: one protocol, one implementation per face (``compatlab check``'s lines,
``compatlab cell``'s ``[compatlab]`` lines); the runner hands each finished stage to ``stage_done`` and the
stages' notes (a long stage's progress, an install's retry) to ``note``."""

from __future__ import annotations

from typing import Protocol

from compatlab.runs.model import StageResult

__all__ = ["Reporter"]


class Reporter(Protocol):
    """What a face shows while a cell runs."""

    @property
    def quiet(self) -> bool:
        """True: the face shows no notes, and a stage logs what it must say instead (the cell's ``say`` is None)."""

    def stage_done(self, result: StageResult) -> None:
        """*result*'s stage has ended (a blocked stage too, as it is skipped)."""

    def note(self, line: str) -> None:
        """A line a stage says while it runs, for people."""
