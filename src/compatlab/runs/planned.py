"""What a run of a matrix plans, as plain data: the store's whole view of the matrix.

runs/ imports nothing above it: the callers that load a matrix and expand it (``cells.planned``) hand the
store this, and the store writes run.json and results.json from it and gives an unreadable or missing
cell its axes and expectation.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

__all__ = ["Planned", "PlannedCell"]


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class PlannedCell:
    """One cell the matrix plans: ``na`` is the reason its rules exclude it, ``expect`` a verdict it expects."""

    id: str
    axes: Mapping[str, str]
    na: str | None = None
    expect: str | None = None
    expect_reason: str = ""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Planned:
    """A matrix as a run records it: its file and name, its report layout, its axes and its cells in order."""

    path: str
    name: str
    report: Mapping[str, tuple[str, ...]]  # rows, columns, tables
    axes: Mapping[str, tuple[str, ...]]  # axis name -> its values, in the matrix's order
    cells: tuple[PlannedCell, ...]
