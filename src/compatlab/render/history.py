"""History: earlier runs under ``reports/runs/<run-id>/results.json``, what changed, and perf over time."""

from __future__ import annotations

import dataclasses
import logging
from enum import StrEnum
from pathlib import Path

from compatlab.errors import ConfigError
from compatlab.render._grid import figures, label, load, reason
from compatlab.runs import store
from compatlab.runs.model import CellResult, CellState, Results

__all__ = ["CHANGE_KINDS", "Change", "ChangeKind", "diff_runs", "figure_series", "load_runs", "previous_run"]

log = logging.getLogger(__name__)

# In the order a reader cares about them.


class ChangeKind(StrEnum):
    """What happened to a cell between two runs, in the order the changes are listed."""

    NEWLY_RED = "newly-red"
    NEWLY_GREEN = "newly-green"
    STATE = "state"  # another state, neither newly red nor newly green
    REASON = "reason"  # the same red state, another reason
    NEW = "new"
    REMOVED = "removed"


CHANGE_KINDS: tuple[ChangeKind, ...] = tuple(ChangeKind)
CHANGE_TITLES = {
    ChangeKind.NEWLY_RED: "Newly red",
    ChangeKind.NEWLY_GREEN: "Newly green",
    ChangeKind.STATE: "Other state changes",
    ChangeKind.REASON: "Reason changed",
    ChangeKind.NEW: "New cells",
    ChangeKind.REMOVED: "Removed cells",
}
SPARK_RUNS = 12


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Change:
    """What happened to one cell between two runs."""

    kind: ChangeKind
    cell_id: str
    label: str
    old_state: CellState | None = None
    new_state: CellState | None = None
    old_reason: str = ""
    new_reason: str = ""


def load_runs(runs_dir: Path) -> list[Results]:
    """Every readable run under *runs_dir*, oldest first (``RunInfo.order``). Unreadable ones are logged."""
    runs: list[Results] = []
    for path in store.results_in(runs_dir):
        try:
            runs.append(load(path))
        except ConfigError as exc:
            log.warning("skipping run in history: %s", exc)
    runs.sort(key=lambda r: r.run.order)
    return runs


def previous_run(history: list[Results], run: Results) -> Results | None:
    """The newest finished run of *run*'s matrix that started before it (never *run* itself): an interrupted run
    (killed, or still running) and a run of another matrix in the same folder are no baseline for news."""
    meta = run.run
    earlier = [
        r
        for r in history
        if r.run.id != meta.id and r.run.order < meta.order and r.run.done and r.run.same_matrix(meta)
    ]
    return earlier[-1] if earlier else None


def _change(old: CellResult | None, new: CellResult | None) -> Change | None:
    if new is None and old is not None:
        return Change(
            kind=ChangeKind.REMOVED, cell_id=old.id, label=label(old.axes), old_state=old.state, old_reason=reason(old)
        )
    assert new is not None
    if old is None:
        return Change(
            kind=ChangeKind.NEW, cell_id=new.id, label=label(new.axes), new_state=new.state, new_reason=reason(new)
        )
    before, after = reason(old), reason(new)
    kind: ChangeKind | None = None
    if old.state != new.state:
        if new.state == CellState.FAIL:
            kind = ChangeKind.NEWLY_RED
        elif new.state == CellState.PASS:
            kind = ChangeKind.NEWLY_GREEN
        else:
            kind = ChangeKind.STATE
    elif new.state not in (CellState.PASS, CellState.NA) and before != after:
        kind = ChangeKind.REASON
    if kind is None:
        return None
    return Change(
        kind=kind,
        cell_id=new.id,
        label=label(new.axes),
        old_state=old.state,
        new_state=new.state,
        old_reason=before,
        new_reason=after,
    )


def diff_runs(old: Results, new: Results) -> list[Change]:
    """Per-cell changes from *old* to *new*, grouped in CHANGE_KINDS order, cells in *new*'s order."""
    old_cells, new_cells = old.by_id, new.by_id
    changes = [_change(old_cells.get(cid), cell) for cid, cell in new_cells.items()]
    changes += [_change(cell, None) for cid, cell in old_cells.items() if cid not in new_cells]
    found = [c for c in changes if c is not None]
    return sorted(found, key=lambda c: CHANGE_KINDS.index(c.kind))


def figure_series(history: list[Results], run: Results, *, last: int = SPARK_RUNS) -> dict[str, dict[str, list[float]]]:
    """cell id -> figure name -> values over the last *last* runs up to and including *run*.

    A run where a cell has no such figure contributes nothing, so a series may be shorter than *last*.
    """
    earlier = [r for r in history if r.run.id != run.run.id and r.run.order < run.run.order]
    window = (earlier[-(last - 1) :] if last > 1 else []) + [run]
    out: dict[str, dict[str, list[float]]] = {}
    for r in window:
        for cell in r.cells:
            for name, value in figures(cell).items():
                out.setdefault(cell.id, {}).setdefault(name, []).append(value)
    return out
