"""Selectors and matrix.lock: which releases an axis takes from its index, and what they resolved to.

An axis may select its versions instead of listing them (``select = { latest = 2, per = "minor" }``).
A selector reads the index's releases (version, yanked), leaves out yanked releases (PEP 592) and
pre-releases (PEP 440: ``a``, ``b``, ``rc``, ``.dev``) unless asked, keeps those at or above ``since``,
groups them ``per`` release, minor (``2.14.*``) or major (``2.*``), takes the newest of each group and
then the newest ``latest`` groups.

matrix.lock (TOML, committed next to matrix.toml; ``matrix.toml`` → ``matrix.lock``) records, per package
axis: the index (credentials redacted), when it was resolved, how the versions were chosen, the versions
chosen, and for each chosen release its ``Requires-Dist`` pins on the matrix's other axes and the CUDA
version its own dependencies pin (``cuda-toolkit==13.0.3`` or ``nvidia-cuda-runtime-cu12==12.8.90``:
13.0, 12.8). ``seen`` lists the index's releases from the oldest chosen one up, so that the next lock can
tell which releases are new. ``matrix-sha256`` is the digest of matrix.toml's ``axes`` table (URLs
redacted): a lock whose digest differs was resolved from an older matrix.

Nothing here asks an index: ``compatlab lock`` (cli/lock.py) does, through compatlab.index (index/lock.py).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from compatlab.config.check import Checker, show
from compatlab.errors import ConfigError
from compatlab.urls import redact_text

__all__ = [
    "LOCK_SCHEMA",
    "PER",
    "Lock",
    "LockedAxis",
    "LockedRelease",
    "Selector",
    "axes_digest",
    "cuda_of",
    "dump_lock",
    "load_lock",
    "lock_path",
    "news",
    "parse_lock",
    "parse_selector",
    "pins_on",
]

LOCK_SCHEMA = 1
PER = ("release", "minor", "major")
_SELECT_KEYS = frozenset({"latest", "per", "since", "pre", "yanked"})
# The CUDA runtime a wheel depends on names its CUDA version: cuda-toolkit (torch 2.13+), nvidia-cuda-runtime
# (CUDA 13's name) and nvidia-cuda-runtime-cuNN (CUDA 12's).
_CUDA_RUNTIME = re.compile(r"cuda-toolkit|nvidia-cuda-runtime(-cu[0-9]+)?")


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Selector:
    """How an axis chooses its versions from the index's releases."""

    latest: int | None = None
    per: str = "release"
    since: str | None = None
    pre: bool = False
    yanked: bool = False

    def describe(self) -> str:
        """``latest 2 per minor, since 2.13``: how the lock and messages name the selector."""
        parts = []
        if self.latest is not None:
            parts.append(f"latest {self.latest}" + (f" per {self.per}" if self.per != "release" else ""))
        elif self.per != "release":
            parts.append(f"newest per {self.per}")
        if self.since is not None:
            parts.append(f"since {self.since}")
        if not parts:
            parts.append("every release")
        if self.pre:
            parts.append("pre-releases too")
        if self.yanked:
            parts.append("yanked too")
        return ", ".join(parts)

    def candidates(self, releases: Sequence[tuple[str, bool]]) -> list[str]:
        """The releases (version, yanked) the selector may choose from, oldest first: no yanked or
        pre-releases unless asked, none below ``since``."""
        floor = Version(self.since) if self.since else None
        out = []
        for version, yanked in releases:
            v = Version(version)
            if (yanked and not self.yanked) or ((v.is_prerelease or v.is_devrelease) and not self.pre):
                continue
            if floor is not None and v < floor:
                continue
            out.append(version)
        return sorted(out, key=Version)

    def choose(self, releases: Sequence[tuple[str, bool]]) -> list[str]:
        """The versions chosen, oldest first."""
        groups: dict[tuple[int, ...] | str, str] = {}
        for version in self.candidates(releases):
            v = Version(version)
            key: tuple[int, ...] | str = (
                version if self.per == "release" else v.release[:2] if self.per == "minor" else v.release[:1]
            )
            groups[key] = version  # candidates are oldest first: the newest of a group wins
        chosen = sorted(groups.values(), key=Version)
        return chosen[-self.latest :] if self.latest is not None else chosen


def parse_selector(ck: Checker, raw: object, where: str) -> Selector | None:
    """``select = { latest = 2, per = "minor", since = "2.13", pre = false, yanked = false }``."""
    if not isinstance(raw, dict):
        ck.error(where, f"expected a table like {{ latest = 2 }}, got {show(raw)}")
        return None
    ck.keys(raw, where, _SELECT_KEYS)
    fields: dict[str, Any] = {}
    latest = ck.number(raw, where, "latest", integer=True, limit="select.latest")
    if latest is not None:
        fields["latest"] = int(latest)
    if "per" in raw:
        if raw["per"] not in PER:
            ck.error(f"{where}.per", f"expected one of {', '.join(repr(p) for p in PER)}, got {show(raw['per'])}")
        else:
            fields["per"] = raw["per"]
    if "since" in raw:
        since = ck.version(raw["since"], f"{where}.since")
        if since is not None:
            fields["since"] = since
    for key in ("pre", "yanked"):
        if key in raw:
            if not isinstance(raw[key], bool):
                ck.error(f"{where}.{key}", f"expected true or false, got {show(raw[key])}")
            else:
                fields[key] = raw[key]
    if "latest" not in raw and "since" not in raw and not ck.reported(where):
        ck.error(where, 'selects every release of the index; give latest = N or since = "X.Y"')
    return Selector(**fields)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class LockedRelease:
    """A chosen release: its pins on the matrix's other axes (axis -> specifier) and the CUDA it pins."""

    version: str
    pins: Mapping[str, str] = dataclasses.field(default_factory=dict)
    cuda: str | None = None
    yanked: bool = False


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class LockedAxis:
    name: str
    package: str
    index: str  # redacted
    resolved: str
    select: str  # Selector.describe(), or "listed" for an axis that lists its versions
    versions: tuple[LockedRelease, ...]
    seen: tuple[str, ...] = ()

    def release(self, version: str) -> LockedRelease | None:
        for r in self.versions:
            if r.version == version or _same(r.version, version):
                return r
        return None


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Lock:
    path: str
    matrix_digest: str
    axes: Mapping[str, LockedAxis]

    @property
    def resolved(self) -> str:
        return max((a.resolved for a in self.axes.values()), default="")

    def release(self, axis: str, version: str) -> LockedRelease | None:
        locked = self.axes.get(axis)
        return locked.release(version) if locked is not None else None


def _same(a: str, b: str) -> bool:
    try:
        return Version(a) == Version(b)
    except InvalidVersion:
        return False


def lock_path(matrix_path: str | Path) -> Path:
    """``matrix.toml`` → ``matrix.lock``, next to it."""
    return Path(matrix_path).with_suffix(".lock")


def axes_digest(raw_axes: object) -> str:
    """The sha256 of matrix.toml's ``axes`` table as canonical JSON, credentials in URLs redacted."""

    def clean(value: object) -> object:
        if isinstance(value, dict):
            return {str(k): clean(v) for k, v in value.items()}
        if isinstance(value, list):
            return [clean(v) for v in value]
        if isinstance(value, str):
            return redact_text(value)
        return value

    text = json.dumps(clean(raw_axes), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def pins_on(requires: Sequence[str], packages: Mapping[str, str], *, python: str | None = None) -> dict[str, str]:
    """The ``Requires-Dist`` pins on other axes: {axis: specifier}, for requirements that apply on Linux
    x86-64 without extras (*packages* maps a canonical distribution name to its axis)."""
    from packaging.utils import canonicalize_name

    env = {"sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64", "extra": ""}
    if python:
        env["python_version"] = ".".join(python.split(".")[:2])
        env["python_full_version"] = python
    out: dict[str, str] = {}
    for text in requires:
        try:
            req = Requirement(text)
        except InvalidRequirement:
            continue
        axis = packages.get(canonicalize_name(req.name))
        if axis is None or not str(req.specifier):
            continue
        if req.marker is not None and not req.marker.evaluate(env):
            continue
        out[axis] = str(req.specifier)
    return out


def cuda_of(requires: Sequence[str]) -> str | None:
    """The CUDA major.minor that a wheel's exact pin on its CUDA runtime names, or None."""
    for text in requires:
        try:
            req = Requirement(text)
        except InvalidRequirement:
            continue
        if not _CUDA_RUNTIME.fullmatch(req.name.lower()):
            continue
        for spec in req.specifier:
            if spec.operator == "==" and "*" not in spec.version:
                release = Version(spec.version).release
                if len(release) >= 2:
                    return f"{release[0]}.{release[1]}"
    return None


def news(previous: Lock | None, new: Lock) -> list[str]:
    """The releases new since *previous*: in the new lock's ``seen`` and not in the old one's, for an axis
    that both locks read from the same package and index. Chosen ones say so."""
    if previous is None:
        return []
    lines = []
    for name, axis in new.axes.items():
        old = previous.axes.get(name)
        if old is None or old.package != axis.package or old.index != axis.index or not old.seen:
            continue
        floor = min(Version(v) for v in old.seen)
        known = {Version(v) for v in old.seen}
        chosen = {Version(r.version) for r in axis.versions}
        for version in axis.seen:
            v = Version(version)
            if v in known or v < floor:
                continue
            how = "chosen" if v in chosen else f"not chosen: {axis.select}"
            lines.append(
                f"{axis.package} {version} is out on {axis.index} ({how}; new since the lock of {old.resolved})"
            )
        for release in axis.versions:
            was = old.release(release.version)
            if release.yanked and was is not None and not was.yanked:
                lines.append(f"{axis.package} {release.version} was yanked on {axis.index}")
    return lines


def dump_lock(lock: Lock, *, matrix_name: str) -> str:
    """matrix.lock as TOML text, with a header that says what it is."""
    import tomli_w

    axes: dict[str, Any] = {}
    for name, axis in lock.axes.items():
        versions = []
        for r in axis.versions:
            item: dict[str, Any] = {"version": r.version}
            if r.cuda:
                item["cuda"] = r.cuda
            if r.yanked:
                item["yanked"] = True
            if r.pins:
                item["pins"] = dict(r.pins)
            versions.append(item)
        axes[name] = {
            "package": axis.package,
            "index": axis.index,
            "resolved": axis.resolved,
            "select": axis.select,
            "seen": list(axis.seen),
            "versions": versions,
        }
    body = tomli_w.dumps({"schema": LOCK_SCHEMA, "matrix-sha256": lock.matrix_digest, "axes": axes})
    return (
        f"# {Path(lock.path).name}: what the axes of {matrix_name} resolved to on their indexes.\n"
        "# Written by `compatlab lock` (or `nox -s lock`); commit it. Do not edit by hand.\n" + body
    )


def _release(ck: Checker, raw: object, where: str) -> LockedRelease | None:
    if not isinstance(raw, dict):
        ck.error(where, f"expected a table, got {show(raw)}")
        return None
    ck.keys(raw, where, {"version", "pins", "cuda", "yanked"})
    version = ck.version(raw.get("version"), f"{where}.version") if "version" in raw else None
    if "version" not in raw:
        ck.error(f"{where}.version", "missing; this key is required")
    pins: dict[str, str] = {}
    for axis, spec in ck.table(raw, where, "pins").items():
        try:
            SpecifierSet(spec if isinstance(spec, str) else "!")
        except InvalidSpecifier:
            ck.error(f"{where}.pins.{axis}", f"expected a version specifier like '==2.14.1', got {show(spec)}")
            continue
        pins[axis] = spec
    cuda = ck.version(raw["cuda"], f"{where}.cuda") if "cuda" in raw else None
    yanked = raw.get("yanked", False)
    if not isinstance(yanked, bool):
        ck.error(f"{where}.yanked", f"expected true or false, got {show(yanked)}")
        yanked = False
    if version is None:
        return None
    return LockedRelease(version=version, pins=pins, cuda=cuda, yanked=yanked)


def parse_lock(data: Mapping[str, Any], path: str) -> Lock:
    """Check a parsed matrix.lock; ConfigError with every problem, and the fix: write it anew."""
    ck = Checker()
    ck.keys(data, "", {"schema", "matrix-sha256", "axes"})
    if data.get("schema") != LOCK_SCHEMA or isinstance(data.get("schema"), bool):
        ck.error("schema", f"this lab reads lock schema {LOCK_SCHEMA}, got {show(data.get('schema'))}")
    digest = ck.string(data, "", "matrix-sha256", required=True) or ""
    axes: dict[str, LockedAxis] = {}
    for name, raw in ck.table(data, "", "axes").items():
        where = f"axes.{name}"
        if not isinstance(raw, dict):
            ck.error(where, f"expected a table, got {show(raw)}")
            continue
        ck.keys(raw, where, {"package", "index", "resolved", "select", "seen", "versions"})
        texts = {
            key: ck.string(raw, where, key, required=True) or "" for key in ("package", "index", "resolved", "select")
        }
        seen = ck.str_list(raw, where, "seen") or []
        versions = []
        items = raw.get("versions", [])
        if not isinstance(items, list):
            ck.error(f"{where}.versions", f"expected an array of tables, got {show(items)}")
            items = []
        for i, item in enumerate(items):
            release = _release(ck, item, f"{where}.versions[{i}]")
            if release is not None:
                versions.append(release)
        for i, version in enumerate(seen):
            ck.version(version, f"{where}.seen[{i}]")
        axes[name] = LockedAxis(name=name, versions=tuple(versions), seen=tuple(seen), **texts)
    ck.sweep(data)
    if ck.problems:
        raise ConfigError(path, [*ck.problems, "write it anew with `compatlab lock` (or `nox -s lock`)"])
    return Lock(path=path, matrix_digest=digest, axes=axes)


def load_lock(path: str | Path) -> Lock | None:
    """Read matrix.lock; None when there is none. A lock that cannot be read is a ConfigError naming it."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(str(path), [f"cannot read: {exc}; write it anew with `compatlab lock`"]) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(str(path), [f"invalid TOML: {exc}; write it anew with `compatlab lock`"]) from None
    except RecursionError:
        raise ConfigError(
            str(path), ["invalid TOML: arrays or tables nested too deeply to read; write it anew with `compatlab lock`"]
        ) from None
    return parse_lock(data, str(path))
