"""What a run is about to do and how long it should take, from what each cell took in the runs before.

The figures are the seconds of each cell's stages in the newest earlier runs of the same matrix
(``reports/runs/<id>/results.json``, at most ``RUNS`` of them), counted for the stages this run will run (a
preflight's ``--until static`` counts install, pins and static, and the cell's time outside its stages) and
given as a range over those runs: one run gives one figure, several a lowest and a highest widened by a tenth
either side (``NOISE``: what the next run differs by on a steady machine). They are read
once, when the run starts, never from the run itself. A cell with no figure (new in the matrix, n/a before,
or never run that far) is left out of the sum and counted as not timed, so an estimate never pretends to
know more than it does.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path

from compatlab.errors import LabError
from compatlab.runs.model import PREFLIGHT, CellResult, CellState, StageState

__all__ = ["RUNS", "Plan", "Span", "duration_words", "previous_spans"]

RUNS = 3  # the earlier runs an estimate reads, newest first
READ = 10  # at most this many runs' results are read for it (subset runs time only some cells)


@dataclasses.dataclass(frozen=True, slots=True)
class Span:
    """A cell's seconds over the earlier runs that timed it: lowest, highest, and how many runs."""

    lo: float
    hi: float
    runs: int = 1


def _timed(cell: CellResult, stages: Collection[str] | None) -> float | None:
    """*cell*'s seconds for *stages* (None: the whole pipeline), with its time outside stages; None when it
    did not run them all."""
    if cell.state == CellState.NA or cell.seconds <= 0:
        return None
    if stages is None:
        return None if cell.preflight else cell.seconds
    ran = {s.name: s for s in cell.stages if not (s.state == StageState.SKIP and s.reason.startswith(PREFLIGHT))}
    if any(name not in ran for name in stages):
        return None
    outside = max(0.0, cell.seconds - sum(s.seconds for s in cell.stages))
    return sum(ran[name].seconds for name in stages) + outside


def previous_spans(
    runs_dir: Path,
    *,
    matrix_name: str = "",
    stages: Collection[str] | None = None,
    exclude: str = "",
    runs: int = RUNS,
) -> dict[str, Span]:
    """{cell id: Span} over the newest *runs* earlier runs under *runs_dir* of the matrix *matrix_name* (any,
    when empty) that timed the cell for *stages*; the run *exclude* (this one) is never read."""
    from compatlab.runs.store import load_results, results_in, run_info

    # Which runs, newest first, from each one's small run.json; only the newest READ are read whole (a nightly
    # box keeps hundreds of runs, and every `nox -s matrix` starts here).
    newest: list[tuple[tuple[int, str], Path]] = []
    for path in results_in(runs_dir):
        if path.parent.name == exclude:
            continue
        try:
            info = run_info(path.parent)
        except LabError:
            continue
        if matrix_name and info.matrix_name and info.matrix_name != matrix_name:
            continue
        newest.append((info.order, path))
    newest.sort(reverse=True)
    found = []
    for _order, path in newest[:READ]:
        try:
            found.append(load_results(path))
        except LabError:
            continue
    times: dict[str, list[float]] = {}
    for results in found:
        for cell in results.cells:
            took = _timed(cell, stages)
            if took is not None and len(times.setdefault(cell.id, [])) < runs:
                times[cell.id].append(took)
    return {cid: _span(ts) for cid, ts in times.items() if ts}


NOISE = 0.10  # run-to-run spread on one machine: several runs' range is widened by this much either side


def _span(times: Sequence[float]) -> Span:
    """One run: its figure. Several: their lowest and highest, widened by NOISE, since the next run differs
    from each of them by about that much even on a steady machine."""
    if len(times) == 1:
        return Span(times[0], times[0], 1)
    return Span(min(times) * (1 - NOISE), max(times) * (1 + NOISE), len(times))


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


def _narrow(lo: float, hi: float) -> bool:
    return hi - lo <= max(2.0, 0.05 * hi)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Plan:
    """The live cells one run starts, in order, and the earlier runs' seconds for them."""

    cells: tuple[str, ...]
    previous: Mapping[str, Span]

    def left(self, cell_id: str) -> tuple[Span, int]:
        """(the seconds *cell_id* and the cells after it took before, summed, how many of them had none)."""
        rest: Sequence[str] = self.cells[self.cells.index(cell_id) :] if cell_id in self.cells else (cell_id,)
        known = [self.previous[c] for c in rest if c in self.previous]
        runs = max((s.runs for s in known), default=0)
        return Span(sum(s.lo for s in known), sum(s.hi for s in known), runs), len(rest) - len(known)

    @staticmethod
    def _source(runs: int) -> str:
        return "as in the previous run" if runs <= 1 else f"as in the last {runs} runs"

    @staticmethod
    def _amount(span: Span) -> str:
        if _narrow(span.lo, span.hi):
            return f"about {duration_words(span.hi)}"
        return f"{duration_words(span.lo)} to {duration_words(span.hi)}"

    @staticmethod
    def _end(now: dt.datetime, span: Span) -> str:
        first, last = _clock(now + dt.timedelta(seconds=span.lo)), _clock(now + dt.timedelta(seconds=span.hi))
        return f"about {last}" if first == last else f"between {first.split(' ')[0]} and {last}"

    def start_line(self, run_id: str, *, now: dt.datetime | None = None, not_applicable: int = 0) -> str:
        """``run R: 6 cells (66 n/a), 9 min 10 s to 9 min 50 s as in the last 3 runs, ending between 17:41
        and 17:42 UTC``."""
        now = now or dt.datetime.now(dt.UTC)
        n = len(self.cells)
        head = f"run {run_id}: {n} cell{'s' if n != 1 else ''}" + (f" ({not_applicable} n/a)" if not_applicable else "")
        if not self.cells:
            return head
        span, untimed = self.left(self.cells[0])
        if untimed == n:
            return head + ", none timed in the previous run: no estimate"
        more = f" ({untimed} not timed before, not counted)" if untimed else ""
        return f"{head}, {self._amount(span)} {self._source(span.runs)}{more}, ending {self._end(now, span)}"

    def cell_words(self, cell_id: str, *, now: dt.datetime | None = None) -> str:
        """``3/6, about 20 s as in the previous run; the run ends about 17:42 UTC``."""
        now = now or dt.datetime.now(dt.UTC)
        where = (
            f"{self.cells.index(cell_id) + 1}/{len(self.cells)}" if cell_id in self.cells else "not in this run's cells"
        )
        mine = self.previous.get(cell_id)
        words = where + (f", {self._amount(mine)} {self._source(mine.runs)}" if mine else ", not timed before")
        span, untimed = self.left(cell_id)
        if span.hi:
            words += f"; the run ends {self._end(now, span)}"
            words += f" and {untimed} cell{'s' if untimed > 1 else ''} not timed" if untimed else ""
        return words
