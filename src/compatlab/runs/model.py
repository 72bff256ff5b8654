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
import json
import math
import os
import tempfile
from collections.abc import Iterable
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any

__all__ = [
    "CELL_SCHEMA",
    "CELL_STATES",
    "RUN_SCHEMA",
    "SCHEMA",
    "STAGE_STATES",
    "UNREADABLE",
    "CellResult",
    "CellState",
    "Results",
    "RunInfo",
    "ShapeError",
    "StageResult",
    "StageState",
    "cell_state",
    "write_json_atomic",
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


@dataclasses.dataclass(kw_only=True, slots=True)
class StageResult:
    """One stage of one cell. ``state`` takes a StageState or its string value and holds the StageState."""

    name: str
    state: str
    reason: str = ""
    details: dict[str, Any] = dataclasses.field(default_factory=dict)
    seconds: float = 0.0
    # A skipped stage that a full verdict needs (a GPU stage on a CPU box) makes the cell partial.
    required: bool = True

    def __post_init__(self) -> None:
        self.state = StageState(self.state)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: object, *, where: str = "") -> StageResult:
        problems: list[str] = []
        stage = cls._read(data, where, problems)
        if problems or stage is None:
            raise ShapeError(problems)
        return stage

    @classmethod
    def _read(cls, data: object, where: str, problems: list[str]) -> StageResult | None:
        sh = _Shape(
            data, where, problems, required=("name", "state"), optional=("reason", "details", "seconds", "required")
        )
        if not sh.ok:
            return None
        return cls(
            name=sh.text("name"),
            state=sh.choice("state", STAGE_STATES),
            reason=sh.text("reason"),
            details=sh.table("details"),
            seconds=sh.number("seconds"),
            required=sh.flag("required", True),
        )


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


@dataclasses.dataclass(kw_only=True, slots=True)
class CellResult:
    """One combination's verdict with everything needed to explain it.

    Mutable while its cell runs (the runner appends stages); ``state`` holds a CellState.
    """

    id: str
    axes: dict[str, str]
    state: str
    expected: dict[str, str] | None = None  # {"state": "fail", "reason": ...} for known-bad cells
    unexpected: bool = False
    stages: list[StageResult] = dataclasses.field(default_factory=list)
    install: dict[str, Any] = dataclasses.field(default_factory=dict)  # argv, index, overrides
    freeze: list[str] = dataclasses.field(default_factory=list)
    started: str = ""
    finished: str = ""
    seconds: float = 0.0
    attempts: int = 1
    reason: str = ""  # the first failing stage's reason, for the grid
    # In reports/latest, a cell the newest run did not run is kept from an older one: that run's id.
    run: str = ""

    def __post_init__(self) -> None:
        self.state = CellState(self.state)

    @property
    def unreadable(self) -> bool:
        """The store could not read this cell's file: the question is unanswered, and the run says so."""
        return self.state == CellState.ERROR and self.reason.startswith(UNREADABLE)

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["stages"] = [s.to_json() for s in self.stages]
        if not self.run:
            del data["run"]  # the run of the file it is in
        return data

    @classmethod
    def from_json(cls, data: object, *, where: str = "") -> CellResult:
        problems: list[str] = []
        cell = cls._read(data, where, problems)
        if problems or cell is None:
            raise ShapeError(problems)
        return cell

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
                "run",
            ),
        )
        if not sh.ok:
            return None
        cell_id = sh.text("id")
        if sh.has("id") and not cell_id:
            sh.say("id", "expected a cell id, got ''")
        expected = sh.string_table("expected") if sh.data.get("expected") is not None else None
        raw_stages = sh.data.get("stages", [])
        stages: list[StageResult] = []
        if isinstance(raw_stages, list):
            for i, raw in enumerate(raw_stages):
                stage = StageResult._read(raw, f"{sh.path('stages')}[{i}]", problems)
                if stage is not None:
                    stages.append(stage)
        else:
            sh.say("stages", f"expected a list of stages, got {_show(raw_stages)}")
        return cls(
            id=cell_id,
            axes=sh.string_table("axes"),
            state=sh.choice("state", CELL_STATES),
            expected=expected,
            unexpected=sh.flag("unexpected", False),
            stages=stages,
            install=sh.table("install"),
            freeze=sh.strings("freeze"),
            started=sh.text("started"),
            finished=sh.text("finished"),
            seconds=sh.number("seconds"),
            attempts=sh.integer("attempts", 1, minimum=1),
            reason=sh.text("reason"),
            run=sh.text("run"),
        )


def _parse_time(text: str) -> datetime | None:
    try:
        when = datetime.fromisoformat(text)
    except (TypeError, ValueError):
        return None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


REPORT_KEYS = ("rows", "columns", "tables")


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class RunInfo:
    """A run's metadata: run.json, and the ``run`` table of results.json (which adds the layout keys).

    In JSON, a key left out means its default here.
    """

    id: str
    started: str = ""  # ISO time, seconds: for people
    started_ns: int = 0  # time.time_ns() at the start: orders runs that start in the same second
    finished: str | None = None  # the last cell's end; None while nothing has finished
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
    def order(self) -> tuple[int, str]:
        """Which of two runs is newer: the later start, then the larger id."""
        if self.started_ns:
            return (self.started_ns, self.id)
        when = _parse_time(self.started)
        return (int(when.timestamp() * 1e9) if when else 0, self.id)

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
        problems: list[str] = []
        info = cls._read(data, where, problems)
        if problems or info is None:
            raise ShapeError(problems)
        return info

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
        return cls(
            id=sh.text("id"),
            started=sh.text("started"),
            started_ns=sh.integer("started_ns", 0),
            finished=sh.text("finished") if finished is not None else None,
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


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON so that a reader sees the old file or the new one, never half of one.

    For a stage's own outputs (perf.json, benchmark.json); a run folder's files go through runs/store.py.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=2, sort_keys=False)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
