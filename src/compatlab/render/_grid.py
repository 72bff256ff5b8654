"""A loaded run, its grid layout, and what a cell says at a glance: what view.py builds the view from."""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from compatlab.errors import ConfigError
from compatlab.runs import store
from compatlab.runs.model import CELL_STATES, CellResult, CellState, Results, ShapeError
from compatlab.runs.verdict import culprit

log = logging.getLogger(__name__)

# How an axis is named in headings; anything else is shown as written. render/ reads runs/ only, so the
# non-package axis kinds of config/matrix.py's table are named here, and a test holds the two together.
AXIS_TITLES: Mapping[str, str] = {"cuda": "CUDA", "python": "Python"}
# The layout of a run that records none: config/matrix.py's Report defaults (no columns: every axis the
# rows and tables leave goes in the columns, in the matrix's order).
DEFAULT_REPORT: Mapping[str, tuple[str, ...]] = {"rows": ("torch",), "columns": (), "tables": ("cuda",)}

Key = tuple[str, ...]


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Run:
    """One run's results.json, checked and typed."""

    source: str
    results: Results
    id: str
    started: str
    finished: str | None
    matrix_name: str
    host: Mapping[str, Any]
    rows: tuple[str, ...]
    columns: tuple[str, ...]
    tables: tuple[str, ...]
    axes: Mapping[str, tuple[str, ...]]
    cells: tuple[CellResult, ...]

    @property
    def by_id(self) -> dict[str, CellResult]:
        return {c.id: c for c in self.cells}

    @property
    def sort_key(self) -> tuple[int, str]:
        """Older runs first: by start, to the nanosecond where the run records it (runs/model.py: RunInfo.order)."""
        return self.results.run.order

    def counts(self) -> dict[str, int]:
        """Cells per state, in the order of CELL_STATES, plus ``known`` among the fails."""
        out = dict.fromkeys(CELL_STATES, 0)
        out["known"] = 0
        for cell in self.cells:
            out[cell.state] = out.get(cell.state, 0) + 1
            if is_known(cell):
                out["known"] += 1
        return out


def run_from_results(results: Results, source: str) -> Run:
    """Type a checked run for the renderers; the layout keys the run leaves out take DEFAULT_REPORT."""
    meta = results.run
    layout = {part: meta.report.get(part, default) for part, default in DEFAULT_REPORT.items()}
    return Run(
        source=source,
        results=results,
        id=meta.id or Path(source).parent.name,
        started=meta.started,
        finished=meta.finished or None,
        matrix_name=meta.matrix_name or meta.matrix,
        host=meta.host,
        rows=layout["rows"],
        columns=layout["columns"],
        tables=layout["tables"],
        axes=meta.axes,
        cells=results.cells,
    )


def run_from_json(data: Mapping[str, Any], source: str) -> Run:
    """Check a loaded results.json and type it; every problem at once, as ConfigError naming *source*."""
    try:
        return run_from_results(Results.from_json(data), source)
    except ShapeError as exc:
        raise ConfigError(source, exc.problems) from None


def load(path: Path) -> Run:
    """Read and check one results.json (through runs/store.py); a bad file raises ConfigError naming it."""
    return run_from_results(store.load_results(path), str(path))


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Table:
    """One grid: a value of the ``tables`` axes, row keys, column keys and the cells at each slot."""

    key: Key
    title: str
    row_axes: tuple[str, ...]
    col_axes: tuple[str, ...]
    row_keys: tuple[Key, ...]
    col_keys: tuple[Key, ...]
    slots: Mapping[tuple[Key, Key], CellResult]


def axis_title(axis: str) -> str:
    return AXIS_TITLES.get(axis, axis)


def _values(run: Run, axis: str) -> list[str]:
    """The axis' values in matrix order, then any a cell has that the run header does not list."""
    seen = dict.fromkeys(run.axes.get(axis, ()))
    for cell in run.cells:
        seen.setdefault(cell.axes.get(axis, ""), None)
    return list(seen)


def layout(run: Run) -> list[Table]:
    """Split the run into tables; rows and columns without any cell are left out.

    Axes that the report does not place are added to the columns, so that no cell is hidden.
    """
    placed = set(run.rows) | set(run.columns) | set(run.tables)
    extra: dict[str, None] = {}
    for cell in run.cells:
        for axis in cell.axes:
            if axis not in placed:
                extra.setdefault(axis, None)
    for axis in run.axes:
        if axis not in placed and any(axis in c.axes for c in run.cells):
            extra.setdefault(axis, None)
    col_axes = run.columns + tuple(extra)
    by_table: dict[Key, dict[tuple[Key, Key], CellResult]] = {}
    for cell in run.cells:
        tkey = tuple(cell.axes.get(a, "") for a in run.tables)
        slot = (tuple(cell.axes.get(a, "") for a in run.rows), tuple(cell.axes.get(a, "") for a in col_axes))
        table = by_table.setdefault(tkey, {})
        if slot in table:
            log.warning("%s: cells %s and %s fall on the same grid slot", run.source, table[slot].id, cell.id)
        table[slot] = cell
    out = []
    for tkey in itertools.product(*(_values(run, a) for a in run.tables)):
        slots = by_table.get(tkey)
        if not slots:
            continue
        rows = [k for k in itertools.product(*(_values(run, a) for a in run.rows)) if any(r == k for r, _ in slots)]
        cols = [k for k in itertools.product(*(_values(run, a) for a in col_axes)) if any(c == k for _, c in slots)]
        title = " · ".join(f"{axis_title(a)} {v}" for a, v in zip(run.tables, tkey, strict=True))
        out.append(
            Table(
                key=tkey,
                title=title or "All cells",
                row_axes=run.rows,
                col_axes=col_axes,
                row_keys=tuple(rows),
                col_keys=tuple(cols),
                slots=slots,
            )
        )
    return out


def is_known(cell: CellResult) -> bool:
    """A failure the matrix expected (``expect = "fail"``): red, but not news."""
    return cell.expected is not None and not cell.unexpected and cell.expected.state == cell.state


def label(axes: Mapping[str, str]) -> str:
    """``torch 2.9.1 · sgl-kernel 0.3.21 · flashinfer 0.6.4 · cuda 12.8``."""
    return " · ".join(f"{a} {v}" for a, v in axes.items())


def reason(cell: CellResult) -> str:
    """The cell's one reason: its culprit stage's, else the recorded one (n/a: the exclusion)."""
    stage = culprit(cell)
    # The culprit's own words, so that the stage named beside the reason is the one that said it.
    if stage is not None and stage.reason and cell.state not in (CellState.PASS, CellState.NA):
        return stage.reason
    if cell.reason:
        return cell.reason
    if cell.expected is not None and cell.state != CellState.PASS:
        return cell.expected.reason
    return ""


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def figures(cell: CellResult) -> dict[str, float]:
    """Perf numbers found in stage details: ``busbw_gbps`` and any numeric ``figures`` entry."""
    out: dict[str, float] = {}
    for stage in cell.stages:
        busbw = _number(stage.details.get("busbw_gbps"))
        if busbw is not None:
            out["busbw_gbps"] = busbw
        figs = stage.details.get("figures")
        if isinstance(figs, dict):
            for name, value in figs.items():
                number = _number(value)
                if number is not None:
                    out[str(name)] = number
    return out


def headline(figs: Mapping[str, float], limit: int = 4) -> dict[str, float]:
    """The few figures a grid cell has room for: bus bandwidth, speedups, then throughputs, then the rest."""

    def rank(name: str) -> int:
        return 0 if "busbw" in name else 1 if "speedup" in name else 2 if "tok_s" in name else 3

    return dict(sorted(figs.items(), key=lambda item: rank(item[0]))[:limit])


def install_command(cell: CellResult) -> str | None:
    """The cell's install as it ran: one uv command, or two joined by ``&&`` (a forced cell's packages
    with their own index are installed first)."""
    import shlex

    if cell.install is None or not cell.install.argv:
        return None
    return " && ".join(shlex.join(argv) for argv in (cell.install.pre_argv, cell.install.argv) if argv)
