"""The pins stage's details: each declared pin and what is installed, the requirements the installed set
breaks (what ``uv pip check`` would say), the files two distributions install with different bytes, torch's
CUDA and the cell's, the CUDA packages by major, and the stage's failures and warnings, in that order.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from compatlab.runs.model import StageResult
from compatlab.runs.records.common import table, tables, text, texts

__all__ = ["BrokenRequirement", "FileClash", "Pin", "PinsDetails"]


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Pin:
    """A declared pin: ``installed`` None when absent; ``culprits`` (who asked for another version) only
    for one that was replaced."""

    package: str
    declared: str
    installed: str | None
    culprits: tuple[str, ...] | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Pin:
        culprits = data.get("culprits")
        return cls(
            package=str(data.get("package", "")),
            declared=str(data.get("declared", "")),
            installed=text(data.get("installed")),
            culprits=None if culprits is None else texts(culprits),
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"package": self.package, "declared": self.declared, "installed": self.installed}
        if self.culprits is not None:
            out["culprits"] = list(self.culprits)
        return out


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class BrokenRequirement:
    """A Requires-Dist the installed set violates: *by* (canonical) requires *requires* on *package*, of
    which *installed* is installed ("" when absent); *text* says it in one line."""

    by: str
    requires: str
    package: str
    installed: str
    text: str

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> BrokenRequirement:
        return cls(**{f: str(data.get(f) or "") for f in ("by", "requires", "package", "installed", "text")})

    def to_json(self) -> dict[str, str]:
        return {
            "by": self.by,
            "requires": self.requires,
            "package": self.package,
            "installed": self.installed,
            "text": self.text,
        }


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class FileClash:
    """A file clash as ``owners.FileClash.to_json`` wrote it (``raw``: every key, in its order), with what the
    lab reads typed: its one line, whether it fails, its owners ("name version") and example paths. The import
    stage adds what it saw (``runtime.observed_clashes``): the failures it ``breaks``, or that it was
    ``observed`` to load."""

    raw: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    text: str = ""
    fails: bool = False
    owners: tuple[str, ...] = ()
    examples: tuple[str, ...] = ()
    breaks: tuple[str, ...] | None = None
    observed: str | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> FileClash:
        breaks = data.get("breaks")
        return cls(
            raw=dict(data),
            text=str(data.get("text") or ""),
            fails=bool(data.get("fails")),
            owners=texts(data.get("owners")),
            examples=tuple(e for e in data.get("examples") or [] if isinstance(e, str)),
            breaks=None if breaks is None else texts(breaks),
            observed=text(data.get("observed")),
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.raw)  # a key an older lab did not write stays out unless it is set
        if "fails" in self.raw or self.fails:
            out["fails"] = self.fails
        if "text" in self.raw or self.text:
            out["text"] = self.text
        if "owners" in self.raw or self.owners:
            out["owners"] = list(self.owners)
        if "examples" in self.raw or self.examples:
            out["examples"] = list(self.examples)
        if self.breaks is not None:
            out["breaks"] = list(self.breaks)
        if self.observed is not None:
            out["observed"] = self.observed
        return out


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class PinsDetails:
    """``cuda_packages`` ({major: ["name==version", …]}) is None for a cell without a CUDA axis."""

    pins: tuple[Pin, ...] = ()
    broken_requirements: tuple[BrokenRequirement, ...] = ()
    file_clashes: tuple[FileClash, ...] = ()
    torch_cuda: str | None = None
    cell_cuda: str | None = None
    cuda_packages: Mapping[str, tuple[str, ...]] | None = None
    failures: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()

    @classmethod
    def of(cls, result: StageResult) -> PinsDetails:
        d = result.details
        packages = d.get("cuda_packages")
        return cls(
            pins=tuple(Pin.from_json(p) for p in tables(d.get("pins"))),
            broken_requirements=tuple(BrokenRequirement.from_json(b) for b in tables(d.get("broken_requirements"))),
            file_clashes=tuple(FileClash.from_json(c) for c in tables(d.get("file_clashes"))),
            torch_cuda=text(d.get("torch_cuda")),
            cell_cuda=text(d.get("cell_cuda")),
            cuda_packages=None if packages is None else {k: texts(v) for k, v in table(packages).items()},
            failures=texts(d.get("failures")),
            warnings=texts(d.get("warnings")),
        )

    def to_details(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "pins": [p.to_json() for p in self.pins],
            "broken_requirements": [b.to_json() for b in self.broken_requirements],
            "file_clashes": [c.to_json() for c in self.file_clashes],
            "torch_cuda": self.torch_cuda,
            "cell_cuda": self.cell_cuda,
        }
        if self.cuda_packages is not None:
            out["cuda_packages"] = {k: list(v) for k, v in self.cuda_packages.items()}
        out["failures"] = list(self.failures)
        out["warnings"] = list(self.warnings)
        return out
