"""A loaded run, its grid layout, and what a cell says at a glance: what view.py builds the view from."""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from compatlab.errors import ConfigError
from compatlab.runs import store
from compatlab.runs.model import CellResult, CellState, Results, ShapeError
from compatlab.runs.records.figures import figures_of
from compatlab.runs.verdict import culprit

log = logging.getLogger(__name__)

# How an axis is named in headings; anything else is shown as written. render/ reads runs/ only, so the
# non-package axis kinds of config/axes.py's table are named here, and a test holds the two together.
AXIS_TITLES: Mapping[str, str] = {"cuda": "CUDA", "python": "Python"}
Key = tuple[str, ...]


def run_from_json(data: Mapping[str, Any], source: str) -> Results:
    """Check a loaded results.json; every problem at once, as ConfigError naming *source*."""
    try:
        return _named(Results.from_json(data), source)
    except ShapeError as exc:
        raise ConfigError(source, exc.problems) from None


def _named(results: Results, source: str) -> Results:
    """A run that records no id is named by its folder (``runs/<run-id>/results.json``)."""
    if results.run.id:
        return results
    return dataclasses.replace(results, run=dataclasses.replace(results.run, id=Path(source).parent.name))


def load(path: Path) -> Results:
    """Read and check one results.json (through runs/store.py); a bad file raises ConfigError naming it."""
    return _named(store.load_results(path), str(path))


def axis_title(axis: str) -> str:
    return AXIS_TITLES.get(axis, axis)


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
        out.update((f.name, f.value) for f in figures_of(stage))
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
