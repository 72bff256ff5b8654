"""What a run is about to do and how long it should take, from the seconds each cell took last time.

The previous run's figures are the ``seconds`` of each cell in ``reports/latest/results.json``. They are read
once, when the run starts and before its first cell writes anything there, so that the new run never
estimates from itself. A cell that has no figure (new in the matrix, or n/a last time) is left out of the
sum and counted as not timed, so an estimate never pretends to know more than it does.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping, Sequence
from pathlib import Path

from compatlab.errors import LabError
from compatlab.runs.model import CellState

__all__ = ["Plan", "duration_words", "previous_seconds"]


def previous_seconds(latest: Path) -> dict[str, float]:
    """{cell id: seconds} of the cells that ran in *latest*/results.json; empty when there is none to read."""
    from compatlab.runs.store import load_results

    path = latest / "results.json"
    if not path.is_file():
        return {}
    try:
        results = load_results(path)
    except LabError:
        return {}
    return {c.id: c.seconds for c in results.cells if c.state != CellState.NA and c.seconds > 0}


def duration_words(seconds: float) -> str:
    """``45 s``, ``9 min 24 s``, ``1 h 05 min``."""
    whole = round(seconds)
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        return f"{whole // 60} min {whole % 60:02d} s"
    return f"{whole // 3600} h {whole % 3600 // 60:02d} min"


def _clock(when: dt.datetime) -> str:
    return when.astimezone().strftime("%H:%M %Z").strip()


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Plan:
    """The live cells one run starts, in order, and the previous run's seconds for them."""

    cells: tuple[str, ...]
    previous: Mapping[str, float]

    def left(self, cell_id: str) -> tuple[float, int]:
        """(seconds the previous run took for *cell_id* and the cells after it, how many of them had none)."""
        rest: Sequence[str] = self.cells[self.cells.index(cell_id) :] if cell_id in self.cells else (cell_id,)
        known = [self.previous[c] for c in rest if c in self.previous]
        return sum(known), len(rest) - len(known)

    def start_line(self, run_id: str, *, now: dt.datetime | None = None, not_applicable: int = 0) -> str:
        """``run R: 6 cells (66 n/a), about 9 min 24 s as in the previous run, ending about 17:42 UTC``."""
        now = now or dt.datetime.now(dt.UTC)
        n = len(self.cells)
        head = f"run {run_id}: {n} cell{'s' if n != 1 else ''}" + (f" ({not_applicable} n/a)" if not_applicable else "")
        if not self.cells:
            return head
        seconds, untimed = self.left(self.cells[0])
        if untimed == n:
            return head + ", none timed in the previous run: no estimate"
        more = f" ({untimed} not timed before, not counted)" if untimed else ""
        return (
            f"{head}, about {duration_words(seconds)} as in the previous run{more}, ending about "
            f"{_clock(now + dt.timedelta(seconds=seconds))}"
        )

    def cell_words(self, cell_id: str, *, now: dt.datetime | None = None) -> str:
        """``3/6, about 20 s as in the previous run; the run ends about 17:42 UTC``."""
        now = now or dt.datetime.now(dt.UTC)
        where = (
            f"{self.cells.index(cell_id) + 1}/{len(self.cells)}" if cell_id in self.cells else "not in this run's cells"
        )
        mine = self.previous.get(cell_id)
        words = where + (f", about {duration_words(mine)} as in the previous run" if mine else ", not timed before")
        seconds, untimed = self.left(cell_id)
        if seconds:
            words += f"; the run ends about {_clock(now + dt.timedelta(seconds=seconds))}"
            words += f" and {untimed} cell{'s' if untimed > 1 else ''} not timed" if untimed else ""
        return words
