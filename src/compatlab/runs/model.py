"""Results: the states of stages and cells, and the versioned JSON shapes of a run's files.

A run folder holds three kinds of file, each with its own ``schema`` string (see runs/store.py):

- ``run.json`` (RUN_SCHEMA): who started the run, when, on which host, for which matrix (a RunInfo,
  runs/info.py);
- ``cells/<id>.json`` (CELL_SCHEMA): one CellResult, written as the cell finishes;
- ``results.json`` (SCHEMA): the run's metadata and every cell, what renderers read; ``reports/latest/``
  holds the newest run's, with the cells it did not run kept from older runs (each names its ``run``).

``from_json`` is strict (runs/shape.py): every key is known and of its type, states are one of the enums'
values, numbers are finite; a bad shape raises ShapeError with every problem at once, each with its key path
(``stages[1].state: expected one of pass, warn, fail, error, skip, got 'ok'``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from enum import StrEnum
from typing import Any

from compatlab.incell.causes import CAUSES
from compatlab.runs.info import RunInfo
from compatlab.runs.shape import Shape, ShapeError, show, whole

__all__ = [
    "CELL_SCHEMA",
    "CELL_STATES",
    "RUN_SCHEMA",
    "SCHEMA",
    "STAGE_STATES",
    "UNREADABLE",
    "Blame",
    "CellResult",
    "CellState",
    "Expectation",
    "InstallRecord",
    "Results",
    "RunInfo",
    "ShapeError",
    "StageResult",
    "StageState",
    "cell_state",
]

SCHEMA = "compatlab.results/1"
CELL_SCHEMA = "compatlab.runs.cell/1"
RUN_SCHEMA = "compatlab.runs.run/1"
# The reason of a cell whose file could not be read: an error cell, never a dropped one.
UNREADABLE = "unreadable result: "


class StageState(StrEnum):
    """pass: ran and passed; warn: passed with something worth reading; fail: incompatible;
    error: the lab or infrastructure failed; skip: could not run here (the reason says why)."""

    PASS = "pass"  # noqa: S105 - a state, not a password
    WARN = "warn"
    FAIL = "fail"
    ERROR = "error"
    SKIP = "skip"


class CellState(StrEnum):
    """See DESIGN.md, 'Cell states'."""

    PASS = "pass"  # noqa: S105 - a state, not a password
    FAIL = "fail"
    PARTIAL = "partial"
    ERROR = "error"
    NA = "n/a"


STAGE_STATES: tuple[str, ...] = tuple(s.value for s in StageState)
CELL_STATES: tuple[str, ...] = tuple(s.value for s in CellState)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class StageResult:
    """One stage of one cell, built once by its stage (``dataclasses.replace`` makes a changed copy)."""

    name: str
    state: StageState
    reason: str = ""
    details: dict[str, Any] = dataclasses.field(default_factory=dict)
    seconds: float = 0.0
    # A skipped stage that a full verdict needs (a GPU stage on a CPU box) makes the cell partial.
    required: bool = True
    cause: str = ""  # a code of incell/causes.py for a result that is not green (stages/blame.py)

    def __post_init__(self) -> None:
        # A state read from a suite's or a rank's JSON arrives as its string; it is held as the enum, and a
        # value outside it is refused here rather than written into a result.
        object.__setattr__(self, "state", StageState(self.state))
        if self.cause and self.cause not in CAUSES:
            raise ValueError(f"stage {self.name}: cause {self.cause!r} is not a code of incell/causes.py")

    @property
    def ok(self) -> bool:
        """Passed, with or without something worth reading."""
        return self.state in (StageState.PASS, StageState.WARN)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "state": self.state.value,
            "reason": self.reason,
            "details": self.details,
            "seconds": self.seconds,
            "required": self.required,
            **({"cause": self.cause} if self.cause else {}),
        }

    @classmethod
    def from_json(cls, data: object, *, where: str = "") -> StageResult:
        return whole(cls._read, data, where)

    @classmethod
    def _read(cls, data: object, where: str, problems: list[str]) -> StageResult | None:
        sh = Shape(
            data,
            where,
            problems,
            required=("name", "state"),
            optional=("reason", "details", "seconds", "required", "cause"),
        )
        if not sh.ok:
            return None
        cause = sh.text("cause")
        if cause and cause not in CAUSES:
            sh.say("cause", f"expected a code of the cause table, got {cause!r}")
            cause = ""
        return cls(
            name=sh.text("name"),
            state=StageState(sh.choice("state", STAGE_STATES)),
            reason=sh.text("reason"),
            details=sh.table("details"),
            seconds=sh.number("seconds"),
            required=sh.flag("required", True),
            cause=cause,
        )


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Blame:
    """One independent cause of a red cell: the stage that found it, its code, and its one line."""

    stage: str
    code: str
    reason: str

    def to_json(self) -> dict[str, str]:
        return {"stage": self.stage, "code": self.code, "reason": self.reason}


INSTALL_KEYS = (
    "argv",
    "files",
    "requirements",
    "overrides",
    "forced",
    "pre_argv",
    "shipped",
    "conflicts",
    "existing",
    "python",
)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class InstallRecord:
    """What the install stage ran for a cell, credentials never among it (see envs.InstallPlan).

    ``argv`` and ``pre_argv`` (a forced cell's first install) are the commands; ``files`` the spec files
    written beside the venv, by name; ``requirements`` and ``overrides`` the pins; ``forced`` whether the
    cell was installed against its packages' own pins; ``shipped`` the shipped stack a forced cell departs
    from; ``conflicts`` what uv said the pins conflict on (None: not asked). An existing environment
    (``compatlab check``) installs nothing: ``existing`` is its prefix and ``python`` its interpreter.
    """

    argv: tuple[str, ...] = ()
    files: dict[str, str] = dataclasses.field(default_factory=dict)
    requirements: tuple[str, ...] = ()
    overrides: tuple[str, ...] = ()
    forced: bool = False
    pre_argv: tuple[str, ...] = ()
    shipped: str = ""
    conflicts: tuple[str, ...] | None = None
    existing: str = ""
    python: str = ""

    def to_json(self) -> dict[str, Any]:
        if self.existing:
            return {"existing": self.existing, "python": self.python}
        out: dict[str, Any] = {
            "argv": list(self.argv),
            "files": dict(self.files),
            "requirements": list(self.requirements),
            "overrides": list(self.overrides),
            "forced": self.forced,
        }
        if self.pre_argv:
            out["pre_argv"] = list(self.pre_argv)
        if self.shipped:
            out["shipped"] = self.shipped
        if self.conflicts is not None:
            out["conflicts"] = list(self.conflicts)
        return out

    @classmethod
    def from_json(cls, data: object, *, where: str = "") -> InstallRecord:
        return whole(cls._read, data, where)

    @classmethod
    def _read(cls, data: object, where: str, problems: list[str]) -> InstallRecord | None:
        sh = Shape(data, where, problems, required=(), optional=INSTALL_KEYS)
        if not sh.ok:
            return None
        conflicts = tuple(sh.strings("conflicts")) if sh.data.get("conflicts") is not None else None
        return cls(
            argv=tuple(sh.strings("argv")),
            files=sh.string_table("files"),
            requirements=tuple(sh.strings("requirements")),
            overrides=tuple(sh.strings("overrides")),
            forced=sh.flag("forced", False),
            pre_argv=tuple(sh.strings("pre_argv")),
            shipped=sh.text("shipped"),
            conflicts=conflicts,
            existing=sh.text("existing"),
            python=sh.text("python"),
        )


# The reason of each stage a preflight (`--until`, `--stages`) left out: a cell with one is a thinner verdict.
PREFLIGHT = "not run: preflight stopped after"


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Expectation:
    """A known-bad (or known-good) cell's expected verdict, from matrix.toml's ``[[expect]]``."""

    state: CellState
    reason: str = ""

    def to_json(self) -> dict[str, str]:
        return {"state": self.state.value, "reason": self.reason}


def cell_state(stages: Iterable[StageResult]) -> CellState:
    """Fold stage states into the cell state (see DESIGN.md, 'Cell states').

    An incompatibility wins over an infrastructure error: a red reason is never hidden as grey.
    """
    states = [(s.state, s.required) for s in stages]
    if not states:
        return CellState.ERROR
    if any(st == StageState.FAIL for st, _ in states):
        return CellState.FAIL
    if any(st == StageState.ERROR for st, _ in states):
        return CellState.ERROR
    if any(st == StageState.SKIP and req for st, req in states):
        return CellState.PARTIAL
    return CellState.PASS


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class CellResult:
    """One combination's verdict with everything needed to explain it, built once when its cell ends."""

    id: str
    axes: dict[str, str]
    state: CellState
    expected: Expectation | None = None  # a known-bad cell's expected verdict
    unexpected: bool = False
    stages: tuple[StageResult, ...] = ()
    install: InstallRecord | None = None  # None: nothing was installed (an n/a cell, an existing environment)
    freeze: tuple[str, ...] = ()
    started: str = ""
    finished: str = ""
    seconds: float = 0.0
    attempts: int = 1
    reason: str = ""  # the first failing stage's reason, for the grid
    causes: tuple[Blame, ...] = ()  # every independent cause of a red cell, the one that blocks most first
    # The stage that explains the cell's colour (runs/verdict.py decides it once, when the cell ends); '' for a
    # green or n/a cell, and in a record written before the lab recorded it.
    culprit: str = ""
    # In reports/latest, a cell the newest run did not run is kept from an older one: that run's id.
    run: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "state", CellState(self.state))

    @property
    def preflight(self) -> bool:
        """A preflight's verdict (`--until`/`--stages` left stages out): thinner than one of the whole
        pipeline, which reports/latest keeps over it."""
        return any(s.state == StageState.SKIP and s.reason.startswith(PREFLIGHT) for s in self.stages)

    @property
    def unreadable(self) -> bool:
        """The store could not read this cell's file: the question is unanswered, and the run says so."""
        return self.state == CellState.ERROR and self.reason.startswith(UNREADABLE)

    def stage(self, name: str) -> StageResult | None:
        """This cell's result of the stage *name*, if it ran."""
        return next((s for s in self.stages if s.name == name), None)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "id": self.id,
            "axes": dict(self.axes),
            "state": self.state.value,
            "expected": self.expected.to_json() if self.expected is not None else None,
            "unexpected": self.unexpected,
            "stages": [s.to_json() for s in self.stages],
            "install": self.install.to_json() if self.install is not None else {},
            "freeze": list(self.freeze),
            "started": self.started,
            "finished": self.finished,
            "seconds": self.seconds,
            "attempts": self.attempts,
            "reason": self.reason,
        }
        if self.causes:
            data["causes"] = [b.to_json() for b in self.causes]
        if self.culprit:
            data["culprit"] = self.culprit
        if self.run:  # otherwise the run of the file it is in
            data["run"] = self.run
        return data

    @classmethod
    def from_json(cls, data: object, *, where: str = "") -> CellResult:
        return whole(cls._read, data, where)

    @classmethod
    def _read(cls, data: object, where: str, problems: list[str]) -> CellResult | None:
        sh = Shape(
            data,
            where,
            problems,
            required=("id", "axes", "state"),
            optional=(
                "expected",
                "unexpected",
                "stages",
                "install",
                "freeze",
                "started",
                "finished",
                "seconds",
                "attempts",
                "reason",
                "causes",
                "culprit",
                "run",
            ),
        )
        if not sh.ok:
            return None
        cell_id = sh.text("id")
        if sh.has("id") and not cell_id:
            sh.say("id", "expected a cell id, got ''")
        expected: Expectation | None = None
        if sh.data.get("expected") is not None:
            ex = Shape(sh.data["expected"], sh.path("expected"), problems, required=("state",), optional=("reason",))
            if ex.ok:
                expected = Expectation(state=CellState(ex.choice("state", CELL_STATES)), reason=ex.text("reason"))
        raw_stages = sh.data.get("stages", [])
        stages: list[StageResult] = []
        if isinstance(raw_stages, list):
            for i, raw in enumerate(raw_stages):
                stage = StageResult._read(raw, f"{sh.path('stages')}[{i}]", problems)
                if stage is not None:
                    stages.append(stage)
        else:
            sh.say("stages", f"expected a list of stages, got {show(raw_stages)}")
        culprit = sh.text("culprit")
        if culprit and not any(s.name == culprit for s in stages):
            sh.say("culprit", f"expected the name of one of the cell's stages, got {culprit!r}")
        install = (
            InstallRecord._read(sh.data["install"], sh.path("install"), problems) if sh.data.get("install") else None
        )
        return cls(
            id=cell_id,
            axes=sh.string_table("axes"),
            state=CellState(sh.choice("state", CELL_STATES)),
            expected=expected,
            unexpected=sh.flag("unexpected", False),
            stages=tuple(stages),
            install=install,
            freeze=tuple(sh.strings("freeze")),
            started=sh.text("started"),
            finished=sh.text("finished"),
            seconds=sh.number("seconds"),
            attempts=sh.integer("attempts", 1, minimum=1),
            reason=sh.text("reason"),
            causes=_blames(sh.data.get("causes"), sh, problems),
            culprit=culprit,
            run=sh.text("run"),
        )


def _blames(raw: object, sh: Shape, problems: list[str]) -> tuple[Blame, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        sh.say("causes", f"expected a list of causes, got {show(raw)}")
        return ()
    out: list[Blame] = []
    for i, item in enumerate(raw):
        b = Shape(item, f"{sh.path('causes')}[{i}]", problems, required=("stage", "code", "reason"), optional=())
        if b.ok:
            code = b.text("code")
            if code not in CAUSES:
                b.say("code", f"expected a code of the cause table, got {code!r}")
                continue
            out.append(Blame(stage=b.text("stage"), code=code, reason=b.text("reason")))
    return tuple(out)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Results:
    """results.json: a run and its cells, in the matrix's order."""

    run: RunInfo
    cells: tuple[CellResult, ...]

    @property
    def unreadable(self) -> tuple[CellResult, ...]:
        return tuple(c for c in self.cells if c.unreadable)

    @property
    def by_id(self) -> dict[str, CellResult]:
        return {c.id: c for c in self.cells}

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "run": self.run.to_json(), "cells": [c.to_json() for c in self.cells]}

    @classmethod
    def from_json(cls, data: object) -> Results:
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            got = show(data.get("schema")) if isinstance(data, dict) else f"{type(data).__name__}"
            raise ShapeError([f"schema: expected {SCHEMA!r}, got {got}"])
        problems: list[str] = []
        Shape(data, "", problems, required=("schema", "run", "cells"), optional=())
        run = RunInfo.read(data["run"], "run", problems) if "run" in data else None
        raw_cells = data.get("cells", [])
        cells: list[CellResult] = []
        if not isinstance(raw_cells, list):
            problems.append(f"cells: expected a list, got {show(raw_cells)}")
            raw_cells = []
        for i, raw in enumerate(raw_cells):
            cid = raw.get("id") if isinstance(raw, dict) else None
            mine: list[str] = []
            cell = CellResult._read(raw, "", mine)
            where = f"cells[{i}]" + (f" ({cid})" if isinstance(cid, str) and cid else "")
            problems.extend(f"{where}: {p}" for p in mine)
            if cell is not None and not mine:
                cells.append(cell)
        if problems or run is None:
            raise ShapeError(problems)
        return cls(run=run, cells=tuple(cells))
