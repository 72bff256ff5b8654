"""matrix.toml: load, validate (every problem at once), and model as frozen dataclasses."""

from __future__ import annotations

import dataclasses
import difflib
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import InvalidVersion, Version

from compatlab.errors import ConfigError
from compatlab.urls import has_credentials, redact

__all__ = [
    "SCHEMA_VERSION",
    "Axis",
    "AxisValue",
    "Install",
    "Matrix",
    "Report",
    "Rule",
    "Target",
    "load_matrix",
    "parse_matrix",
]

SCHEMA_VERSION = 1

# Axes that are not packages: the CUDA column and the interpreter.
NON_PACKAGE_AXES = frozenset({"cuda", "python"})
# Distribution names where the axis name is not the distribution's name.
DEFAULT_PACKAGES = {"flashinfer": "flashinfer-python"}
REQUIRED_AXES = ("torch", "sgl-kernel", "flashinfer", "cuda")
RULE_META_KEYS = frozenset({"reason", "expect"})
_AXIS_NAME = re.compile(r"^[a-z][a-z0-9-]*$")
_ARCH = re.compile(r"^sm_(\d+)([af]?)$")


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
    rules: tuple[Rule, ...]
    install: Install
    targets: tuple[Target, ...]
    thresholds: Mapping[str, Any]
    report: Report
    perf: Mapping[str, Any]

    def axis(self, name: str) -> Axis:
        for axis in self.axes:
            if axis.name == name:
                return axis
        raise KeyError(name)

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


def _type_name(value: object) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a float"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "a table"
    return type(value).__name__


def _show(value: object) -> str:
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    return _type_name(value)


class _Checker:
    """Collects every problem of a file so that one run shows them all."""

    def __init__(self) -> None:
        self.problems: list[str] = []

    def error(self, key: str, message: str) -> None:
        self.problems.append(f"{key}: {message}" if key else message)

    def keys(self, table: Mapping[str, Any], key: str, allowed: set[str] | frozenset[str]) -> None:
        for name in table:
            if name in allowed:
                continue
            where = f"{key}.{name}" if key else name
            close = difflib.get_close_matches(name, sorted(allowed), n=1, cutoff=0.6)
            hint = f"; perhaps you meant {close[0]!r}?" if close else (
                f"; allowed keys: {', '.join(sorted(allowed))}" if allowed else ""
            )
            self.error(where, f"unknown key{hint}")

    def string(self, table: Mapping[str, Any], key: str, name: str, *, required: bool = False) -> str | None:
        where = f"{key}.{name}" if key else name
        if name not in table:
            if required:
                self.error(where, "missing; this key is required")
            return None
        value = table[name]
        if not isinstance(value, str):
            self.error(where, f"expected a string, got {_show(value)}")
            return None
        if not value.strip():
            self.error(where, "must not be empty")
            return None
        return value

    def url(self, value: object, where: str) -> str | None:
        if not isinstance(value, str):
            self.error(where, f"expected a URL, got {_show(value)}")
            return None
        parsed = urlparse(value)
        if parsed.scheme not in ("http", "https", "file") or (
            parsed.scheme != "file" and not parsed.netloc
        ):
            self.error(where, f"expected an http(s):// or file:// URL, got {redact(value)!r}")
            return None
        return value

    def version(self, value: object, where: str) -> str | None:
        if not isinstance(value, str):
            self.error(where, f"expected a version string, got {_show(value)}")
            return None
        try:
            Version(value)
        except InvalidVersion:
            self.error(where, f"{value!r} is not a valid PEP 440 version")
            return None
        return value

    def requirement(self, value: object, where: str) -> str | None:
        if not isinstance(value, str):
            self.error(where, f"expected a requirement string, got {_show(value)}")
            return None
        try:
            Requirement(value)
        except InvalidRequirement as exc:
            self.error(where, f"{value!r} is not a valid requirement ({exc})")
            return None
        return value

    def str_list(self, table: Mapping[str, Any], key: str, name: str) -> list[str] | None:
        where = f"{key}.{name}" if key else name
        if name not in table:
            return None
        value = table[name]
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list):
            self.error(where, f"expected a string or an array of strings, got {_show(value)}")
            return None
        out = []
        for i, item in enumerate(value):
            if not isinstance(item, str):
                self.error(f"{where}[{i}]", f"expected a string, got {_show(item)}")
            else:
                out.append(item)
        return out

    def table(self, data: Mapping[str, Any], key: str, name: str) -> dict[str, Any]:
        where = f"{key}.{name}" if key else name
        value = data.get(name, {})
        if not isinstance(value, dict):
            self.error(where, f"expected a table, got {_show(value)}")
            return {}
        return value


_VALUE_KEYS = frozenset({"version", "package", "index", "find-links", "cuda", "requires"})
_TOP_KEYS = frozenset(
    {"schema", "name", "axes", "rules", "install", "targets", "thresholds", "report", "perf"}
)
_INSTALL_KEYS = frozenset({"python", "overrides", "index-url", "timeout", "retries"})
_TARGET_KEYS = frozenset({"gpu", "arch", "gpus", "min-driver", "nccl-env", "not-needed"})
_REPORT_KEYS = frozenset({"rows", "columns", "tables"})


def _parse_value(ck: _Checker, axis: str, raw: object, where: str) -> AxisValue | None:
    if isinstance(raw, str):
        raw = {"version": raw}
    if not isinstance(raw, dict):
        ck.error(where, f"expected a version string or a table, got {_show(raw)}")
        return None
    ck.keys(raw, where, _VALUE_KEYS)
    version = ck.string(raw, where, "version", required=True)
    if version is not None:
        version = ck.version(version, f"{where}.version")
    if axis in NON_PACKAGE_AXES:
        for key in ("package", "index", "find-links", "requires"):
            if key in raw:
                ck.error(f"{where}.{key}", f"axis {axis!r} is not a package; remove this key")
        package = None
    else:
        package = ck.string(raw, where, "package") or DEFAULT_PACKAGES.get(axis, axis)
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", package):
            ck.error(f"{where}.package", f"{package!r} is not a valid distribution name")
    index = None
    if "index" in raw:
        index = ck.url(raw["index"], f"{where}.index")
    find_links: list[str] = []
    if "find-links" in raw:
        links = raw["find-links"]
        if isinstance(links, str) or not isinstance(links, list):
            links = [links]
        for i, link in enumerate(links):
            sub = f"{where}.find-links" if len(links) == 1 else f"{where}.find-links[{i}]"
            url = ck.url(link, sub)
            if url and has_credentials(url):
                ck.error(sub, f"credentials in a find-links URL are not supported (got {redact(url)!r}): uv can "
                         "be given credentials only for a named index, and the lab writes no secret to disk; "
                         "serve these files as a simple index and give it as 'index'")
            elif url:
                find_links.append(url)
    cuda = None
    if "cuda" in raw:
        if axis == "cuda":
            ck.error(f"{where}.cuda", "the cuda axis's own values have no 'cuda' key; use 'version'")
        else:
            cuda = ck.version(raw["cuda"], f"{where}.cuda")
    requires = []
    for i, req in enumerate(ck.str_list(raw, where, "requires") or []):
        ok = ck.requirement(req, f"{where}.requires[{i}]")
        if ok:
            requires.append(ok)
    if version is None:
        return None
    return AxisValue(
        axis=axis,
        version=version,
        package=package,
        index=index,
        find_links=tuple(find_links),
        cuda=cuda,
        requires=tuple(requires),
    )


def _parse_axes(ck: _Checker, data: Mapping[str, Any]) -> list[Axis]:
    raw_axes = ck.table(data, "", "axes")
    axes = []
    for name, raw in raw_axes.items():
        where = f"axes.{name}"
        if not _AXIS_NAME.match(name) or name in RULE_META_KEYS:
            ck.error(where, "an axis name is lower-case letters, digits and '-', not 'reason' or 'expect'")
            continue
        items = [raw] if isinstance(raw, (str, dict)) else raw
        if not isinstance(items, list):
            ck.error(where, f"expected an array of values, got {_show(items)}")
            continue
        if not items:
            ck.error(where, "has no values; give at least one")
            continue
        values: list[AxisValue] = []
        for i, item in enumerate(items):
            value = _parse_value(ck, name, item, f"{where}[{i}]")
            if value is None:
                continue
            if any(_same_version(v.version, value.version) for v in values):
                ck.error(f"{where}[{i}].version", f"{value.version!r} is listed twice")
                continue
            values.append(value)
        axes.append(Axis(name=name, values=tuple(values)))
    names = {a.name for a in axes}
    for required in REQUIRED_AXES:
        if required not in names and required not in raw_axes:
            ck.error(f"axes.{required}", "missing; the lab needs the axes " + ", ".join(REQUIRED_AXES))
    return axes


def _parse_rules(ck: _Checker, data: Mapping[str, Any], axes: list[Axis]) -> list[Rule]:
    raw_rules = ck.table(data, "", "rules")
    ck.keys(raw_rules, "rules", {"exclude", "include", "expect"})
    by_name = {a.name: a for a in axes}
    rules: list[Rule] = []
    for kind in ("exclude", "include", "expect"):
        entries = raw_rules.get(kind, [])
        if not isinstance(entries, list):
            ck.error(f"rules.{kind}", f"expected an array of tables ([[rules.{kind}]]), got {_show(entries)}")
            continue
        for i, entry in enumerate(entries):
            where = f"rules.{kind}[{i}]"
            if not isinstance(entry, dict):
                ck.error(where, f"expected a table, got {_show(entry)}")
                continue
            match: dict[str, tuple[str, ...]] = {}
            for key, raw in entry.items():
                if key in RULE_META_KEYS:
                    continue
                if key not in by_name:
                    close = difflib.get_close_matches(key, sorted(set(by_name) | RULE_META_KEYS), n=1)
                    hint = f"; perhaps you meant {close[0]!r}?" if close else ""
                    ck.error(f"{where}.{key}", f"not an axis and not 'reason' or 'expect'{hint}")
                    continue
                versions = raw if isinstance(raw, list) else [raw]
                ok = []
                for version in versions:
                    if not isinstance(version, str):
                        ck.error(f"{where}.{key}", f"expected a version string, got {_show(version)}")
                    elif by_name[key].find(version) is None:
                        known = ", ".join(v.version for v in by_name[key].values)
                        ck.error(f"{where}.{key}", f"{version!r} is not a value of axis {key!r} ({known})")
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
                    ck.error(f"{where}.expect", f"the only expectation is \"fail\", got {_show(entry['expect'])}")
                else:
                    expect = "fail"
                    if not reason:
                        ck.error(f"{where}.reason", "missing; a known-bad combination needs a reason")
            elif kind == "expect":
                ck.error(f"{where}.expect", 'missing; write expect = "fail"')
            if kind == "include":
                missing = [a.name for a in axes if a.name not in entry]
                if missing:
                    ck.error(where, "an included cell names a value for every axis; missing " + ", ".join(missing))
            elif not match and not any(k for k in entry if k not in RULE_META_KEYS):
                ck.error(where, "names no axis, so it would match every cell")
            rules.append(Rule(kind=kind, match=match, reason=reason, expect=expect))
    return rules


def _parse_install(ck: _Checker, data: Mapping[str, Any]) -> Install:
    raw = ck.table(data, "", "install")
    ck.keys(raw, "install", _INSTALL_KEYS)
    python = None
    if "python" in raw:
        python = ck.version(raw["python"], "install.python")
    overrides = []
    for i, req in enumerate(ck.str_list(raw, "install", "overrides") or []):
        if ck.requirement(req, f"install.overrides[{i}]"):
            overrides.append(req)
    index = ck.url(raw["index-url"], "install.index-url") if "index-url" in raw else None
    timeout = 3600.0
    if "timeout" in raw:
        t = raw["timeout"]
        if isinstance(t, bool) or not isinstance(t, (int, float)) or t <= 0:
            ck.error("install.timeout", f"expected a positive number of seconds, got {_show(t)}")
        else:
            timeout = float(t)
    retries = 1
    if "retries" in raw:
        r = raw["retries"]
        if isinstance(r, bool) or not isinstance(r, int) or r < 0:
            ck.error("install.retries", f"expected a non-negative integer, got {_show(r)}")
        else:
            retries = r
    return Install(python=python, overrides=tuple(overrides), default_index=index, timeout=timeout, retries=retries)


def _parse_targets(ck: _Checker, data: Mapping[str, Any]) -> list[Target]:
    raw_targets = ck.table(data, "", "targets")
    targets = []
    for name, raw in raw_targets.items():
        where = f"targets.{name}"
        if not isinstance(raw, dict):
            ck.error(where, f"expected a table ([targets.{name}]), got {_show(raw)}")
            continue
        ck.keys(raw, where, _TARGET_KEYS)
        gpu = ck.string(raw, where, "gpu") or ""
        archs = []
        for i, arch in enumerate(ck.str_list(raw, where, "arch") or []):
            if not _ARCH.match(arch):
                ck.error(f"{where}.arch[{i}]", f"expected an SM arch like 'sm_90', 'sm_90a' or 'sm_120', got {arch!r}")
            else:
                archs.append(arch)
        gpus = 1
        if "gpus" in raw:
            g = raw["gpus"]
            if isinstance(g, bool) or not isinstance(g, int) or g < 1:
                ck.error(f"{where}.gpus", f"expected a positive integer, got {_show(g)}")
            else:
                gpus = g
        driver = None
        if "min-driver" in raw:
            d = raw["min-driver"]
            if not isinstance(d, str) or not re.fullmatch(r"\d+(\.\d+){0,2}", d):
                ck.error(f"{where}.min-driver", f"expected a driver version string like '580.65', got {_show(d)}")
            else:
                driver = d
        env = {}
        for key, value in ck.table(raw, where, "nccl-env").items():
            if not isinstance(value, str):
                ck.error(f"{where}.nccl-env.{key}", f"expected a string, got {_show(value)}")
            elif not re.fullmatch(r"[A-Z_][A-Z0-9_]*", key):
                ck.error(f"{where}.nccl-env.{key}", "expected an environment variable name like NCCL_ALGO")
            else:
                env[key] = value
        not_needed = ck.str_list(raw, where, "not-needed") or []
        targets.append(
            Target(name=name, gpu=gpu, arch=tuple(archs), gpus=gpus, min_driver=driver,
                   nccl_env=env, not_needed=tuple(not_needed))
        )
    return targets


def _parse_report(ck: _Checker, data: Mapping[str, Any], axes: list[Axis]) -> Report:
    raw = ck.table(data, "", "report")
    ck.keys(raw, "report", _REPORT_KEYS)
    names = {a.name for a in axes}
    out: dict[str, tuple[str, ...]] = {}
    for key in ("rows", "columns", "tables"):
        values = ck.str_list(raw, "report", key)
        if values is None:
            continue
        for i, v in enumerate(values):
            if names and v not in names:
                ck.error(f"report.{key}[{i}]", f"{v!r} is not an axis ({', '.join(sorted(names))})")
        out[key] = tuple(values)
    return Report(**out)


def parse_matrix(data: Mapping[str, Any], path: str = "matrix.toml") -> Matrix:
    """Validate a parsed matrix.toml; raise ConfigError listing every problem."""
    ck = _Checker()
    ck.keys(data, "", _TOP_KEYS)
    schema = data.get("schema", SCHEMA_VERSION)
    if schema != SCHEMA_VERSION or isinstance(schema, bool):
        ck.error("schema", f"this lab reads schema {SCHEMA_VERSION}, got {_show(schema)}")
    name = ck.string(data, "", "name") or Path(path).stem
    axes = _parse_axes(ck, data)
    rules = _parse_rules(ck, data, axes)
    install = _parse_install(ck, data)
    targets = _parse_targets(ck, data)
    thresholds = ck.table(data, "", "thresholds")
    report = _parse_report(ck, data, axes)
    perf = ck.table(data, "", "perf")
    if perf or "perf" in thresholds:
        # The perf suite owns its section's schema; its problems join this file's report.
        from compatlab.stages.perf.stage import parse_perf

        try:
            parse_perf(perf, thresholds, path, base_dir=Path(path).parent)
        except ConfigError as exc:
            ck.problems.extend(exc.problems)
    # A value's cuda must name a column that exists, or every cell it is in would be n/a.
    try:
        cuda_axis = next(a for a in axes if a.name == "cuda")
    except StopIteration:
        cuda_axis = None
    if cuda_axis is not None:
        for axis in axes:
            for i, value in enumerate(axis.values):
                if value.cuda and not any(_cuda_compatible(value.cuda, c.version) for c in cuda_axis.values):
                    cols = ", ".join(c.version for c in cuda_axis.values)
                    ck.error(f"axes.{axis.name}[{i}].cuda", f"{value.cuda!r} matches no value of axis 'cuda' ({cols})")
    if ck.problems:
        raise ConfigError(path, ck.problems)
    return Matrix(
        path=path, name=name, axes=tuple(axes), rules=tuple(rules), install=install,
        targets=tuple(targets), thresholds=thresholds, report=report, perf=perf,
    )


def _cuda_compatible(value_cuda: str, cell_cuda: str) -> bool:
    """'12' matches any 12.x column; '12.8' matches exactly 12.8."""
    a, b = Version(value_cuda).release, Version(cell_cuda).release
    n = min(len(a), len(b))
    return a[:n] == b[:n]


def load_matrix(path: str | Path) -> Matrix:
    """Read and validate a matrix file."""
    p = Path(path)
    shown = str(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(shown, ["no such file; set COMPATLAB_MATRIX or create matrix.toml"]) from None
    except OSError as exc:
        raise ConfigError(shown, [f"cannot read: {exc.strerror}"]) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(shown, [f"invalid TOML: {exc}"]) from None
    return parse_matrix(data, shown)
