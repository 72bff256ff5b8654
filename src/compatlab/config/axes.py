"""The axes of a matrix: the axis-kind table (``AXIS_KINDS``), an axis and its values, and ``[axes]`` parsed.

``AXIS_KINDS`` is the one table of what an axis name means: its role (a package the cell installs, the CUDA
column, or the cell's interpreter), the distribution it installs and the names it imports as, whether a
matrix needs it (torch and the CUDA column only) and whether it forces its cells. No other module of the lab
spells a kind's names (``tests/unit/test_layout.py``). Any other axis is an extra one that names its
distribution with ``package``: a misspelled axis name must not quietly become a package to install. A
selecting axis (``select``) takes its versions from matrix.lock (``Locking``).
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import re
from collections.abc import Mapping
from typing import Any

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from compatlab.config.check import Checker, show
from compatlab.config.lock import Lock, Selector, parse_selector
from compatlab.urls import has_credentials, redact

__all__ = [
    "AXIS_KINDS",
    "CUDA_AXIS",
    "FORCING_AXES",
    "NON_PACKAGE_AXES",
    "PYTHON_AXIS",
    "REQUIRED_AXES",
    "RULE_META_KEYS",
    "Axis",
    "AxisKind",
    "AxisValue",
    "Locking",
    "Role",
    "axis_of_package",
    "cuda_compatible",
    "parse_axes",
    "same_version",
]


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


# The keys of a rule table that are not axes (config/rules.py): no axis may be named so.
RULE_META_KEYS = frozenset({"reason", "expect"})
_AXIS_NAME = re.compile(r"[a-z][a-z0-9-]*")
_DISTRIBUTION = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?")  # PEP 508 names


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
            if same_version(value.version, version):
                return value
        return None


def _is_version(text: str) -> bool:
    try:
        Version(text)
    except InvalidVersion:
        return False
    return True


def same_version(a: str, b: str) -> bool:
    """Whether two versions are one by PEP 440 (``2.9.1`` and ``2.9.1.0``); text that is no version, when equal."""
    if a == b:
        return True
    try:
        return Version(a) == Version(b)  # PEP 440 equality, the local tag included
    except InvalidVersion:
        return False


def cuda_compatible(value_cuda: str, cell_cuda: str) -> bool:
    """'12' matches any 12.x column; '12.8' matches exactly 12.8."""
    a, b = Version(value_cuda).release, Version(cell_cuda).release
    n = min(len(a), len(b))
    return a[:n] == b[:n]


_VALUE_KEYS = frozenset({"version", "package", "index", "find-links", "cuda", "requires"})
_AXIS_KEYS = frozenset({"package", "values", "select", "index", "cuda"})


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
class Locking:
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
    locking: Locking,
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


def parse_axes(ck: Checker, data: Mapping[str, Any], locking: Locking) -> tuple[list[Axis], set[str]]:
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
