"""A run's metadata (run.json, and the ``run`` table of results.json) and which of two runs is newer.

``RunInfo.order`` is the one definition of newer: the later start (``started_ns``, the nanoseconds of
``time.time_ns()``; else ``started``, an ISO time read as UTC when it names no zone), then the larger id.
``done`` is whether the run ran to its end (``complete``, or, in a run of a lab before that key, whether a cell
finished); ``same_matrix`` compares matrix names where both runs record one, else their files. The grid's
layout is the run's ``report`` (rows, columns, tables), else REPORT_DEFAULTS. In JSON, a key left out means
its default.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import Any

from compatlab.runs.shape import Shape, show, whole

__all__ = ["REPORT_DEFAULTS", "REPORT_KEYS", "RunInfo", "parse_time"]


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
        return whole(cls.read, data, where)

    @classmethod
    def read(cls, data: object, where: str, problems: list[str]) -> RunInfo | None:
        """What *data* says, its problems added to *problems* under *where* (results.json's ``run``); None when
        it is not a table."""
        names = tuple(f.name for f in dataclasses.fields(cls))
        sh = Shape(data, where, problems, required=("id",), optional=names[1:], what="a table of run metadata")
        if not sh.ok:
            return None
        report: dict[str, tuple[str, ...]] = {}
        raw_report = sh.data.get("report", {})
        rep = Shape(raw_report, sh.path("report"), problems, required=(), optional=REPORT_KEYS)
        for part in REPORT_KEYS:
            if part in rep.data:
                value = rep.data[part]
                if isinstance(value, str):
                    report[part] = (value,)
                elif isinstance(value, list) and all(isinstance(v, str) for v in value):
                    report[part] = tuple(value)
                else:
                    rep.say(part, f"expected a list of axis names, got {show(value)}")
        axes: dict[str, tuple[str, ...]] = {}
        for name, values in sh.table("axes").items():
            if isinstance(values, list) and all(isinstance(v, str) for v in values):
                axes[name] = tuple(values)
            else:
                sh.say(f"axes.{name}", f"expected a list of versions, got {show(values)}")
        hosts = sh.data.get("hosts", [])
        if not (isinstance(hosts, list) and all(isinstance(h, dict) for h in hosts)):
            sh.say("hosts", f"expected a list of tables, got {show(hosts)}")
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
