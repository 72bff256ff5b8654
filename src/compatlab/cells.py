"""Expand a Matrix into cells: the product of the axes, minus rules, plus includes."""

from __future__ import annotations

import dataclasses
import itertools
import re
from collections.abc import Mapping

from compatlab.config.matrix import AxisValue, Matrix, cuda_compatible, size_problem
from compatlab.errors import ConfigError

__all__ = ["Cell", "expand"]


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Cell:
    """One combination with its pins; ``na`` holds the reason when rules exclude it."""

    id: str
    values: tuple[AxisValue, ...]
    na: str | None = None
    expect: str | None = None
    expect_reason: str = ""

    @property
    def axes(self) -> dict[str, str]:
        return {v.axis: v.version for v in self.values}

    def value(self, axis: str) -> AxisValue | None:
        for v in self.values:
            if v.axis == axis:
                return v
        return None

    @property
    def packages(self) -> tuple[AxisValue, ...]:
        return tuple(v for v in self.values if v.package is not None)

    @property
    def cuda(self) -> str | None:
        v = self.value("cuda")
        return v.version if v else None


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.+]", "", text)


def cell_id(values: tuple[AxisValue, ...]) -> str:
    """Readable and stable: ``torch2.9.1-sglkernel0.3.21-flashinfer0.6.4-cuda12.8``.

    Axis names lose their dashes so that nox's ``-k`` (Python names) can match ``sglkernel0``.
    """
    return "-".join(f"{_slug(v.axis)}{v.version}" for v in values)


def _na_reason(matrix: Matrix, assignment: Mapping[str, str], values: tuple[AxisValue, ...]) -> str | None:
    for rule in matrix.rules:
        if rule.kind == "exclude" and rule.matches(assignment):
            return rule.reason
    cuda = assignment.get("cuda")
    if cuda is not None:
        for v in values:
            if v.cuda and not cuda_compatible(v.cuda, cuda):
                return f"{v.package or v.axis} {v.version} is built for CUDA {v.cuda}, this column is CUDA {cuda}"
    return None


def _expectation(matrix: Matrix, assignment: Mapping[str, str]) -> tuple[str | None, str]:
    for rule in matrix.rules:
        if rule.kind in ("expect", "include") and rule.expect and rule.matches(assignment):
            return rule.expect, rule.reason
    return None, ""


def expand(matrix: Matrix) -> list[Cell]:
    """Every cell of the matrix in a stable order; excluded ones carry ``na``.

    Refused (ConfigError) when the matrix has more cells than its ``max-cells``, counted from the axis sizes
    before anything is built: ``load_matrix`` says so already, this holds for a Matrix made in code too.
    """
    problem = size_problem(matrix.axes, matrix.max_cells)
    if problem:
        raise ConfigError(matrix.path, [f"axes: {problem}"])
    cells: dict[str, Cell] = {}
    for combo in itertools.product(*(axis.values for axis in matrix.axes)):
        values = tuple(combo)
        assignment = {v.axis: v.version for v in values}
        cid = cell_id(values)
        expect, why = _expectation(matrix, assignment)
        cells[cid] = Cell(id=cid, values=values, na=_na_reason(matrix, assignment, values),
                          expect=expect, expect_reason=why)
    for rule in matrix.rules:
        if rule.kind != "include":
            continue
        chosen: list[AxisValue] = []
        for axis in matrix.axes:
            value = axis.find(rule.match[axis.name][0])
            assert value is not None  # validated in parse_matrix
            chosen.append(value)
        vt = tuple(chosen)
        cid = cell_id(vt)
        assignment = {v.axis: v.version for v in vt}
        expect, why = _expectation(matrix, assignment)
        cells[cid] = Cell(id=cid, values=vt, na=None, expect=expect, expect_reason=why)
    return list(cells.values())
