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
import itertools
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from compatlab.incell.causes import CAUSES
from compatlab.render._grid import (
    Key,
    axis_title,
    figures,
    headline,
    install_command,
    is_known,
    label,
    reason,
)
from compatlab.render.answers import answers, forced_marks, is_forced, shipped
from compatlab.render.history import CHANGE_TITLES, Change, ChangeKind, diff_runs, figure_series
from compatlab.runs.model import CELL_STATES, Blame, CellResult, CellState, Results, StageResult, StageState
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

log = logging.getLogger(__name__)

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


def _counts(cells: Sequence[CellResult]) -> dict[str, int]:
    """Cells per state, in the order of CELL_STATES, plus ``known`` among the fails."""
    out = dict.fromkeys(CELL_STATES, 0)
    out["known"] = 0
    for cell in cells:
        out[cell.state] = out.get(cell.state, 0) + 1
        if is_known(cell):
            out["known"] += 1
    return out


def summarize(results: Results) -> Summary:
    """The header facts and counts of a run."""
    meta = results.run
    host = meta.host
    return Summary(
        id=meta.id,
        matrix=meta.matrix_name or meta.matrix,
        started=meta.started or "unknown",
        finished=meta.finished or "in progress",
        host=str(host.get("hostname") or "unknown host"),
        gpus=_gpus(host),
        driver=str(host.get("driver") or "no driver"),
        platform=str(host.get("platform") or ""),
        python=str(host.get("python") or ""),
        counts=_counts(results.cells),
        older=sum(1 for c in results.cells if c.run),
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


def _moves(old: Results, new: Results) -> tuple[FigureMove, ...]:
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


def _values(run: Results, axis: str) -> list[str]:
    """The axis' values in matrix order, then any a cell has that the run header does not list."""
    seen = dict.fromkeys(run.run.axes.get(axis, ()))
    for cell in run.cells:
        seen.setdefault(cell.axes.get(axis, ""), None)
    return list(seen)


def _tables(results: Results, view: Callable[[CellResult], CellView]) -> tuple[TableView, ...]:
    """Split the run into grids; rows and columns without any cell are left out.

    Axes that the report does not place are added to the columns, so that no cell is hidden.
    """
    meta, cells = results.run, results.cells
    placed = set(meta.rows) | set(meta.columns) | set(meta.tables)
    extra: dict[str, None] = {}
    for cell in cells:
        for axis in cell.axes:
            if axis not in placed:
                extra.setdefault(axis, None)
    for axis in meta.axes:
        if axis not in placed and any(axis in c.axes for c in cells):
            extra.setdefault(axis, None)
    col_axes = meta.columns + tuple(extra)
    by_table: dict[Key, dict[tuple[Key, Key], CellResult]] = {}
    for cell in cells:
        tkey = tuple(cell.axes.get(a, "") for a in meta.tables)
        slot = (tuple(cell.axes.get(a, "") for a in meta.rows), tuple(cell.axes.get(a, "") for a in col_axes))
        table = by_table.setdefault(tkey, {})
        if slot in table:
            log.warning("run %s: cells %s and %s fall on the same grid slot", meta.id, table[slot].id, cell.id)
        table[slot] = cell
    out = []
    for tkey in itertools.product(*(_values(results, a) for a in meta.tables)):
        slots = by_table.get(tkey)
        if not slots:
            continue
        rows = [
            k for k in itertools.product(*(_values(results, a) for a in meta.rows)) if any(r == k for r, _ in slots)
        ]
        cols = [k for k in itertools.product(*(_values(results, a) for a in col_axes)) if any(c == k for _, c in slots)]
        title = " · ".join(f"{axis_title(a)} {v}" for a, v in zip(meta.tables, tkey, strict=True))
        out.append(
            TableView(
                key=tkey,
                title=title or "All cells",
                row_axes=meta.rows,
                col_axes=col_axes,
                row_keys=tuple(rows),
                col_keys=tuple(cols),
                slots={slot: view(cell) for slot, cell in slots.items()},
            )
        )
    return tuple(out)


def build(run: Results, *, previous: Results | None = None, history: Sequence[Results] = ()) -> RunView:
    """The view of *run*: what changed since *previous*, sparklines over *history* (runs, oldest first)."""
    changes = tuple(diff_runs(previous, run)) if previous is not None else ()
    by_cell = {c.cell_id: c for c in changes}
    series = figure_series(list(history), run)

    def view(cell: CellResult) -> CellView:
        return _cell(cell, by_cell.get(cell.id), series.get(cell.id, {}))

    tables = _tables(run, view)
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
        axis_titles=tuple(axis_title(a) for a in run.run.axes),
        tables=tables,
        answers=found_answers,
        previous=RunRef(id=previous.run.id, started=previous.run.started) if previous is not None else None,
        changes=changes,
        moves=_moves(previous, run) if previous is not None else (),
    )
