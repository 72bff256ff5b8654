"""matrix.toml: load, validate (every problem at once), and model as frozen dataclasses.

A matrix is the product of its axes (config/axes.py: the axis-kind table, the axes and ``[axes]``), with its
rules (config/rules.py), the install, the targets, the grid's layout and the [perf], [serve] and
[thresholds] sections. The product is counted from the axis sizes before anything expands, and refused
above ``max-cells``.
"""

from __future__ import annotations

import dataclasses
import math
import re
import tomllib
from collections.abc import Mapping, Sequence, Set
from pathlib import Path
from typing import Any

from compatlab.config.axes import (
    AXIS_KINDS,
    CUDA_AXIS,
    PYTHON_AXIS,
    REQUIRED_AXES,
    Axis,
    Locking,
    Role,
    cuda_compatible,
    parse_axes,
)
from compatlab.config.check import Checker, field_default, show
from compatlab.config.lock import Lock, Selector, axes_digest, load_lock, lock_path
from compatlab.config.perf import PerfConfig, parse_perf_section
from compatlab.config.rules import Rule, parse_rules
from compatlab.config.serve import ServeConfig, parse_serve_section
from compatlab.config.thresholds import Thresholds, parse_thresholds
from compatlab.errors import ConfigError
from compatlab.incell import cudacompat

__all__ = [
    "DEFAULT_MAX_CELLS",
    "SCHEMA_VERSION",
    "Install",
    "Lock",
    "Matrix",
    "Report",
    "Selector",
    "Target",
    "load_matrix",
    "parse_matrix",
    "size_problem",
]

SCHEMA_VERSION = 1
DEFAULT_MAX_CELLS = 2000
_DRIVER = re.compile(r"[0-9]+(\.[0-9]+){0,2}")
_ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]*")


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Target:
    """Hardware the matrix is for."""

    name: str
    gpu: str = ""
    arch: tuple[str, ...] = ()
    gpus: int = 1
    min_driver: str | None = None
    nccl_env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    not_needed: tuple[str, ...] = ()  # module globs that need not run on this target


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Install:
    python: str | None = None  # every cell's interpreter, where no python axis gives each its own
    overrides: tuple[str, ...] = ()
    default_index: str | None = None
    timeout: float = 3600.0
    retries: int = 1
    # True: every axis pin is also a uv override, so the cell gets exactly its axis versions. None: so only
    # in cells with an axis whose kind forces (sglang: SGLang's own pins yield to the axis pins); False: never.
    force: bool | None = None


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Report:
    """The grid's layout. The defaults need only the required axes: torch's versions are the rows, one table
    per CUDA column, and ``columns`` empty is every other axis, in the matrix's order (``load_matrix``
    writes them out)."""

    rows: tuple[str, ...] = tuple(n for n in REQUIRED_AXES if AXIS_KINDS[n].role is Role.PACKAGE)
    columns: tuple[str, ...] = ()
    tables: tuple[str, ...] = (CUDA_AXIS,)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Matrix:
    path: str
    name: str
    axes: tuple[Axis, ...]
    rules: tuple[Rule, ...] = ()
    install: Install = dataclasses.field(default_factory=Install)
    targets: tuple[Target, ...] = ()
    thresholds: Thresholds = dataclasses.field(default_factory=Thresholds)
    report: Report = dataclasses.field(default_factory=Report)
    perf: PerfConfig | None = None  # None: no [perf], the perf stage skips
    serve: ServeConfig = dataclasses.field(default_factory=ServeConfig)  # no [serve]: the built-in model
    max_cells: int = DEFAULT_MAX_CELLS
    lock: Lock | None = None  # matrix.lock, when there is one
    digest: str = ""  # of the axes table: a lock with another digest is older than the matrix
    notes: tuple[str, ...] = ()  # what a person should hear before the cells run (a stale lock)

    def axis(self, name: str) -> Axis:
        for axis in self.axes:
            if axis.name == name:
                return axis
        raise KeyError(name)

    @property
    def size(self) -> int:
        """How many cells the matrix expands to (n/a ones included), counted without expanding.

        Includes add none: an included cell names a value of every axis, so it is in the product already.
        """
        return math.prod(len(axis.values) for axis in self.axes)

    @property
    def archs(self) -> tuple[str, ...]:
        seen: dict[str, None] = {}
        for target in self.targets:
            for arch in target.arch:
                seen[arch] = None
        return tuple(seen)


def _is_sm_arch(text: str) -> bool:
    """A target arch as written in matrix.toml, by the lab's one arch model (incell.cudacompat)."""
    if not re.fullmatch(r"sm_[0-9]+[af]?", text):
        return False
    try:
        return cudacompat.parse_arch(text).kind == "sm"
    except ValueError:
        return False


_TOP_KEYS = frozenset(
    {"schema", "name", "max-cells", "axes", "rules", "install", "targets", "thresholds", "report", "perf", "serve"}
)
_INSTALL_KEYS = frozenset({"python", "overrides", "index-url", "timeout", "retries", "force"})
_TARGET_KEYS = frozenset({"gpu", "arch", "gpus", "min-driver", "nccl-env", "not-needed"})
_REPORT_KEYS = ("rows", "columns", "tables")


def _parse_install(ck: Checker, data: Mapping[str, Any]) -> Install:
    raw = ck.table(data, "", "install")
    ck.keys(raw, "install", _INSTALL_KEYS)
    fields: dict[str, Any] = {}
    if "python" in raw:
        fields["python"] = ck.version(raw["python"], "install.python")
    overrides = ck.str_list(raw, "install", "overrides")
    if overrides is not None:
        fields["overrides"] = tuple(o for i, o in enumerate(overrides) if ck.requirement(o, f"install.overrides[{i}]"))
    if "index-url" in raw:
        fields["default_index"] = ck.url(raw["index-url"], "install.index-url")
    timeout = ck.number(raw, "install", "timeout", expected="a positive number of seconds")
    if timeout is not None:
        fields["timeout"] = float(timeout)
    retries = ck.number(
        raw,
        "install",
        "retries",
        integer=True,
        strict=False,
        expected="a non-negative integer",
        limit="install.retries",
    )
    if retries is not None:
        fields["retries"] = retries
    if "force" in raw:
        if not isinstance(raw["force"], bool):
            ck.error("install.force", f"expected true or false, got {show(raw['force'])}")
        else:
            fields["force"] = raw["force"]
    return Install(**fields)


def _parse_targets(ck: Checker, data: Mapping[str, Any]) -> list[Target]:
    raw_targets = ck.table(data, "", "targets")
    targets = []
    for name, raw in raw_targets.items():
        where = f"targets.{name}"
        if not isinstance(raw, dict):
            ck.error(where, f"expected a table ([targets.{name}]), got {show(raw)}")
            continue
        ck.keys(raw, where, _TARGET_KEYS)
        fields: dict[str, Any] = {}
        gpu = ck.string(raw, where, "gpu")
        if gpu is not None:
            fields["gpu"] = gpu
        archs = ck.str_list(raw, where, "arch")
        if archs is not None:
            for i, arch in enumerate(archs):
                if not _is_sm_arch(arch):
                    at = f"{where}.arch[{i}]" if isinstance(raw["arch"], list) else f"{where}.arch"
                    ck.error(at, f"expected an SM arch like 'sm_90', 'sm_90a' or 'sm_120', got {arch!r}")
            fields["arch"] = tuple(a for a in archs if _is_sm_arch(a))
        gpus = ck.number(raw, where, "gpus", integer=True, limit="targets.gpus")
        if gpus is not None:
            fields["gpus"] = gpus
        if "min-driver" in raw:
            d = raw["min-driver"]
            if not isinstance(d, str) or not _DRIVER.fullmatch(d):
                ck.error(f"{where}.min-driver", f"expected a driver version string like '580.65', got {show(d)}")
            else:
                fields["min_driver"] = d
        env = {}
        for key, value in ck.table(raw, where, "nccl-env").items():
            at = f"{where}.nccl-env.{key}"
            if not isinstance(value, str):
                ck.error(at, f"expected a string, got {show(value)}")
            elif not _ENV_NAME.fullmatch(key):
                ck.error(at, "expected an environment variable name like NCCL_ALGO")
            elif ck.text(value, at) is not None:
                env[key] = value
        fields["nccl_env"] = env
        not_needed = ck.str_list(raw, where, "not-needed")
        if not_needed is not None:
            fields["not_needed"] = tuple(not_needed)
        targets.append(Target(name=name, **fields))
    return targets


def _parse_report(ck: Checker, data: Mapping[str, Any], axes: list[Axis], broken: Set[str] = frozenset()) -> Report:
    raw = ck.table(data, "", "report")
    ck.keys(raw, "report", _REPORT_KEYS)
    names = {a.name for a in axes}
    out: dict[str, tuple[str, ...]] = {}
    seen: dict[str, str] = {}  # axis -> where it is placed
    for key in _REPORT_KEYS:
        values = ck.str_list(raw, "report", key)
        given = values is not None
        if values is None:
            values = list(field_default(Report, key))
        elif not values and isinstance(raw[key], list):
            default = ", ".join(field_default(Report, key)) or "every axis that rows and tables leave"
            ck.error(
                f"report.{key}", f"an empty list; name at least one axis, or remove the key for the default ({default})"
            )
            continue
        for i, v in enumerate(values):
            if given:
                where = f"report.{key}[{i}]" if isinstance(raw[key], list) else f"report.{key}"
                if names and v not in names and v not in broken:
                    ck.error(where, f"{v!r} is not an axis ({', '.join(sorted(names))})")
                    continue
            else:
                where = f"report.{key} (by default)"
            if v in seen:
                if given:
                    ck.error(
                        where, f"{v!r} is already in {seen[v]}; an axis goes in one place: rows, columns or tables"
                    )
                else:
                    ck.error(
                        f"report.{key}",
                        f"the default {key} ({', '.join(values)}) name {v!r}, which "
                        f"{seen[v]} has too; set {key} as well",
                    )
                continue
            seen[v] = where
        if given:
            out[key] = tuple(values)
    if "columns" not in raw:
        out["columns"] = tuple(a.name for a in axes if a.name not in seen)
    return Report(**out)


def size_problem(axes: Sequence[Axis], max_cells: int) -> str | None:
    """Why a matrix of *axes* is too big to expand, counted from the axis sizes; None when it is not."""
    size = math.prod(len(a.values) for a in axes)
    if size <= max_cells:
        return None
    sizes = " × ".join(f"{a.name} {len(a.values)}" for a in axes)
    return (
        f"{size:,} cells ({sizes}), more than max-cells = {max_cells:,}; drop values from an axis, "
        "or raise max-cells (a top-level key) if that many are meant"
    )


def _parse_cap(ck: Checker, data: Mapping[str, Any], axes: list[Axis]) -> int:
    cap = ck.number(data, "", "max-cells", integer=True, limit="max-cells")
    cap = DEFAULT_MAX_CELLS if cap is None else int(cap)
    problem = size_problem(axes, cap)
    if problem:
        ck.error("axes", problem)
    return cap


def parse_matrix(
    data: Mapping[str, Any], path: str = "matrix.toml", *, lock: Lock | None = None, use_lock: bool = True
) -> Matrix:
    """Validate a parsed matrix.toml; raise ConfigError listing every problem.

    A selecting axis takes its versions from *lock*; without one it is a problem, unless *use_lock* is
    False (``compatlab lock`` reads the selectors so): then such an axis has only its listed values.
    """
    ck = Checker()
    notes: list[str] = []
    locking = Locking(lock=lock, use=use_lock, path=lock.path if lock else str(lock_path(path)))
    ck.keys(data, "", _TOP_KEYS)
    if "schema" in data:
        schema = data["schema"]
        if isinstance(schema, bool) or not isinstance(schema, int) or schema != SCHEMA_VERSION:
            ck.error(
                "schema",
                f"this lab reads schema {SCHEMA_VERSION} (an integer), got {show(schema)}; "
                f"write schema = {SCHEMA_VERSION}",
            )
    name = ck.string(data, "", "name") or Path(path).stem
    axes, broken = parse_axes(ck, data, locking)
    max_cells = _parse_cap(ck, data, axes)
    rules = parse_rules(ck, data, axes, broken, notes)
    install = _parse_install(ck, data)
    if install.python is not None and any(a.name == PYTHON_AXIS for a in axes):
        ck.error(
            "install.python",
            f"the matrix has a {PYTHON_AXIS!r} axis, which gives each cell its own "
            "interpreter; remove install.python, or the axis",
        )
    targets = _parse_targets(ck, data)
    report = _parse_report(ck, data, axes, broken)
    raw_thresholds = ck.table(data, "", "thresholds")
    perf = parse_perf_section(ck, ck.table(data, "", "perf"), raw_thresholds, path, Path(path).parent)
    serve = parse_serve_section(ck, ck.table(data, "", "serve"), Path(path).parent)
    thresholds = parse_thresholds(ck, raw_thresholds, path=path, targets=[t.name for t in targets], perf=perf)
    # A value's cuda must name a column that exists, or every cell it is in would be n/a.
    cuda_axis = next((a for a in axes if a.name == CUDA_AXIS), None)
    if cuda_axis is not None:
        for axis in axes:
            for i, value in enumerate(axis.values):
                if value.cuda and not any(cuda_compatible(value.cuda, c.version) for c in cuda_axis.values):
                    cols = ", ".join(c.version for c in cuda_axis.values)
                    if (axis.name, value.version) in locking.derived:
                        # The index moved on to a CUDA the matrix has no column for: news, not a broken file.
                        notes.append(
                            f"axes.{axis.name}: {value.package or axis.name} {value.version} is a CUDA "
                            f"{value.cuda} build and no column of axis 'cuda' ({cols}) matches: its "
                            f"cells are n/a; add a cuda value {value.cuda!r} to test it"
                        )
                    else:
                        ck.error(
                            f"axes.{axis.name}[{i}].cuda", f"{value.cuda!r} matches no value of axis 'cuda' ({cols})"
                        )
    digest = axes_digest(data.get("axes", {}))
    if use_lock and lock is not None and lock.matrix_digest != digest:
        notes.insert(
            0,
            f"{lock.path} is older than {path}: its axes changed since the lock was resolved "
            f"({lock.resolved}); run `compatlab lock` (or `nox -s lock`) to resolve them again",
        )
    ck.sweep(data)
    ck.raise_if_any(path)
    return Matrix(
        path=path,
        name=name,
        axes=tuple(axes),
        rules=tuple(rules),
        install=install,
        targets=tuple(targets),
        thresholds=thresholds,
        report=report,
        perf=perf,
        serve=serve,
        max_cells=max_cells,
        lock=lock if use_lock else None,
        digest=digest,
        notes=tuple(notes),
    )


def load_matrix(path: str | Path, *, use_lock: bool = True) -> Matrix:
    """Read and validate a matrix file: UTF-8 TOML, every problem reported at once (ConfigError, exit 2).

    Its lock (``lock_path``: ``matrix.toml`` → ``matrix.lock``) is read too, when there is one and
    *use_lock*: the selecting axes' versions come from it.
    """
    p = Path(path)
    shown = str(path)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise ConfigError(shown, ["no such file; set COMPATLAB_MATRIX or create matrix.toml"]) from None
    except OSError as exc:
        raise ConfigError(shown, [f"cannot read: {exc.strerror}"]) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise ConfigError(
            shown,
            [
                f"not UTF-8 text: byte 0x{raw[exc.start]:02x} at line {line} (offset "
                f"{exc.start}) cannot be decoded; save the file as UTF-8"
            ],
        ) from None
    text = text.removeprefix("\ufeff")  # a byte-order mark, as some editors write
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(shown, [f"invalid TOML: {exc}"]) from None
    except RecursionError:
        raise ConfigError(shown, ["invalid TOML: arrays or tables nested too deeply to read"]) from None
    lock = load_lock(lock_path(shown)) if use_lock else None
    return parse_matrix(data, shown, lock=lock, use_lock=use_lock)
