"""Results: the states of stages and cells, and the versioned JSON shapes of a run's files.

A run folder holds three kinds of file, each with its own ``schema`` string (see runs/store.py):

- ``run.json`` (RUN_SCHEMA): who started the run, when, on which host, for which matrix;
- ``cells/<id>.json`` (CELL_SCHEMA): one CellResult, written as the cell finishes;
- ``results.json`` (SCHEMA): the run's metadata and every cell, what renderers read; ``reports/latest/``
  holds the newest run's, with the cells it did not run kept from older runs (each names its ``run``).

``from_json`` is strict: every key is known and of its type, states are one of the enums' values, numbers
are finite; a bad shape raises ShapeError with every problem at once, each with its key path
(``stages[1].state: expected one of pass, warn, fail, error, skip, got 'ok'``).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, TypeVar

from compatlab.incell.causes import CAUSES

__all__ = [
    "CELL_SCHEMA",
    "CELL_STATES",
    "REPORT_DEFAULTS",
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
    "parse_time",
]

SCHEMA = "compatlab.results/1"
CELL_SCHEMA = "compatlab.runs.cell/1"
RUN_SCHEMA = "compatlab.runs.run/1"
# The reason of a cell whose file could not be read: an error cell, never a dropped one.
UNREADABLE = "unreadable result: "
_T = TypeVar("_T")


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


class ShapeError(ValueError):
    """A JSON value that is not the shape of a result; ``problems`` are key paths with what is wrong."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("; ".join(self.problems))


class _Shape:
    """Reads one JSON table against its known keys, collecting problems instead of stopping at the first."""

    def __init__(
        self,
        data: object,
        where: str,
        problems: list[str],
        *,
        required: tuple[str, ...],
        optional: tuple[str, ...],
        what: str = "a table",
    ) -> None:
        self.where, self.problems = where, problems
        self.ok = isinstance(data, dict)
        self.data: dict[str, Any] = data if isinstance(data, dict) else {}
        if not self.ok:
            self.say("", f"expected {what}, got {_show(data)}")
            return
        for key in required:
            if key not in self.data:
                self.say("", f"missing key {key!r}")
        known = required + optional
        for key in self.data:
            if key not in known:
                near = difflib.get_close_matches(str(key), known, n=1)
                self.say("", f"unknown key {key!r}" + (f"; perhaps you meant {near[0]!r}?" if near else ""))

    def path(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def say(self, key: str, message: str) -> None:
        where = self.path(key) if key else self.where
        self.problems.append(f"{where}: {message}" if where else message)

    def has(self, key: str) -> bool:
        return key in self.data

    def text(self, key: str, default: str = "") -> str:
        value = self.data.get(key, default)
        if isinstance(value, str):
            return value
        self.say(key, f"expected a string, got {_show(value)}")
        return default

    def flag(self, key: str, default: bool) -> bool:
        value = self.data.get(key, default)
        if isinstance(value, bool):
            return value
        self.say(key, f"expected true or false, got {_show(value)}")
        return default

    def number(self, key: str, default: float = 0.0) -> float:
        value = self.data.get(key, default)
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            return float(value)
        self.say(key, f"expected a finite number, got {_show(value)}")
        return default

    def integer(self, key: str, default: int, *, minimum: int = 0) -> int:
        value = self.data.get(key, default)
        if isinstance(value, int) and not isinstance(value, bool) and value >= minimum:
            return value
        self.say(key, f"expected a whole number >= {minimum}, got {_show(value)}")
        return default

    def choice(self, key: str, choices: tuple[str, ...]) -> str:
        value = self.data.get(key)
        if isinstance(value, str) and value in choices:
            return value
        if key in self.data:
            self.say(key, f"expected one of {', '.join(choices)}, got {_show(value)}")
        return choices[0]

    def table(self, key: str) -> dict[str, Any]:
        value = self.data.get(key, {})
        if isinstance(value, dict) and all(isinstance(k, str) for k in value):
            return dict(value)
        self.say(key, f"expected a table, got {_show(value)}")
        return {}

    def strings(self, key: str) -> list[str]:
        value = self.data.get(key, [])
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return list(value)
        self.say(key, f"expected a list of strings, got {_show(value)}")
        return []

    def string_table(self, key: str) -> dict[str, str]:
        value = self.data.get(key, {})
        if isinstance(value, dict) and all(isinstance(v, str) for v in value.values()):
            return dict(value)
        self.say(key, f"expected a table of strings, got {_show(value)}")
        return {}


def _whole(read: Callable[[object, str, list[str]], _T | None], data: object, where: str) -> _T:
    """What *read* makes of *data*, or ShapeError with every problem it found."""
    problems: list[str] = []
    value = read(data, where, problems)
    if problems or value is None:
        raise ShapeError(problems)
    return value


def _show(value: object) -> str:
    """A found value for a message: its repr, cut short; containers by kind."""
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "a list"
    if value is None:
        return "null"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


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
        return _whole(cls._read, data, where)

    @classmethod
    def _read(cls, data: object, where: str, problems: list[str]) -> StageResult | None:
        sh = _Shape(
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
        return _whole(cls._read, data, where)

    @classmethod
    def _read(cls, data: object, where: str, problems: list[str]) -> InstallRecord | None:
        sh = _Shape(data, where, problems, required=(), optional=INSTALL_KEYS)
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
        return _whole(cls._read, data, where)

    @classmethod
    def _read(cls, data: object, where: str, problems: list[str]) -> CellResult | None:
        sh = _Shape(
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
            ex = _Shape(sh.data["expected"], sh.path("expected"), problems, required=("state",), optional=("reason",))
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
            sh.say("stages", f"expected a list of stages, got {_show(raw_stages)}")
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


def _blames(raw: object, sh: _Shape, problems: list[str]) -> tuple[Blame, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        sh.say("causes", f"expected a list of causes, got {_show(raw)}")
        return ()
    out: list[Blame] = []
    for i, item in enumerate(raw):
        b = _Shape(item, f"{sh.path('causes')}[{i}]", problems, required=("stage", "code", "reason"), optional=())
        if b.ok:
            code = b.text("code")
            if code not in CAUSES:
                b.say("code", f"expected a code of the cause table, got {code!r}")
                continue
            out.append(Blame(stage=b.text("stage"), code=code, reason=b.text("reason")))
    return tuple(out)


def parse_time(text: str) -> datetime | None:
    """An ISO timestamp as an aware datetime (UTC when it names no zone); None when it is not one."""
    try:
        when = datetime.fromisoformat(text)
    except (TypeError, ValueError):
        return None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


REPORT_KEYS = ("rows", "columns", "tables")
# The layout of a run that records none: config/matrix.py's Report defaults (no columns: every axis the rows
# and tables leave goes in the columns, in the matrix's order). A test holds the two together.
REPORT_DEFAULTS: dict[str, tuple[str, ...]] = {"rows": ("torch",), "columns": (), "tables": ("cuda",)}


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class RunInfo:
    """A run's metadata: run.json, and the ``run`` table of results.json (which adds the layout keys).

    In JSON, a key left out means its default here.
    """

    id: str
    started: str = ""  # ISO time, seconds: for people
    started_ns: int = 0  # time.time_ns() at the start: orders runs that start in the same second
    finished: str | None = None  # the last cell's end; None while nothing has finished
    # Whether the run ran to its end: False from its claim until its owner finishes it (store's RunFolder.finish),
    # so it stays False in a run that was interrupted; None in a run of a lab before this key (see ``done``).
    complete: bool | None = None
    matrix: str = ""
    matrix_name: str = ""
    host: dict[str, Any] = dataclasses.field(default_factory=dict)
    owner: str = ""  # "host:pid:token" of the process holding the run's lock (run.json only)
    shards: tuple[str, ...] = ()  # a merged run: the shard folders and their hosts
    hosts: tuple[dict[str, Any], ...] = ()
    report: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)  # rows, columns, tables
    axes: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    planned: tuple[str, ...] = ()

    @property
    def rows(self) -> tuple[str, ...]:
        """The axes of the grid's rows, as the run records them, else the default (REPORT_DEFAULTS)."""
        return self.report.get("rows", REPORT_DEFAULTS["rows"])

    @property
    def columns(self) -> tuple[str, ...]:
        return self.report.get("columns", REPORT_DEFAULTS["columns"])

    @property
    def tables(self) -> tuple[str, ...]:
        """The axes that split the run into one grid per value."""
        return self.report.get("tables", REPORT_DEFAULTS["tables"])

    @property
    def order(self) -> tuple[int, str]:
        """Which of two runs is newer: the later start, then the larger id. The one definition: the store's
        ``latest/``, the history's "since the previous run" and the published index all order by it."""
        if self.started_ns:
            return (self.started_ns, self.id)
        when = parse_time(self.started)
        return (int(when.timestamp() * 1e9) if when else 0, self.id)

    @property
    def done(self) -> bool:
        """Whether the run is finished: its owner said so; a run of a lab before ``complete``, once a cell ended."""
        return self.complete if self.complete is not None else self.finished is not None

    def same_matrix(self, other: RunInfo) -> bool:
        """Whether two runs are of one matrix: by its name where both record one, else by its file."""
        if self.matrix_name and other.matrix_name:
            return self.matrix_name == other.matrix_name
        return not (self.matrix and other.matrix) or self.matrix == other.matrix

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            default = field.default_factory() if field.default_factory is not dataclasses.MISSING else field.default
            if field.name == "id" or value != default:
                out[field.name] = value
        for key in ("shards", "hosts", "planned"):
            if key in out:
                out[key] = list(out[key])
        if "report" in out:
            out["report"] = {k: list(v) for k, v in self.report.items()}
        if "axes" in out:
            out["axes"] = {k: list(v) for k, v in self.axes.items()}
        return out

    @classmethod
    def from_json(cls, data: object, *, where: str = "") -> RunInfo:
        return _whole(cls._read, data, where)

    @classmethod
    def _read(cls, data: object, where: str, problems: list[str]) -> RunInfo | None:
        names = tuple(f.name for f in dataclasses.fields(cls))
        sh = _Shape(data, where, problems, required=("id",), optional=names[1:], what="a table of run metadata")
        if not sh.ok:
            return None
        report: dict[str, tuple[str, ...]] = {}
        raw_report = sh.data.get("report", {})
        rep = _Shape(raw_report, sh.path("report"), problems, required=(), optional=REPORT_KEYS)
        for part in REPORT_KEYS:
            if part in rep.data:
                value = rep.data[part]
                if isinstance(value, str):
                    report[part] = (value,)
                elif isinstance(value, list) and all(isinstance(v, str) for v in value):
                    report[part] = tuple(value)
                else:
                    rep.say(part, f"expected a list of axis names, got {_show(value)}")
        axes: dict[str, tuple[str, ...]] = {}
        for name, values in sh.table("axes").items():
            if isinstance(values, list) and all(isinstance(v, str) for v in values):
                axes[name] = tuple(values)
            else:
                sh.say(f"axes.{name}", f"expected a list of versions, got {_show(values)}")
        hosts = sh.data.get("hosts", [])
        if not (isinstance(hosts, list) and all(isinstance(h, dict) for h in hosts)):
            sh.say("hosts", f"expected a list of tables, got {_show(hosts)}")
            hosts = []
        finished = sh.data.get("finished")
        complete = sh.data.get("complete")
        return cls(
            id=sh.text("id"),
            started=sh.text("started"),
            started_ns=sh.integer("started_ns", 0),
            finished=sh.text("finished") if finished is not None else None,
            complete=sh.flag("complete", False) if complete is not None else None,
            matrix=sh.text("matrix"),
            matrix_name=sh.text("matrix_name"),
            host=sh.table("host"),
            owner=sh.text("owner"),
            shards=tuple(sh.strings("shards")),
            hosts=tuple(hosts),
            report=report,
            axes=axes,
            planned=tuple(sh.strings("planned")),
        )


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
            got = _show(data.get("schema")) if isinstance(data, dict) else f"{type(data).__name__}"
            raise ShapeError([f"schema: expected {SCHEMA!r}, got {got}"])
        problems: list[str] = []
        _Shape(data, "", problems, required=("schema", "run", "cells"), optional=())
        run = RunInfo._read(data["run"], "run", problems) if "run" in data else None
        raw_cells = data.get("cells", [])
        cells: list[CellResult] = []
        if not isinstance(raw_cells, list):
            problems.append(f"cells: expected a list, got {_show(raw_cells)}")
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
