"""matrix.toml: load, validate (every problem at once), and model as frozen dataclasses.

A matrix is the product of its axes. An axis is one of the kinds in ``AXIS_KINDS`` (the distribution it
installs, or none for the CUDA column and the interpreter), or an extra axis that names its distribution
with ``package``: a misspelled axis name must not quietly become a package to install. The product is
counted from the axis sizes before anything expands, and refused above ``max-cells``.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from compatlab.config.check import Checker, field_default, show
from compatlab.config.perf import PerfConfig, parse_perf_section
from compatlab.config.thresholds import Thresholds, parse_thresholds
from compatlab.errors import ConfigError
from compatlab.incell import cudacompat
from compatlab.urls import has_credentials, redact

__all__ = [
    "AXIS_KINDS",
    "DEFAULT_MAX_CELLS",
    "SCHEMA_VERSION",
    "Axis",
    "AxisKind",
    "AxisValue",
    "Install",
    "Matrix",
    "Report",
    "Rule",
    "Target",
    "cuda_compatible",
    "load_matrix",
    "parse_matrix",
    "size_problem",
]

SCHEMA_VERSION = 1
DEFAULT_MAX_CELLS = 2000


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class AxisKind:
    """What an axis name means: the distribution its values pin, or None for a plain version."""

    package: str | None
    required: bool = False


# The axis kinds the lab knows; a new kind is one entry here. Any other axis must say its `package`.
AXIS_KINDS: Mapping[str, AxisKind] = {
    "torch": AxisKind(package="torch", required=True),
    "sgl-kernel": AxisKind(package="sgl-kernel", required=True),
    "sglang-kernel": AxisKind(package="sglang-kernel"),  # sgl-kernel's successor (0.4.7+)
    "flashinfer": AxisKind(package="flashinfer-python", required=True),
    "sglang": AxisKind(package="sglang"),
    "cuda": AxisKind(package=None, required=True),  # the CUDA column
    "python": AxisKind(package=None),  # the cells' interpreter
}
NON_PACKAGE_AXES = frozenset(name for name, kind in AXIS_KINDS.items() if kind.package is None)
# Distribution names where the axis name is not the distribution's name.
DEFAULT_PACKAGES = {name: kind.package for name, kind in AXIS_KINDS.items()
                    if kind.package is not None and kind.package != name}
REQUIRED_AXES = tuple(name for name, kind in AXIS_KINDS.items() if kind.required)
RULE_META_KEYS = frozenset({"reason", "expect"})
_AXIS_NAME = re.compile(r"[a-z][a-z0-9-]*")
_DISTRIBUTION = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?")  # PEP 508 names
_DRIVER = re.compile(r"[0-9]+(\.[0-9]+){0,2}")
_ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]*")


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class AxisValue:
    """One value of an axis: a pinned distribution (or a plain version for cuda/python)."""

    axis: str
    version: str
    package: str | None = None
    index: str | None = None
    find_links: tuple[str, ...] = ()
    cuda: str | None = None
    requires: tuple[str, ...] = ()

    @property
    def requirement(self) -> str | None:
        """The pin handed to uv, e.g. ``torch==2.9.1+cu130``."""
        if self.package is None:
            return None
        return f"{self.package}=={self.version}"


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Axis:
    name: str
    values: tuple[AxisValue, ...]

    @property
    def is_package(self) -> bool:
        return self.name not in NON_PACKAGE_AXES

    def find(self, version: str) -> AxisValue | None:
        for value in self.values:
            if _same_version(value.version, version):
                return value
        return None


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Rule:
    """A partial assignment (axis -> accepted versions) with what it means."""

    kind: str  # exclude | include | expect
    match: Mapping[str, tuple[str, ...]]
    reason: str = ""
    expect: str | None = None  # "fail" for a known-bad combination

    def matches(self, assignment: Mapping[str, str]) -> bool:
        for axis, versions in self.match.items():
            got = assignment.get(axis)
            if got is None or not any(_same_version(got, v) for v in versions):
                return False
        return True


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
    python: str | None = None
    overrides: tuple[str, ...] = ()
    default_index: str | None = None
    timeout: float = 3600.0
    retries: int = 1


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Report:
    rows: tuple[str, ...] = ("torch",)
    columns: tuple[str, ...] = ("sgl-kernel", "flashinfer")
    tables: tuple[str, ...] = ("cuda",)


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
    max_cells: int = DEFAULT_MAX_CELLS

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


def _same_version(a: str, b: str) -> bool:
    if a == b:
        return True
    try:
        return Version(a) == Version(b)  # PEP 440 equality, the local tag included
    except InvalidVersion:
        return False


def _is_sm_arch(text: str) -> bool:
    """A target arch as written in matrix.toml, by the lab's one arch model (incell.cudacompat)."""
    if not re.fullmatch(r"sm_[0-9]+[af]?", text):
        return False
    try:
        return cudacompat.parse_arch(text).kind == "sm"
    except ValueError:
        return False


def cuda_compatible(value_cuda: str, cell_cuda: str) -> bool:
    """'12' matches any 12.x column; '12.8' matches exactly 12.8."""
    a, b = Version(value_cuda).release, Version(cell_cuda).release
    n = min(len(a), len(b))
    return a[:n] == b[:n]


_VALUE_KEYS = frozenset({"version", "package", "index", "find-links", "cuda", "requires"})
_AXIS_KEYS = frozenset({"package", "values"})
_TOP_KEYS = frozenset(
    {"schema", "name", "max-cells", "axes", "rules", "install", "targets", "thresholds", "report", "perf"}
)
_INSTALL_KEYS = frozenset({"python", "overrides", "index-url", "timeout", "retries"})
_TARGET_KEYS = frozenset({"gpu", "arch", "gpus", "min-driver", "nccl-env", "not-needed"})
_REPORT_KEYS = ("rows", "columns", "tables")


def _parse_value(ck: Checker, axis: str, raw: object, where: str, package: str | None) -> AxisValue | None:
    """One value; *package* is the axis's distribution when the value names none (None: it must)."""
    if isinstance(raw, str):
        raw = {"version": raw}
        version_where = where
    else:
        version_where = f"{where}.version"
    if not isinstance(raw, dict):
        ck.error(where, f"expected a version string or a table, got {show(raw)}")
        return None
    ck.keys(raw, where, _VALUE_KEYS)
    version = None
    if "version" not in raw:
        ck.error(version_where, "missing; this key is required")
    else:
        version = ck.version(raw["version"], version_where)
    if axis in NON_PACKAGE_AXES:
        for key in ("package", "index", "find-links", "requires"):
            if key in raw:
                ck.error(f"{where}.{key}", f"axis {axis!r} is not a package; remove this key")
    else:
        package = ck.string(raw, where, "package") or package
        if package is not None and not _DISTRIBUTION.fullmatch(package):
            ck.error(f"{where}.package", f"{package!r} is not a valid distribution name")
    fields: dict[str, Any] = {}
    if "index" in raw:
        fields["index"] = ck.url(raw["index"], f"{where}.index")
    if "find-links" in raw:
        links = raw["find-links"]
        if isinstance(links, list):
            subs = [(f"{where}.find-links[{i}]", link) for i, link in enumerate(links)]
        else:
            subs = [(f"{where}.find-links", links)]
        urls = []
        for sub, link in subs:
            url = ck.url(link, sub)
            if url and has_credentials(url):
                ck.error(sub, f"credentials in a find-links URL are not supported (got {redact(url)!r}): uv can "
                         "be given credentials only for a named index, and the lab writes no secret to disk; "
                         "serve these files as a simple index and give it as 'index'")
            elif url:
                urls.append(url)
        fields["find_links"] = tuple(urls)
    if "cuda" in raw:
        if axis == "cuda":
            ck.error(f"{where}.cuda", "the cuda axis's own values have no 'cuda' key; use 'version'")
        else:
            fields["cuda"] = ck.version(raw["cuda"], f"{where}.cuda")
    requires = ck.str_list(raw, where, "requires")
    if requires is not None:
        fields["requires"] = tuple(r for i, r in enumerate(requires)
                                   if ck.requirement(r, f"{where}.requires[{i}]"))
    if version is None:
        return None
    return AxisValue(axis=axis, version=version, package=None if axis in NON_PACKAGE_AXES else package,
                     **fields)


def _unknown_axis(ck: Checker, name: str, where: str) -> None:
    known = ", ".join(sorted(AXIS_KINDS))
    close = difflib.get_close_matches(name, sorted(AXIS_KINDS), n=1, cutoff=0.6)
    hint = f"; perhaps you meant {close[0]!r}?" if close else "."
    ck.error(where, f"{name!r} is not a known axis ({known}){hint} An extra axis installs a package: name it "
                    f'with package = "..." on each value, or write [axes.{name}] with package and values')


def _parse_axes(ck: Checker, data: Mapping[str, Any]) -> tuple[list[Axis], set[str]]:
    """The axes, and the names of those with a problem (rules do not repeat it as a missing value)."""
    raw_axes = ck.table(data, "", "axes")
    axes: list[Axis] = []
    broken: set[str] = set()
    if not isinstance(data.get("axes", {}), dict):
        return axes, broken  # said once: not a table
    for name, raw in raw_axes.items():
        where = f"axes.{name}"
        if not _AXIS_NAME.fullmatch(name) or name in RULE_META_KEYS:
            ck.error(where, "an axis name is lower-case letters, digits and '-', not 'reason' or 'expect'")
            continue
        kind = AXIS_KINDS.get(name)
        package = kind.package if kind else None
        if isinstance(raw, dict) and "values" in raw:  # [axes.NAME] with package and values
            ck.keys(raw, where, _AXIS_KEYS)
            if "package" in raw and kind is not None and kind.package is None:
                ck.error(f"{where}.package", f"axis {name!r} is not a package; remove this key")
            else:
                package = ck.string(raw, where, "package") or package
            items, item_where = raw["values"], f"{where}.values"
            if not isinstance(items, list):
                ck.error(item_where, f"expected an array of values, got {show(items)}")
                continue
        elif isinstance(raw, (str, dict)):
            items, item_where = [raw], ""
        else:
            items, item_where = raw, where
        if not isinstance(items, list):
            ck.error(where, f"expected an array of values, got {show(items)}")
            continue
        if not items:
            ck.error(item_where or where, "has no values; give at least one")
            continue
        values: list[AxisValue] = []
        seen: set[Version] = set()
        unnamed: list[str] = []
        for i, item in enumerate(items):
            sub = f"{item_where}[{i}]" if item_where else where
            value = _parse_value(ck, name, item, sub, package)
            if value is None:
                broken.add(name)
                continue
            if kind is None and value.package is None:
                unnamed.append(sub)
            parsed = Version(value.version)
            if parsed in seen:
                ck.error(f"{sub}.version" if isinstance(item, dict) else sub, f"{value.version!r} is listed twice")
                continue
            seen.add(parsed)
            values.append(value)
        if unnamed:
            broken.add(name)
        if unnamed and len(unnamed) == len(items):
            _unknown_axis(ck, name, where)
        else:
            for sub in unnamed:
                ck.error(f"{sub}.package", f"missing; {name!r} is not a known axis, so each value names "
                                           "the distribution it installs")
        axes.append(Axis(name=name, values=tuple(values)))
    for required in REQUIRED_AXES:
        if required not in raw_axes:
            ck.error(f"axes.{required}", "missing; the lab needs the axes " + ", ".join(REQUIRED_AXES))
    return axes, broken


def _parse_rules(ck: Checker, data: Mapping[str, Any], axes: list[Axis], broken: set[str]) -> list[Rule]:
    raw_rules = ck.table(data, "", "rules")
    ck.keys(raw_rules, "rules", {"exclude", "include", "expect"})
    by_name = {a.name: a for a in axes}
    rules: list[Rule] = []
    for kind in ("exclude", "include", "expect"):
        entries = raw_rules.get(kind, [])
        if not isinstance(entries, list):
            ck.error(f"rules.{kind}", f"expected an array of tables ([[rules.{kind}]]), got {show(entries)}")
            continue
        for i, entry in enumerate(entries):
            where = f"rules.{kind}[{i}]"
            if not isinstance(entry, dict):
                ck.error(where, f"expected a table, got {show(entry)}")
                continue
            match: dict[str, tuple[str, ...]] = {}
            for key, raw in entry.items():
                if key in RULE_META_KEYS:
                    continue
                sub = f"{where}.{key}"
                if key not in by_name:
                    close = difflib.get_close_matches(key, sorted(set(by_name) | RULE_META_KEYS), n=1)
                    hint = f"; perhaps you meant {close[0]!r}?" if close else ""
                    ck.error(sub, f"not an axis and not 'reason' or 'expect'{hint}")
                    continue
                if raw == []:
                    ck.error(sub, "an empty list names no version; give at least one, or remove the key")
                    continue
                if kind == "include" and isinstance(raw, list) and len(raw) > 1:
                    ck.error(sub, f"an included cell has one version per axis, got {len(raw)}; "
                                  "write one [[rules.include]] per cell")
                    continue
                versions = raw if isinstance(raw, list) else [raw]
                ok = []
                for j, version in enumerate(versions):
                    at = f"{sub}[{j}]" if isinstance(raw, list) else sub
                    if not isinstance(version, str):
                        ck.error(at, f"expected a version string, got {show(version)}")
                    elif ck.text(version, at) is None or key in broken:
                        continue
                    elif by_name[key].find(version) is None:
                        known = ", ".join(v.version for v in by_name[key].values)
                        ck.error(at, f"{version!r} is not a value of axis {key!r} ({known})")
                    else:
                        ok.append(version)
                if ok:
                    match[key] = tuple(ok)
            reason = ck.string(entry, where, "reason", required=kind in ("exclude", "expect")) or ""
            expect = None
            if "expect" in entry:
                if kind == "exclude":
                    ck.error(f"{where}.expect", "an excluded cell does not run; move this rule to [[rules.expect]]")
                elif entry["expect"] != "fail":
                    ck.error(f"{where}.expect", f"the only expectation is \"fail\", got {show(entry['expect'])}")
                else:
                    expect = "fail"
                    if not reason and kind == "include":
                        ck.error(f"{where}.reason", "missing; a known-bad combination needs a reason")
            elif kind == "expect":
                ck.error(f"{where}.expect", 'missing; write expect = "fail"')
            if kind == "include":
                missing = [a.name for a in axes if a.name not in entry and a.name not in broken]
                if missing:
                    ck.error(where, "an included cell names a value for every axis; missing " + ", ".join(missing))
            elif not any(k for k in entry if k not in RULE_META_KEYS):
                ck.error(where, "names no axis, so it would match every cell")
            rules.append(Rule(kind=kind, match=match, reason=reason, expect=expect))
    return rules


def _parse_install(ck: Checker, data: Mapping[str, Any]) -> Install:
    raw = ck.table(data, "", "install")
    ck.keys(raw, "install", _INSTALL_KEYS)
    fields: dict[str, Any] = {}
    if "python" in raw:
        fields["python"] = ck.version(raw["python"], "install.python")
    overrides = ck.str_list(raw, "install", "overrides")
    if overrides is not None:
        fields["overrides"] = tuple(o for i, o in enumerate(overrides)
                                    if ck.requirement(o, f"install.overrides[{i}]"))
    if "index-url" in raw:
        fields["default_index"] = ck.url(raw["index-url"], "install.index-url")
    timeout = ck.number(raw, "install", "timeout", expected="a positive number of seconds")
    if timeout is not None:
        fields["timeout"] = float(timeout)
    retries = ck.number(raw, "install", "retries", integer=True, strict=False,
                        expected="a non-negative integer")
    if retries is not None:
        fields["retries"] = retries
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
        gpus = ck.number(raw, where, "gpus", integer=True)
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


def _parse_report(ck: Checker, data: Mapping[str, Any], axes: list[Axis]) -> Report:
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
            ck.error(f"report.{key}", "an empty list; name at least one axis, or remove the key for the "
                                      f"default ({', '.join(field_default(Report, key))})")
            continue
        for i, v in enumerate(values):
            if given:
                where = f"report.{key}[{i}]" if isinstance(raw[key], list) else f"report.{key}"
                if names and v not in names:
                    ck.error(where, f"{v!r} is not an axis ({', '.join(sorted(names))})")
                    continue
            else:
                where = f"report.{key} (by default)"
            if v in seen:
                if given:
                    ck.error(where, f"{v!r} is already in {seen[v]}; an axis goes in one place: rows, columns "
                                    "or tables")
                else:
                    ck.error(f"report.{key}", f"the default {key} ({', '.join(values)}) name {v!r}, which "
                                              f"{seen[v]} has too; set {key} as well")
                continue
            seen[v] = where
        if given:
            out[key] = tuple(values)
    return Report(**out)


def size_problem(axes: Sequence[Axis], max_cells: int) -> str | None:
    """Why a matrix of *axes* is too big to expand, counted from the axis sizes; None when it is not."""
    size = math.prod(len(a.values) for a in axes)
    if size <= max_cells:
        return None
    sizes = " × ".join(f"{a.name} {len(a.values)}" for a in axes)
    return (f"{size:,} cells ({sizes}), more than max-cells = {max_cells:,}; drop values from an axis, "
            "or raise max-cells (a top-level key) if that many are meant")


def _parse_cap(ck: Checker, data: Mapping[str, Any], axes: list[Axis]) -> int:
    cap = ck.number(data, "", "max-cells", integer=True)
    cap = DEFAULT_MAX_CELLS if cap is None else int(cap)
    problem = size_problem(axes, cap)
    if problem:
        ck.error("axes", problem)
    return cap


def parse_matrix(data: Mapping[str, Any], path: str = "matrix.toml") -> Matrix:
    """Validate a parsed matrix.toml; raise ConfigError listing every problem."""
    ck = Checker()
    ck.keys(data, "", _TOP_KEYS)
    if "schema" in data:
        schema = data["schema"]
        if isinstance(schema, bool) or not isinstance(schema, int) or schema != SCHEMA_VERSION:
            ck.error("schema", f"this lab reads schema {SCHEMA_VERSION} (an integer), got {show(schema)}; "
                               f"write schema = {SCHEMA_VERSION}")
    name = ck.string(data, "", "name") or Path(path).stem
    axes, broken = _parse_axes(ck, data)
    max_cells = _parse_cap(ck, data, axes)
    rules = _parse_rules(ck, data, axes, broken)
    install = _parse_install(ck, data)
    targets = _parse_targets(ck, data)
    report = _parse_report(ck, data, axes)
    raw_thresholds = ck.table(data, "", "thresholds")
    perf = parse_perf_section(ck, ck.table(data, "", "perf"), raw_thresholds, path, Path(path).parent)
    thresholds = parse_thresholds(ck, raw_thresholds, path=path, targets=[t.name for t in targets], perf=perf)
    # A value's cuda must name a column that exists, or every cell it is in would be n/a.
    cuda_axis = next((a for a in axes if a.name == "cuda"), None)
    if cuda_axis is not None:
        for axis in axes:
            for i, value in enumerate(axis.values):
                if value.cuda and not any(cuda_compatible(value.cuda, c.version) for c in cuda_axis.values):
                    cols = ", ".join(c.version for c in cuda_axis.values)
                    ck.error(f"axes.{axis.name}[{i}].cuda", f"{value.cuda!r} matches no value of axis 'cuda' ({cols})")
    ck.sweep(data)
    ck.raise_if_any(path)
    return Matrix(
        path=path, name=name, axes=tuple(axes), rules=tuple(rules), install=install, targets=tuple(targets),
        thresholds=thresholds, report=report, perf=perf, max_cells=max_cells,
    )


def load_matrix(path: str | Path) -> Matrix:
    """Read and validate a matrix file: UTF-8 TOML, every problem reported at once (ConfigError, exit 2)."""
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
        raise ConfigError(shown, [f"not UTF-8 text: byte 0x{raw[exc.start]:02x} at line {line} (offset "
                                  f"{exc.start}) cannot be decoded; save the file as UTF-8"]) from None
    text = text.removeprefix("\ufeff")  # a byte-order mark, as some editors write
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(shown, [f"invalid TOML: {exc}"]) from None
    except RecursionError:
        raise ConfigError(shown, ["invalid TOML: arrays or tables nested too deeply to read"]) from None
    return parse_matrix(data, shown)
