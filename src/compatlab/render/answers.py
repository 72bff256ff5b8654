"""Answers above the grid: the newest stack that works, and for every red cell the nearest one that does.

A box owner's question is the next upgrade. From a run's cells alone:

- **The newest working stack**: among the cells that passed (green) or passed everything this machine
  could check (amber: no GPU ran), the newest, comparing the grid's axes in the matrix's order (the first
  axis dominates: with an ``sglang`` axis first, the newest SGLang wins, then its torch …), each by its
  PEP 440 version. A stack that installs without force wins over any forced one (a forced stack breaks
  pins its own releases declare: a box owner's ``pip install`` would not give it); only where every
  working cell is forced is the answer a forced stack, and it says so, naming the pins it breaks (the pins
  stage's ``broken_requirements``, else the lock's ``install.conflicts``). The answer gives its exact
  install command, as the cell ran it. Results hold one verdict per cell for every target of the matrix
  together, so this is the answer for all its targets.
- **For every red cell, its nearest green neighbour**: a working cell that differs on exactly one axis,
  the ``tables`` axes (the CUDA column) apart, which follow the component that moved: "torch 2.15.0 fails
  at import (…); torch 2.14.1 passes". Of several, the one whose changed version is closest in the axis's
  order, then the newer.

The install record of a cell says whether it was "shipped together" (``install.shipped``: a release's
own pinned stack) and "forced" (``install.forced`` with the pins it broke in ``install.conflicts``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from packaging.version import InvalidVersion, Version

from compatlab.render._grid import install_command, label, reason
from compatlab.render.text import one_line
from compatlab.runs.model import CellResult, CellState, Results
from compatlab.runs.records.pins import PinsDetails
from compatlab.runs.verdict import culprit

__all__ = ["Answers", "Neighbour", "answers", "answers_json", "broken_pins", "forced_marks", "is_forced", "shipped"]

GREEN = (CellState.PASS, CellState.PARTIAL)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Neighbour:
    """A red cell and its nearest working cell one axis away (``green`` None: there is none)."""

    red: CellResult
    green: CellResult | None
    axis: str = ""
    sentence: str = ""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Answers:
    newest: CellResult | None
    command: str | None
    neighbours: tuple[Neighbour, ...]
    breaks: tuple[str, ...] = ()  # a forced answer: the pins it breaks


def broken_pins(cell: CellResult) -> list[str]:
    """The pins a forced cell's installed set breaks: what its pins stage found (``uv pip check``'s view),
    else what the lock said its releases pin (``install.conflicts``)."""
    for stage in cell.stages:
        if stage.name == "pins":
            found = PinsDetails.of(stage).broken_requirements
            if found:
                return [b.text for b in found]
    return forced_marks(cell)


def portable_command(cell: CellResult) -> str | None:
    """The stack as a command a box owner runs in their own venv (no paths of this machine): the pins as
    uv got them and, for a forced cell, the same pins as overrides (a file made on the spot). Packages
    from their own index say so in the cell's install spec. Else the install as the cell ran it."""
    import shlex

    if cell.install is None or not cell.install.requirements:
        return install_command(cell)
    requirements, overrides = cell.install.requirements, cell.install.overrides
    command = shlex.join(["uv", "pip", "install", *requirements])
    if overrides:
        command = (
            shlex.join(["printf", r"%s\n", *overrides]) + " > overrides.txt && " + command + " --override overrides.txt"
        )
    return command


def shipped(cell: CellResult) -> str:
    """The release whose own pinned stack this cell is (``sglang 0.5.23``), or ''."""
    return cell.install.shipped if cell.install is not None else ""


def is_forced(cell: CellResult) -> bool:
    """Installed with its axis pins as overrides, against a pin of its own releases (or pins unknown)."""
    if cell.install is None or not cell.install.forced:
        return False
    return cell.install.conflicts is None or bool(cell.install.conflicts)


def forced_marks(cell: CellResult) -> list[str]:
    """The pins a forced cell broke, for a tooltip: ``sglang 0.5.23 pins torch==2.14.1``."""
    return list(cell.install.conflicts or ()) if cell.install is not None else []


def _version(text: str) -> tuple[int, Version | str]:
    try:
        return (1, Version(text))
    except InvalidVersion:
        return (0, text)


def _axes(run: Results) -> list[str]:
    """The axes compared, in the matrix's order: every axis of the run but its ``tables`` axes."""
    names = list(run.run.axes) or [a for c in run.cells for a in c.axes]
    return [a for a in dict.fromkeys(names) if a not in run.run.tables]


def _newness(cell: CellResult, axes: list[str]) -> tuple[Any, ...]:
    return tuple(_version(cell.axes.get(a, "")) for a in axes)


def _state_word(cell: CellResult) -> str:
    return "passes" if cell.state == CellState.PASS else "passes what ran here (partial: no GPU stage ran)"


def _neighbour(red: CellResult, green: list[CellResult], axes: list[str], run: Results) -> Neighbour:
    found: list[tuple[int, str, CellResult]] = []
    for cell in green:
        differ = [a for a in axes if cell.axes.get(a) != red.axes.get(a)]
        if len(differ) != 1:
            continue
        axis = differ[0]
        order = list(run.run.axes.get(axis, ())) or sorted({c.axes.get(axis, "") for c in run.cells}, key=_version)
        here, there = red.axes.get(axis, ""), cell.axes.get(axis, "")
        gap = abs(order.index(here) - order.index(there)) if here in order and there in order else len(order)
        found.append((gap, axis, cell))
    if not found:
        return Neighbour(red=red, green=None, sentence=f"{label(red.axes)}: no working cell one axis away")
    closest = min(f[0] for f in found)
    _, axis, cell = max((f for f in found if f[0] == closest), key=lambda f: _newness(f[2], axes))
    stage = culprit(red)
    why = one_line(reason(red))
    at = f" at {stage.name}" if stage is not None else ""
    rest = label({a: v for a, v in red.axes.items() if a != axis and a not in run.run.tables})
    sentence = (
        f"{axis} {red.axes.get(axis, '')} fails{at}"
        + (f" ({why})" if why else "")
        + f" with {rest}; {axis} {cell.axes.get(axis, '')} {_state_word(cell)}"
    )
    return Neighbour(red=red, green=cell, axis=axis, sentence=sentence)


def answers(run: Results) -> Answers:
    """The answers of *run* (see the module docstring)."""
    axes = _axes(run)
    green = [c for c in run.cells if c.state in GREEN]
    newest = max(green, key=lambda c: (not is_forced(c), _newness(c, axes), c.state == CellState.PASS), default=None)
    reds = [c for c in run.cells if c.state == CellState.FAIL]
    breaks = tuple(broken_pins(newest)) if newest is not None and is_forced(newest) else ()
    return Answers(
        newest=newest,
        command=portable_command(newest) if newest is not None else None,
        neighbours=tuple(_neighbour(r, green, axes, run) for r in reds),
        breaks=breaks,
    )


def _cell_json(cell: CellResult) -> dict[str, Any]:
    return {
        "id": cell.id,
        "axes": dict(cell.axes),
        "state": cell.state,
        "shipped": shipped(cell),
        "forced": is_forced(cell),
    }


def answers_json(run: Results) -> dict[str, Any]:
    """answers.json: what the page and compat.md say above the grid, for tools."""
    found = answers(run)
    newest: Mapping[str, Any] | None = None
    if found.newest is not None:
        newest = {**_cell_json(found.newest), "command": found.command, "breaks": list(found.breaks)}
    return {
        "schema": "compatlab.answers/1",
        "run": run.run.id,
        "newest": newest,
        "neighbours": [
            {
                "red": _cell_json(n.red),
                "green": _cell_json(n.green) if n.green else None,
                "axis": n.axis,
                "sentence": n.sentence,
            }
            for n in found.neighbours
        ],
    }
