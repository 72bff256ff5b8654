"""The view: one run as its pages show it, built once by ``build``, then only formatted.

html.py and markdown.py each take a RunView (or, for the run index, IndexEntry lines) and format it;
neither decides what a cell says, and neither imports the other. What a cell says comes from _grid.py
(layout, reason, figures), runs/verdict.py (the culprit each cell records), answers.py (the answers above
the grid) and history.py (what changed since the previous run); the text helpers both formats need are in
text.py.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from compatlab.incell.causes import CAUSES
from compatlab.render._grid import (
    Key,
    Run,
    axis_title,
    figures,
    headline,
    install_command,
    is_known,
    label,
    layout,
    reason,
)
from compatlab.render.answers import answers, forced_marks, is_forced, shipped
from compatlab.render.history import CHANGE_TITLES, Change, ChangeKind, diff_runs, figure_series
from compatlab.runs.model import Blame, CellResult, CellState, StageResult, StageState
from compatlab.runs.verdict import culprit

__all__ = [
    "CHANGE_TITLES",
    "PERF_CHANGE",
    "AnswersView",
    "CellView",
    "Change",
    "ChangeKind",
    "FigureMove",
    "IndexEntry",
    "NeighbourView",
    "RunRef",
    "RunView",
    "Summary",
    "TableView",
    "build",
    "summarize",
]

# Relative change of a perf figure worth a line in the change summary.
PERF_CHANGE = 0.05


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class CellView:
    """One cell as the grid shows it; ``result`` keeps the record for the panel (stages, install, freeze)."""

    result: CellResult
    id: str
    label: str
    state: CellState
    known: bool  # a fail the matrix expects
    shipped: str  # the release whose own pinned stack this is, or ''
    forced: bool
    forced_marks: tuple[str, ...]  # the pins a forced cell broke
    culprit: StageResult | None  # the stage that explains the colour
    reason: str  # the cell's one reason, in full
    causes: tuple[Blame, ...]  # every independent cause of a red cell (runs/model.py), the most blocking first
    warnings: tuple[StageResult, ...]  # the warn stages of a green or amber cell
    install_command: str | None
    figures: Mapping[str, float]
    headline: Mapping[str, float]  # the few figures a grid cell has room for
    change: Change | None  # since the previous run
    series: Mapping[str, Sequence[float]]  # figure name -> values over recent runs, oldest first


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class TableView:
    """One grid: a value of the ``tables`` axes, its row and column keys and the cell at each slot."""

    key: Key
    title: str
    row_axes: tuple[str, ...]
    col_axes: tuple[str, ...]
    row_keys: tuple[Key, ...]
    col_keys: tuple[Key, ...]
    slots: Mapping[tuple[Key, Key], CellView]


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Summary:
    """A run's header facts as plain strings (formatters escape), and its cells per state."""

    id: str
    matrix: str
    started: str
    finished: str
    host: str
    gpus: str
    driver: str
    platform: str
    python: str
    counts: Mapping[str, int]  # per state in CELL_STATES order, plus ``known`` among the fails
    older: int  # cells kept from older runs


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class RunRef:
    """The run compared with: its id and start time as recorded."""

    id: str
    started: str


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class NeighbourView:
    """A red cell and its nearest working cell one axis away (``green_id`` None: there is none)."""

    red_id: str
    green_id: str | None
    sentence: str


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class AnswersView:
    """The answers above the grid (answers.py)."""

    newest: CellView | None
    command: str | None
    breaks: tuple[str, ...]
    neighbours: tuple[NeighbourView, ...]


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class FigureMove:
    """A perf figure that moved by PERF_CHANGE or more since the previous run."""

    label: str
    name: str
    before: float
    after: float


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class RunView:
    """Everything a page of one run shows."""

    summary: Summary
    axis_titles: tuple[str, ...]  # the run's axes as headings name them, in the matrix's order
    tables: tuple[TableView, ...]
    answers: AnswersView | None  # None: the run has no cells
    previous: RunRef | None
    changes: tuple[Change, ...]  # since *previous*, in CHANGE_KINDS order
    # Red cells grouped by their causes: (code, the cause table's title, the cells), most frequent first.
    by_cause: tuple[tuple[str, str, tuple[CellView, ...]], ...]
    moves: tuple[FigureMove, ...]  # since *previous*


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class IndexEntry:
    """One line of the run index (``changes`` None: a first run)."""

    summary: Summary
    href: str
    changes: Sequence[Change] | None = None


def _gpus(host: Mapping[str, Any]) -> str:
    gpus = host.get("gpus")
    if not isinstance(gpus, list) or not gpus:
        return "no GPU"
    names = [str(g.get("name", g)) if isinstance(g, dict) else str(g) for g in gpus]
    return ", ".join(f"{n}× {name}" for name, n in collections.Counter(names).items())


def summarize(run: Run) -> Summary:
    """The header facts and counts of *run*."""
    host = run.host
    return Summary(
        id=run.id,
        matrix=run.matrix_name,
        started=run.started or "unknown",
        finished=run.finished or "in progress",
        host=str(host.get("hostname") or "unknown host"),
        gpus=_gpus(host),
        driver=str(host.get("driver") or "no driver"),
        platform=str(host.get("platform") or ""),
        python=str(host.get("python") or ""),
        counts=run.counts(),
        older=sum(1 for c in run.cells if c.run),
    )


def _cell(cell: CellResult, change: Change | None, series: Mapping[str, Sequence[float]]) -> CellView:
    figs = figures(cell)
    # Green and amber cells can still carry warnings (a second CUDA major, an undeclared dependency).
    warnings = (
        tuple(s for s in cell.stages if s.state == StageState.WARN)
        if cell.state in (CellState.PASS, CellState.PARTIAL)
        else ()
    )
    return CellView(
        result=cell,
        id=cell.id,
        label=label(cell.axes),
        state=CellState(cell.state),
        known=is_known(cell),
        shipped=shipped(cell),
        forced=is_forced(cell),
        forced_marks=tuple(forced_marks(cell)),
        culprit=culprit(cell),
        reason=reason(cell),
        causes=cell.causes,
        warnings=warnings,
        install_command=install_command(cell),
        figures=figs,
        headline=headline(figs),
        change=change,
        series=series,
    )


def _moves(old: Run, new: Run) -> tuple[FigureMove, ...]:
    out = []
    before = old.by_id
    for cell in new.cells:
        prev = before.get(cell.id)
        if prev is None:
            continue
        was = figures(prev)
        for name, value in figures(cell).items():
            base = was.get(name)
            if base is None or base == 0 or abs(value - base) / abs(base) < PERF_CHANGE:
                continue
            out.append(FigureMove(label=label(cell.axes), name=name, before=base, after=value))
    return tuple(out)


def build(run: Run, *, previous: Run | None = None, history: Sequence[Run] = ()) -> RunView:
    """The view of *run*: what changed since *previous*, sparklines over *history* (runs, oldest first)."""
    changes = tuple(diff_runs(previous, run)) if previous is not None else ()
    by_cell = {c.cell_id: c for c in changes}
    series = figure_series(list(history), run)

    def view(cell: CellResult) -> CellView:
        return _cell(cell, by_cell.get(cell.id), series.get(cell.id, {}))

    tables = tuple(
        TableView(
            key=t.key,
            title=t.title,
            row_axes=t.row_axes,
            col_axes=t.col_axes,
            row_keys=t.row_keys,
            col_keys=t.col_keys,
            slots={slot: view(cell) for slot, cell in t.slots.items()},
        )
        for t in layout(run)
    )
    found_answers = None
    if run.cells:
        found = answers(run)
        found_answers = AnswersView(
            newest=view(found.newest) if found.newest is not None else None,
            command=found.command,
            breaks=found.breaks,
            neighbours=tuple(
                NeighbourView(red_id=n.red.id, green_id=n.green.id if n.green else None, sentence=n.sentence)
                for n in found.neighbours
            ),
        )
    red = [view(c) for c in run.cells if c.state == CellState.FAIL]
    codes = list(dict.fromkeys(b.code for c in red for b in c.causes))
    groups = [(code, tuple(c for c in red if any(b.code == code for b in c.causes))) for code in codes]
    by_cause = tuple(
        (code, CAUSES[code].title if code in CAUSES else code, cells)
        for code, cells in sorted(groups, key=lambda g: -len(g[1]))
    )
    return RunView(
        by_cause=by_cause,
        summary=summarize(run),
        axis_titles=tuple(axis_title(a) for a in run.axes),
        tables=tables,
        answers=found_answers,
        previous=RunRef(id=previous.id, started=previous.started) if previous is not None else None,
        changes=changes,
        moves=_moves(previous, run) if previous is not None else (),
    )
