"""matrix.toml: load, validate (every problem at once), and model as frozen dataclasses.

A matrix is the product of its axes. An axis is one of the kinds in ``AXIS_KINDS``, the one table of what
an axis name means: its role (a package the cell installs, the CUDA column, or the cell's interpreter),
the distribution it installs and the names it imports as, whether a matrix needs it (torch and the CUDA
column only) and whether it forces its cells. Any other axis is an extra one that names its distribution
with ``package``: a misspelled axis name must not quietly become a package to install. The product is
counted from the axis sizes before anything expands, and refused above ``max-cells``.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import math
import re
import tomllib
from collections.abc import Mapping, Sequence, Set
from enum import StrEnum
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from compatlab.config.check import Checker, field_default, show
from compatlab.config.lock import Lock, Selector, axes_digest, load_lock, lock_path, parse_selector
from compatlab.config.perf import PerfConfig, parse_perf_section
from compatlab.config.serve import ServeConfig, parse_serve_section
from compatlab.config.thresholds import Thresholds, parse_thresholds
from compatlab.errors import ConfigError
from compatlab.incell import cudacompat
from compatlab.urls import has_credentials, redact

__all__ = [
    "AXIS_KINDS",
    "CUDA_AXIS",
    "DEFAULT_MAX_CELLS",
    "FORCING_AXES",
    "NON_PACKAGE_AXES",
    "PYTHON_AXIS",
    "REQUIRED_AXES",
    "SCHEMA_VERSION",
    "Axis",
    "AxisKind",
    "AxisValue",
    "Install",
    "Lock",
    "Matrix",
    "Report",
    "Role",
    "Rule",
    "RuleKind",
    "Selector",
    "Target",
    "axis_of_package",
    "cuda_compatible",
    "load_matrix",
    "parse_matrix",
    "size_problem",
]

SCHEMA_VERSION = 1
DEFAULT_MAX_CELLS = 2000


class Role(enum.StrEnum):
    """What an axis's values are."""

    PACKAGE = "package"  # a distribution the cell installs, pinned to the value (``torch==2.14.1``)
    CUDA = "cuda"  # the CUDA column: a plain version that each package value's ``cuda`` must agree with
    PYTHON = "python"  # the cell's interpreter: a plain version; each cell's venv is made with its own


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class AxisKind:
    """Everything an axis name means, in one place (as cibuildwheel's ``architecture.py`` says it of each
    architecture): the rest of the lab asks the table and never spells a kind's name itself."""

    role: Role = Role.PACKAGE
    package: str | None = None  # the distribution its values pin (a package kind's only)
    imports: tuple[str, ...] = ()  # its top-level import names: the static stage ranks their findings first
    required: bool = False  # a matrix without this axis is refused
    # A cell with this axis is forced unless install.force = false: the release's own exact pins yield to
    # the axis pins (SGLang pins torch, its kernels and flashinfer; the cell is about the axes' versions).
    forces: bool = False


# The axis kinds the lab knows; a new kind is one entry here. Any other axis must say its `package`.
# Only torch (what every other package extends) and the CUDA column are required: a matrix of any torch
# extension (torchvision, xformers …) against torch is a matrix of the lab.
AXIS_KINDS: Mapping[str, AxisKind] = {
    "torch": AxisKind(package="torch", imports=("torch",), required=True),
    "sgl-kernel": AxisKind(package="sgl-kernel", imports=("sgl_kernel",)),
    "sglang-kernel": AxisKind(package="sglang-kernel", imports=("sgl_kernel",)),  # sgl-kernel's successor
    "flashinfer": AxisKind(package="flashinfer-python", imports=("flashinfer",)),
    "sglang": AxisKind(package="sglang", imports=("sglang",), forces=True),
    "torchvision": AxisKind(package="torchvision", imports=("torchvision",)),
    "torchaudio": AxisKind(package="torchaudio", imports=("torchaudio",)),
    "xformers": AxisKind(package="xformers", imports=("xformers",)),
    "cuda": AxisKind(role=Role.CUDA, required=True),
    "python": AxisKind(role=Role.PYTHON),
}


def _the(role: Role) -> str:
    (name,) = (name for name, kind in AXIS_KINDS.items() if kind.role is role)
    return name


CUDA_AXIS = _the(Role.CUDA)  # the one axis of the CUDA column
PYTHON_AXIS = _the(Role.PYTHON)  # the one axis of the cells' interpreter
NON_PACKAGE_AXES = frozenset(name for name, kind in AXIS_KINDS.items() if kind.role is not Role.PACKAGE)
REQUIRED_AXES = tuple(name for name, kind in AXIS_KINDS.items() if kind.required)
FORCING_AXES = frozenset(name for name, kind in AXIS_KINDS.items() if kind.forces)


def axis_of_package(distribution: str) -> str:
    """The axis a distribution is the kind of (``flashinfer-python`` -> ``flashinfer``), else its own name."""
    wanted = canonicalize_name(distribution)
    return next(
        (
            name
            for name, kind in AXIS_KINDS.items()
            if kind.package is not None and canonicalize_name(kind.package) == wanted
        ),
        distribution,
    )


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
    """An axis: its values, and for one that selects them from its index, the selector (the values then
    come from matrix.lock). ``package`` and ``index`` are the axis form's own (``[axes.NAME]``)."""

    name: str
    values: tuple[AxisValue, ...]
    package: str | None = None
    index: str | None = None
    select: Selector | None = None

    @property
    def role(self) -> Role:
        """What its values are: its kind's role; an extra axis (not in the table) installs a package."""
        kind = AXIS_KINDS.get(self.name)
        return kind.role if kind is not None else Role.PACKAGE

    @property
    def is_package(self) -> bool:
        return self.role is Role.PACKAGE

    def find(self, version: str) -> AxisValue | None:
        for value in self.values:
            if _same_version(value.version, version):
                return value
        return None


class RuleKind(StrEnum):
    """What a ``[[rules.<kind>]]`` does: leave cells out, add one, expect a verdict, install with the axis
    pins forced, or keep only the cells near a shipped stack."""

    EXCLUDE = "exclude"
    INCLUDE = "include"
    EXPECT = "expect"
    FORCE = "force"
    NEIGHBOURS = "neighbours"


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Rule:
    """A partial assignment (axis -> accepted versions) with what it means."""

    kind: RuleKind
    match: Mapping[str, tuple[str, ...]]
    reason: str = ""
    expect: str | None = None  # "fail" for a known-bad combination
    distance: int = 1  # neighbours: how many package axes away from a shipped stack a cell may be

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


def _is_version(text: str) -> bool:
    try:
        Version(text)
    except InvalidVersion:
        return False
    return True


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
_AXIS_KEYS = frozenset({"package", "values", "select", "index", "cuda"})
_TOP_KEYS = frozenset(
    {"schema", "name", "max-cells", "axes", "rules", "install", "targets", "thresholds", "report", "perf", "serve"}
)
_INSTALL_KEYS = frozenset({"python", "overrides", "index-url", "timeout", "retries", "force"})
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
                ck.error(
                    sub,
                    f"credentials in a find-links URL are not supported (got {redact(url)!r}): uv can "
                    "be given credentials only for a named index, and the lab writes no secret to disk; "
                    "serve these files as a simple index and give it as 'index'",
                )
            elif url:
                urls.append(url)
        fields["find_links"] = tuple(urls)
    if "cuda" in raw:
        if axis == CUDA_AXIS:
            ck.error(f"{where}.cuda", "the cuda axis's own values have no 'cuda' key; use 'version'")
        else:
            fields["cuda"] = ck.version(raw["cuda"], f"{where}.cuda")
    requires = ck.str_list(raw, where, "requires")
    if requires is not None:
        fields["requires"] = tuple(r for i, r in enumerate(requires) if ck.requirement(r, f"{where}.requires[{i}]"))
    if version is None:
        return None
    return AxisValue(axis=axis, version=version, package=None if axis in NON_PACKAGE_AXES else package, **fields)


def _unknown_axis(ck: Checker, name: str, where: str) -> None:
    known = ", ".join(sorted(AXIS_KINDS))
    close = difflib.get_close_matches(name, sorted(AXIS_KINDS), n=1, cutoff=0.6)
    hint = f"; perhaps you meant {close[0]!r}?" if close else "."
    ck.error(
        where,
        f"{name!r} is not a known axis ({known}){hint} An extra axis installs a package: name it "
        f'with package = "..." on each value, or write [axes.{name}] with package and values',
    )


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class _Locking:
    """What the axes are parsed against: the lock (None: there is none) and whether selected axes need it."""

    lock: Lock | None
    use: bool
    path: str  # the lock's file name, for messages
    # (axis, version) of values whose CUDA came from the lock or the axis form, not from the value itself
    derived: set[tuple[str, str]] = dataclasses.field(default_factory=set)


def _axis_cuda(ck: Checker, raw: object, where: str) -> tuple[tuple[str, str], ...] | None:
    """An axis form's ``cuda``: one version for every value, or a table of specifier -> version."""
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    if isinstance(raw, str):
        version = ck.version(raw, where)
        return (("", version),) if version else None
    if not isinstance(raw, dict):
        ck.error(where, f'expected a CUDA version or a table like {{ ">=2.15" = "13.2" }}, got {show(raw)}')
        return None
    out = []
    for spec, cuda in raw.items():
        try:
            SpecifierSet(spec)
        except InvalidSpecifier:
            ck.error(f"{where}.{spec}", f"{spec!r} is not a version specifier (like '>=2.15' or '==2.14.*')")
            continue
        version = ck.version(cuda, f"{where}.{spec}")
        if version:
            out.append((spec, version))
    return tuple(out)


def _cuda_for(rules: tuple[tuple[str, str], ...], version: str) -> str | None:
    from packaging.specifiers import SpecifierSet

    for spec, cuda in rules:
        if SpecifierSet(spec).contains(version, prereleases=True):
            return cuda
    return None


def _selected_values(
    ck: Checker,
    name: str,
    where: str,
    select: Selector,
    listed: list[AxisValue],
    *,
    package: str | None,
    index: str | None,
    locking: _Locking,
) -> list[AxisValue] | None:
    """The values of a selecting axis: the lock's versions (a listed value of the same version lends its
    keys), then listed values the lock did not choose. None: the lock cannot say (reported)."""
    if not locking.use:
        return listed
    if package is None:
        return None
    if locking.lock is None:
        ck.error(
            where,
            f"selects its versions ({select.describe()}) from its index, and there is no "
            f"{locking.path}; run `compatlab lock` (or `nox -s lock`) to resolve them",
        )
        return None
    locked = locking.lock.axes.get(name)
    shown = redact(index or "")
    if locked is None or locked.package != package or (index and locked.index != shown):
        source = shown or "the default index"
        ck.error(
            where,
            f"{locking.path} has no versions for this axis ({package} from {source}); "
            "run `compatlab lock` (or `nox -s lock`) to resolve them",
        )
        return None
    by_version = {Version(v.version): v for v in listed}
    values = []
    taken: set[Version] = set()
    for release in locked.versions:
        if Version(release.version) in taken:
            continue  # 0.7.4.0 after 0.7.4: one release by PEP 440, so one cell
        taken.add(Version(release.version))
        mine = by_version.pop(Version(release.version), None)
        if mine is not None:
            values.append(mine if mine.cuda else dataclasses.replace(mine, cuda=release.cuda))
        else:
            values.append(
                AxisValue(axis=name, version=release.version, package=package, index=index, cuda=release.cuda)
            )
    values.extend(by_version.values())
    return values


def _names_a_package(raw: object) -> bool:
    """Whether an axis's table names the distribution it installs (an extra axis), anywhere in it."""
    if isinstance(raw, dict):
        items = raw.get("values", [raw]) if "values" in raw else [raw]
        return "package" in raw or any(isinstance(i, dict) and "package" in i for i in items or [])
    return isinstance(raw, list) and any(isinstance(i, dict) and "package" in i for i in raw)


def _parse_axes(ck: Checker, data: Mapping[str, Any], locking: _Locking) -> tuple[list[Axis], set[str]]:
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
        close = difflib.get_close_matches(name, sorted(AXIS_KINDS), n=1, cutoff=0.75) if kind is None else []
        if close and not _names_a_package(raw):
            # A known axis misspelled ([axes.flashinfr]): one error with the name meant, not one per key that
            # an extra axis would need; what refers to the name meant (rules, report) is not told again.
            _unknown_axis(ck, name, where)
            broken.update((name, close[0]))
            continue
        package = kind.package if kind else None
        axis_package = axis_index = None
        select: Selector | None = None
        cuda_rules: tuple[tuple[str, str], ...] = ()
        if isinstance(raw, dict) and ("values" in raw or "select" in raw):  # [axes.NAME]: the axis form
            ck.keys(raw, where, _AXIS_KEYS)
            if kind is not None and kind.role is not Role.PACKAGE:
                for key in ("package", "index", "select"):
                    if key in raw:
                        ck.error(f"{where}.{key}", f"axis {name!r} is not a package; remove this key")
            else:
                axis_package = ck.string(raw, where, "package")
                package = axis_package or package
                if "index" in raw:
                    axis_index = ck.url(raw["index"], f"{where}.index")
                if "select" in raw:
                    select = parse_selector(ck, raw["select"], f"{where}.select")
                    if select is None:
                        broken.add(name)
            if "cuda" in raw:
                if name == CUDA_AXIS:
                    ck.error(f"{where}.cuda", "the cuda axis's own values have no 'cuda' key")
                else:
                    cuda_rules = _axis_cuda(ck, raw["cuda"], f"{where}.cuda") or ()
            items, item_where = raw.get("values", []), f"{where}.values"
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
        if not items and select is None and name not in broken:
            ck.error(
                item_where or where, "has no values; give at least one, or select them with select = { latest = N }"
            )
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
            if axis_index and value.index is None:
                value = dataclasses.replace(value, index=axis_index)
            values.append(value)
        if unnamed:
            broken.add(name)
        if unnamed and len(unnamed) == len(items) and select is None:
            _unknown_axis(ck, name, where)
        else:
            for sub in unnamed:
                ck.error(
                    f"{sub}.package",
                    f"missing; {name!r} is not a known axis, so each value names the distribution it installs",
                )
        if select is not None and package is None and kind is None:
            ck.error(
                f"{where}.package",
                f"missing; {name!r} is not a known axis, so the axis names the distribution it selects",
            )
            broken.add(name)
        if select is not None:
            chosen = _selected_values(
                ck, name, where, select, values, package=package, index=axis_index, locking=locking
            )
            if chosen is None:
                broken.add(name)
                chosen = values
            values = chosen
        elif locking.use and locking.lock is not None and name in locking.lock.axes:
            # A listed axis: the lock knows the CUDA each release's own dependencies pin.
            locked = locking.lock.axes[name]
            values = [
                v if v.cuda or (r := locked.release(v.version)) is None else dataclasses.replace(v, cuda=r.cuda)
                for v in values
            ]
        if cuda_rules:
            values = [v if v.cuda else dataclasses.replace(v, cuda=_cuda_for(cuda_rules, v.version)) for v in values]
        explicit = {
            Version(str(item["version"]))
            for item in items
            if isinstance(item, dict)
            and "cuda" in item
            and isinstance(item.get("version"), str)
            and _is_version(item["version"])
        }
        locking.derived.update((name, v.version) for v in values if v.cuda and Version(v.version) not in explicit)
        axes.append(Axis(name=name, values=tuple(values), package=axis_package, index=axis_index, select=select))
    present = {a.name for a in axes} | set(raw_axes)
    for required in REQUIRED_AXES:
        if required not in present:
            ck.error(f"axes.{required}", "missing; the lab needs the axes " + ", ".join(REQUIRED_AXES))
    return axes, broken


_NEIGHBOURS_KEYS = frozenset({"of", "distance", "reason"})


def _parse_neighbours(ck: Checker, entries: object) -> list[Rule]:
    """``[[rules.neighbours]] of = "shipped"``: only cells near a shipped stack of the lock run."""
    if not isinstance(entries, list):
        ck.error("rules.neighbours", f"expected an array of tables ([[rules.neighbours]]), got {show(entries)}")
        return []
    rules = []
    for i, entry in enumerate(entries):
        where = f"rules.neighbours[{i}]"
        if not isinstance(entry, dict):
            ck.error(where, f"expected a table, got {show(entry)}")
            continue
        ck.keys(entry, where, _NEIGHBOURS_KEYS)
        if entry.get("of") != "shipped":
            ck.error(
                f"{where}.of",
                f'expected "shipped" (the stacks the lock\'s releases pin), got '
                f"{show(entry.get('of')) if 'of' in entry else 'nothing'}",
            )
        distance = ck.number(
            entry,
            where,
            "distance",
            integer=True,
            strict=False,
            expected="a non-negative integer",
            limit="rules.neighbours.distance",
        )
        reason = ck.string(entry, where, "reason") or ""
        rules.append(
            Rule(kind=RuleKind.NEIGHBOURS, match={}, reason=reason, distance=1 if distance is None else int(distance))
        )
    return rules


def _parse_rules(
    ck: Checker, data: Mapping[str, Any], axes: list[Axis], broken: set[str], notes: list[str]
) -> list[Rule]:
    raw_rules = ck.table(data, "", "rules")
    ck.keys(raw_rules, "rules", {k.value for k in RuleKind})
    by_name = {a.name: a for a in axes}
    rules: list[Rule] = []
    for kind in (RuleKind.EXCLUDE, RuleKind.INCLUDE, RuleKind.EXPECT, RuleKind.FORCE):
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
                if key not in by_name and key in broken:
                    continue  # an axis with a problem of its own (misspelled in [axes]): said there
                if key not in by_name:
                    close = difflib.get_close_matches(key, sorted(set(by_name) | RULE_META_KEYS), n=1)
                    hint = f"; perhaps you meant {close[0]!r}?" if close else ""
                    ck.error(sub, f"not an axis and not 'reason' or 'expect'{hint}")
                    continue
                if raw == []:
                    ck.error(sub, "an empty list names no version; give at least one, or remove the key")
                    continue
                if kind == RuleKind.INCLUDE and isinstance(raw, list) and len(raw) > 1:
                    ck.error(
                        sub,
                        f"an included cell has one version per axis, got {len(raw)}; "
                        "write one [[rules.include]] per cell",
                    )
                    continue
                versions = raw if isinstance(raw, list) else [raw]
                ok = []
                for j, version in enumerate(versions):
                    at = f"{sub}[{j}]" if isinstance(raw, list) else sub
                    if not isinstance(version, str):
                        ck.error(at, f"expected a version string, got {show(version)}")
                    elif ck.text(version, at) is None or key in broken:
                        continue
                    elif by_name[key].find(version) is None and by_name[key].select is not None:
                        # A selecting axis follows its index: a rule may name a version not chosen now.
                        if ck.version(version, at) is not None:
                            notes.append(
                                f"{at}: {key} {version} is not among the versions selected now "
                                f"({', '.join(v.version for v in by_name[key].values) or 'none'}); "
                                "this rule matches no cell"
                            )
                            ok.append(version)
                    elif by_name[key].find(version) is None:
                        known = ", ".join(v.version for v in by_name[key].values)
                        ck.error(at, f"{version!r} is not a value of axis {key!r} ({known})")
                    else:
                        ok.append(version)
                if ok:
                    match[key] = tuple(ok)
            reason = ck.string(entry, where, "reason", required=kind in (RuleKind.EXCLUDE, RuleKind.EXPECT)) or ""
            expect = None
            if "expect" in entry:
                if kind == RuleKind.FORCE:
                    ck.error(f"{where}.expect", "a force rule says how cells install; put expect in [[rules.expect]]")
                elif kind == RuleKind.EXCLUDE:
                    ck.error(f"{where}.expect", "an excluded cell does not run; move this rule to [[rules.expect]]")
                elif entry["expect"] != "fail":
                    ck.error(f"{where}.expect", f'the only expectation is "fail", got {show(entry["expect"])}')
                else:
                    expect = "fail"
                    if not reason and kind == RuleKind.INCLUDE:
                        ck.error(f"{where}.reason", "missing; a known-bad combination needs a reason")
            elif kind == RuleKind.EXPECT:
                ck.error(f"{where}.expect", 'missing; write expect = "fail"')
            if kind == RuleKind.INCLUDE:
                missing = [a.name for a in axes if a.name not in entry and a.name not in broken]
                if missing:
                    ck.error(where, "an included cell names a value for every axis; missing " + ", ".join(missing))
            elif not any(k for k in entry if k not in RULE_META_KEYS):
                ck.error(where, "names no axis, so it would match every cell")
            if kind == RuleKind.INCLUDE and any(by_name[a].find(v[0]) is None for a, v in match.items()):
                continue  # it names a version its selecting axis does not have now (noted above)
            rules.append(Rule(kind=kind, match=match, reason=reason, expect=expect))
    if "neighbours" in raw_rules:
        rules.extend(_parse_neighbours(ck, raw_rules["neighbours"]))
    return rules


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
    locking = _Locking(lock=lock, use=use_lock, path=lock.path if lock else str(lock_path(path)))
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
    axes, broken = _parse_axes(ck, data, locking)
    max_cells = _parse_cap(ck, data, axes)
    rules = _parse_rules(ck, data, axes, broken, notes)
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
