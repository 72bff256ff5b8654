"""Expand a Matrix into cells: the product of the axes, minus rules, plus includes.

A **shipped stack** is what one release pins exactly: sglang 0.5.23's Requires-Dist says ``torch==2.14.1``,
``sglang-kernel==0.4.10`` and ``flashinfer_python==0.7.2``, so the cell of those four versions is the stack
SGLang's own release was built and tested on. The pins come from matrix.lock; a release's stack is its
exact (``==``, no wildcard) pins on other axes, followed through the pinned releases' own pins, and it is a
stack of the matrix when it gives every package axis a value the matrix has. A cell's distance from a
stack is the number of package axes on which they differ; ``[[rules.neighbours]]`` keeps only the cells
within ``distance`` (default 1) of some stack: every cell that moves one component away from a shipped
stack answers "can I move this one piece?", and the matrix stays small when its axes grow.

A cell is **forced** when its axis pins are also handed to uv as overrides (``install.force``, a
``[[rules.force]]`` rule, or, unless ``install.force = false``, a cell with an axis whose kind forces, as
sglang's does: SGLang's own pins yield to the axis pins). Its **conflicts** are the pins of its own
releases that its other axis versions break (known only when the lock knows every release of the cell):
an unforced cell with conflicts cannot be installed; a forced one installs what its axes say, and its
verdict is what that stack does.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from collections.abc import Mapping

from packaging.specifiers import InvalidSpecifier, SpecifierSet

from compatlab.config.axes import CUDA_AXIS, FORCING_AXES, PYTHON_AXIS, AxisValue, cuda_compatible
from compatlab.config.matrix import Matrix, size_problem
from compatlab.config.rules import Rule, RuleKind
from compatlab.errors import ConfigError
from compatlab.runs.planned import Planned, PlannedCell

__all__ = ["Cell", "Stack", "conflicts", "distance", "expand", "is_forced", "planned", "shipped_stacks"]


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Cell:
    """One combination with its pins; ``na`` holds the reason when rules exclude it."""

    id: str
    values: tuple[AxisValue, ...]
    na: str | None = None
    expect: str | None = None
    expect_reason: str = ""
    force: bool = False  # the axis pins are also uv overrides
    shipped: str = ""  # the release whose own pinned stack this cell is: "sglang 0.5.23"
    conflicts: tuple[str, ...] | None = None  # pins of the cell's releases it breaks; None: the lock cannot say

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
        """The cell's CUDA column, when the matrix has one."""
        v = self.value(CUDA_AXIS)
        return v.version if v else None

    @property
    def python(self) -> str | None:
        """The cell's own interpreter (``3.12``), when the matrix has a python axis."""
        v = self.value(PYTHON_AXIS)
        return v.version if v else None


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Stack:
    """A shipped stack: the release that pins it (``sglang 0.5.23``) and its version of each package axis."""

    release: str
    axes: Mapping[str, str]

    @property
    def label(self) -> str:
        return " · ".join(f"{a} {v}" for a, v in self.axes.items())


def _exact(spec: str) -> SpecifierSet | None:
    """*spec* when it pins one version (``==2.14.1``, ``===x``), else None."""
    try:
        parsed = SpecifierSet(spec)
    except InvalidSpecifier:
        return None
    items = list(parsed)
    if len(items) == 1 and items[0].operator in ("==", "===") and "*" not in items[0].version:
        return parsed
    return None


def _package_axes(matrix: Matrix) -> list[str]:
    return [a.name for a in matrix.axes if a.is_package]


def shipped_stacks(matrix: Matrix) -> tuple[Stack, ...]:
    """Every release's exactly pinned stack that is a cell of the matrix (see the module docstring)."""
    lock = matrix.lock
    if lock is None:
        return ()
    wanted = _package_axes(matrix)
    stacks: dict[tuple[tuple[str, str], ...], Stack] = {}
    for axis in matrix.axes:
        if not axis.is_package:
            continue
        for value in axis.values:
            release = lock.release(axis.name, value.version)
            if release is None or not release.pins:
                continue
            stack = {axis.name: value.version}
            todo = list(release.pins.items())
            ok = True
            while todo and ok:
                other, spec = todo.pop()
                exact = _exact(spec)
                if exact is None or other not in wanted:
                    continue
                match = [v.version for v in matrix.axis(other).values if exact.contains(v.version, prereleases=True)]
                if len(match) != 1 or stack.get(other, match[0]) != match[0]:
                    ok = False  # the matrix lacks the pinned version (or the pins disagree): not a cell
                    break
                if other not in stack:
                    stack[other] = match[0]
                    pinned = lock.release(other, match[0])
                    todo.extend(pinned.pins.items() if pinned else ())
            if ok and set(stack) == set(wanted):
                ordered = {a: stack[a] for a in wanted}
                stacks.setdefault(
                    tuple(ordered.items()), Stack(release=f"{value.package} {value.version}", axes=ordered)
                )
    return tuple(stacks.values())


def distance(assignment: Mapping[str, str], stack: Stack) -> int:
    """On how many package axes *assignment* differs from *stack*."""
    return sum(1 for a, v in stack.axes.items() if assignment.get(a) != v)


def conflicts(matrix: Matrix, values: tuple[AxisValue, ...]) -> tuple[str, ...] | None:
    """The pins of the cell's own releases that its other axis versions break: ``sglang 0.5.23 pins
    torch==2.14.1``; None when the lock does not know every release of the cell."""
    lock = matrix.lock
    if lock is None:
        return None
    by_axis = {v.axis: v for v in values}
    out = []
    for value in values:
        if value.package is None:
            continue
        release = lock.release(value.axis, value.version)
        if release is None:
            return None
        for other, spec in release.pins.items():
            mine = by_axis.get(other)
            if mine is None:
                continue
            try:
                holds = SpecifierSet(spec).contains(mine.version, prereleases=True)
            except InvalidSpecifier:
                continue
            if not holds:
                out.append(f"{value.package} {value.version} pins {mine.package or other}{spec}")
    return tuple(out)


def is_forced(matrix: Matrix, assignment: Mapping[str, str]) -> bool:
    """Whether the cell's axis pins are also uv overrides (see the module docstring)."""
    if matrix.install.force is not None:
        if matrix.install.force:
            return True
    elif FORCING_AXES.intersection(assignment):
        return True
    return any(rule.kind == RuleKind.FORCE and rule.matches(assignment) for rule in matrix.rules)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.+]", "", text)


def cell_id(values: tuple[AxisValue, ...]) -> str:
    """Readable and stable: ``torch2.9.1-sglkernel0.3.21-flashinfer0.6.4-cuda12.8``.

    Axis names lose their dashes so that nox's ``-k`` (Python names) can match ``sglkernel0``.
    """
    return "-".join(f"{_slug(v.axis)}{v.version}" for v in values)


def _na_reason(matrix: Matrix, assignment: Mapping[str, str], values: tuple[AxisValue, ...]) -> str | None:
    for rule in matrix.rules:
        if rule.kind == RuleKind.EXCLUDE and rule.matches(assignment):
            return rule.reason
    cuda = assignment.get(CUDA_AXIS)
    if cuda is not None:
        for v in values:
            if v.cuda and not cuda_compatible(v.cuda, cuda):
                return f"{v.package or v.axis} {v.version} is built for CUDA {v.cuda}, this column is CUDA {cuda}"
    return None


def _expectation(matrix: Matrix, assignment: Mapping[str, str]) -> tuple[str | None, str]:
    for rule in matrix.rules:
        if rule.kind in (RuleKind.EXPECT, RuleKind.INCLUDE) and rule.expect and rule.matches(assignment):
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
    stacks = shipped_stacks(matrix)
    near = [r for r in matrix.rules if r.kind == RuleKind.NEIGHBOURS]
    if near and not stacks:
        lock = matrix.lock.path if matrix.lock else "matrix.lock (there is none)"
        raise ConfigError(
            matrix.path,
            [
                f"rules.neighbours: {lock} names no shipped stack of this matrix (a release whose exact pins give "
                "every package axis a version the matrix has, as sglang's do); add an sglang axis, or the "
                "versions its releases pin, or remove the rule"
            ],
        )
    cells: dict[str, Cell] = {}
    for combo in itertools.product(*(axis.values for axis in matrix.axes)):
        values = tuple(combo)
        assignment = {v.axis: v.version for v in values}
        cid = cell_id(values)
        expect, why = _expectation(matrix, assignment)
        na = _na_reason(matrix, assignment, values)
        if na is None and near:
            na = _too_far(near, assignment, stacks)
        cells[cid] = _cell(matrix, cid, values, assignment, stacks, na=na, expect=expect, why=why)
    for rule in matrix.rules:
        if rule.kind != RuleKind.INCLUDE:
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
        cells[cid] = _cell(matrix, cid, vt, assignment, stacks, na=None, expect=expect, why=why)
    return list(cells.values())


def planned(matrix: Matrix, cells: list[Cell] | None = None) -> Planned:
    """What a run of *matrix* plans, as the store records it (*cells*: ``expand(matrix)`` when given)."""
    return Planned(
        path=matrix.path,
        name=matrix.name,
        report={
            "rows": tuple(matrix.report.rows),
            "columns": tuple(matrix.report.columns),
            "tables": tuple(matrix.report.tables),
        },
        axes={a.name: tuple(v.version for v in a.values) for a in matrix.axes},
        cells=tuple(
            PlannedCell(id=c.id, axes=c.axes, na=c.na, expect=c.expect, expect_reason=c.expect_reason)
            for c in (expand(matrix) if cells is None else cells)
        ),
    )


def _too_far(rules: list[Rule], assignment: Mapping[str, str], stacks: tuple[Stack, ...]) -> str | None:
    nearest = min(distance(assignment, s) for s in stacks)
    for rule in rules:
        if nearest > rule.distance:
            axes = "one axis" if rule.distance == 1 else f"{rule.distance} axes"
            return rule.reason or (
                f"more than {axes} away from every shipped stack ("
                + "; ".join(f"{s.release}: {s.label}" for s in stacks)
                + ")"
            )
    return None


def _cell(
    matrix: Matrix,
    cid: str,
    values: tuple[AxisValue, ...],
    assignment: Mapping[str, str],
    stacks: tuple[Stack, ...],
    *,
    na: str | None,
    expect: str | None,
    why: str,
) -> Cell:
    shipped = next((s.release for s in stacks if distance(assignment, s) == 0), "")
    return Cell(
        id=cid,
        values=values,
        na=na,
        expect=expect,
        expect_reason=why,
        force=is_forced(matrix, assignment),
        shipped=shipped,
        conflicts=conflicts(matrix, values),
    )
