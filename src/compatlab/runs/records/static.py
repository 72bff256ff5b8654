"""The static stage's details: what it checked (the site-packages directory, the archs, how many modules), its
state and counts as it judged them, every finding (most important failure first), the modules that cannot load
but that `import <package>` does not need (for the import stage to confirm), and each declared distribution's
extension modules. ``runtime.observed_static`` corrects the findings by what the import stage saw and says so
(``observed_by_import``); the state and counts stay the static stage's own.

A finding is read back as the stage wrote it (``Finding.from_json``): a key or a value it does not know raises,
since every kind the stage ever wrote is still one of ``Kind``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from compatlab.runs.model import StageResult, StageState

__all__ = ["Finding", "Kind", "NotNeeded", "Severity", "StaticDetails"]


class Severity(StrEnum):
    """fail: an import of this environment fails on it; warn: worth reading; note: no import needs it."""

    FAIL = "fail"
    WARN = "warn"
    NOTE = "note"


class Kind(StrEnum):
    """What a finding is about."""

    FAMILY = "family"  # two majors of one library family (cu12 beside cu13)
    LIBRARY = "library"  # a needed library is not found
    VERSION = "version"  # a needed symbol version is not provided
    SYMBOL = "symbol"  # a needed symbol is not defined
    DRIVER_API = "driver-api"  # a CUDA driver API newer than the target's driver
    ARCH = "arch"  # no code for the target GPU
    METADATA = "metadata"  # a distribution's metadata is broken
    DRIVER = "driver"  # the driver a module needs
    UNREADABLE = "unreadable"  # a file that cannot be read as ELF
    BY_NAME = "by-name"  # a library loaded by name, not by a DT_NEEDED entry
    TOOLCHAIN = "toolchain"  # a compiler the stack calls at run time (Triton's ptxas, the JIT's nvcc)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Finding:
    """One thing the checker found about one module (or distribution); ``dataclasses.replace`` changes one."""

    severity: Severity
    module: str  # path relative to site-packages, or the distribution for metadata findings
    kind: Kind
    message: str
    details: dict[str, Any] = dataclasses.field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "severity": self.severity.value,
            "module": self.module,
            "kind": self.kind.value,
            "message": self.message,
            "details": self.details,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Finding:
        """A finding as to_json wrote it (a stage's details); a key or a value it does not know raises."""
        unknown = set(data) - {"severity", "module", "kind", "message", "details"}
        if unknown:
            raise ValueError(f"a static finding has unknown keys: {', '.join(sorted(unknown))}")
        return cls(
            severity=Severity(data["severity"]),
            module=str(data["module"]),
            kind=Kind(data["kind"]),
            message=str(data["message"]),
            details=dict(data.get("details") or {}),
        )

    @property
    def dist(self) -> str:
        """The distribution the finding belongs to ("" when the stage could not tell)."""
        return str(self.details.get("dist") or "")

    @property
    def library(self) -> str | None:
        """The library the finding is about (a missing one, a version's provider), None when it is not one's."""
        value = self.details.get("library")
        return value if isinstance(value, str) else None

    @property
    def symbol(self) -> str:
        """The symbol a symbol finding is about, as the module's dynamic table spells it (mangled)."""
        return str(self.details["symbol"])

    @property
    def shown_symbol(self) -> str:
        """The symbol a symbol finding is about as people read it: demangled where it could be."""
        return str(self.details.get("demangled") or self.details["symbol"])

    @property
    def found(self) -> Any:
        """Where a by-name finding's library was found here (None: ld.so would not find it)."""
        return self.details.get("found")

    @property
    def named_in(self) -> list[str]:
        """The files (file:line) that name a by-name finding's library."""
        return list(self.details["named_in"])

    @property
    def given_dist(self) -> str | None:
        """The distribution as the finding's details give it: None when they do not (``dist`` reads "")."""
        value = self.details.get("dist")
        return None if value is None else str(value)

    def of_dist(self, dist: str) -> Finding:
        """This finding, of distribution *dist* unless its details already name one."""
        return dataclasses.replace(self, details={**self.details, "dist": self.details.get("dist", dist)})

    @property
    def torch_cuda(self) -> str | None:
        """torch's CUDA where a missing library is a CUDA library of another major than it, else None."""
        value = self.details.get("torch_cuda")
        return str(value) if value else None

    @property
    def loaded_by_import(self) -> bool:
        """False for a file no extension module of the environment loads (its findings are notes)."""
        return self.details.get("loaded_by_import") is not False


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class NotNeeded:
    """A module that cannot load but that `import <package>` does not need: the package, why, the feature it
    is for ("" when its package does not say) and the import graph's word (``no``, ``unknown``)."""

    package: str
    why: str
    feature: str
    needed: str

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> NotNeeded:
        return cls(**{f: str(data.get(f) or "") for f in ("package", "why", "feature", "needed")})

    def to_json(self) -> dict[str, str]:
        return {"package": self.package, "why": self.why, "feature": self.feature, "needed": self.needed}


def _table(value: object) -> dict[str, Any]:
    return {str(k): v for k, v in value.items()} if isinstance(value, Mapping) else {}


def _strings(value: object) -> tuple[str, ...]:
    return tuple(str(v) for v in value) if isinstance(value, list | tuple) else ()


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class StaticDetails:
    """``modules_by_dist`` is None where no cell declared the distributions (``compatlab static``'s report);
    an errored stage's details are empty, and read as this record's defaults."""

    site_packages: str = ""
    archs: tuple[str, ...] = ()
    state: StageState = StageState.PASS
    counts: Mapping[str, int] = dataclasses.field(default_factory=dict)
    modules: int = 0
    seconds: float = 0.0  # rounded to the millisecond, as written
    cache_hits: int = 0
    cache_misses: int = 0
    findings: tuple[Finding, ...] = ()
    not_needed: Mapping[str, NotNeeded] = dataclasses.field(default_factory=dict)
    modules_by_dist: Mapping[str, tuple[str, ...]] | None = None
    observed_by_import: bool = False

    @classmethod
    def of(cls, result: StageResult) -> StaticDetails:
        d = result.details
        cache = _table(d.get("cache"))
        seconds = d.get("seconds")
        by_dist = d.get("modules_by_dist")
        try:
            state = StageState(d.get("state") or StageState.PASS)
        except ValueError:
            state = StageState.PASS
        return cls(
            site_packages=str(d.get("site_packages") or ""),
            archs=_strings(d.get("archs")),
            state=state,
            counts={k: _int(v) for k, v in _table(d.get("counts")).items()},
            modules=_int(d.get("modules")),
            seconds=float(seconds) if isinstance(seconds, int | float) and not isinstance(seconds, bool) else 0.0,
            cache_hits=_int(cache.get("hits")),
            cache_misses=_int(cache.get("misses")),
            findings=tuple(Finding.from_json(f) for f in d.get("findings") or [] if isinstance(f, Mapping)),
            not_needed={k: NotNeeded.from_json(_table(v)) for k, v in _table(d.get("not_needed")).items()},
            modules_by_dist=None if by_dist is None else {k: _strings(v) for k, v in _table(by_dist).items()},
            observed_by_import=d.get("observed_by_import") is True,
        )

    def to_details(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "site_packages": self.site_packages,
            "archs": list(self.archs),
            "state": self.state,
            "counts": dict(self.counts),
            "modules": self.modules,
            "seconds": self.seconds,
            "cache": {"hits": self.cache_hits, "misses": self.cache_misses},
            "findings": [f.to_json() for f in self.findings],
            "not_needed": {k: v.to_json() for k, v in self.not_needed.items()},
        }
        if self.modules_by_dist is not None:
            out["modules_by_dist"] = {k: list(v) for k, v in self.modules_by_dist.items()}
        if self.observed_by_import:
            out["observed_by_import"] = True
        return out
