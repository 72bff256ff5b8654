"""What a compat suite may know about its cell: context.json, written by the lab and read in the cell.

Both sides use these classes (the lab's ``stages.suite`` builds a ``SuiteContext`` and writes ``to_json``; the
suites' ``compat_context`` fixture reads ``from_json``), so a key misspelt on either side is an error of the
type checker, not a silent default. Standard library only, Python 3.10 and later: it runs in the cell.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["ContextError", "PreviousStage", "SuiteContext", "TargetInfo"]


class ContextError(ValueError):
    """context.json is not the shape this module writes."""


def _strings(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ContextError(f"{where}: expected a list of strings, got {value!r}")
    return tuple(value)


def _table(data: Any, where: str, keys: frozenset[str]) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ContextError(f"{where}: expected a table, got {data!r}")
    unknown = set(data) - keys
    missing = keys - set(data)
    if unknown or missing:
        raise ContextError(f"{where}: unknown keys {sorted(unknown)}, missing keys {sorted(missing)}")
    return data


@dataclasses.dataclass(frozen=True)
class TargetInfo:
    """A target of the matrix, as far as a suite needs it."""

    name: str
    gpu: str
    arch: tuple[str, ...]
    gpus: int
    min_driver: str | None
    nccl_env: Mapping[str, str]
    not_needed: tuple[str, ...]

    KEYS = frozenset({"name", "gpu", "arch", "gpus", "min_driver", "nccl_env", "not_needed"})

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "gpu": self.gpu,
            "arch": list(self.arch),
            "gpus": self.gpus,
            "min_driver": self.min_driver,
            "nccl_env": dict(self.nccl_env),
            "not_needed": list(self.not_needed),
        }

    @classmethod
    def from_json(cls, data: Any, where: str) -> TargetInfo:
        raw = _table(data, where, cls.KEYS)
        return cls(
            name=str(raw["name"]),
            gpu=str(raw["gpu"]),
            arch=_strings(raw["arch"], f"{where}.arch"),
            gpus=int(raw["gpus"]),
            min_driver=None if raw["min_driver"] is None else str(raw["min_driver"]),
            nccl_env={str(k): str(v) for k, v in dict(raw["nccl_env"]).items()},
            not_needed=_strings(raw["not_needed"], f"{where}.not_needed"),
        )


@dataclasses.dataclass(frozen=True)
class PreviousStage:
    """A stage that ran before the suite: its state and reason."""

    state: str
    reason: str


@dataclasses.dataclass(frozen=True)
class SuiteContext:
    """One cell as its suites see it."""

    cell: str
    axes: Mapping[str, str]
    cuda: str | None
    packages: Mapping[str, str]  # distribution -> version
    site_packages: str
    venv: str
    work_dir: str
    keep: str  # where the cell keeps what one run learns for the next (the import stage's order)
    archs: tuple[str, ...]
    targets: tuple[TargetInfo, ...]
    thresholds: Mapping[str, float]
    previous: Mapping[str, PreviousStage]

    KEYS = frozenset(
        {
            "cell",
            "axes",
            "cuda",
            "packages",
            "site_packages",
            "venv",
            "work_dir",
            "keep",
            "archs",
            "targets",
            "thresholds",
            "previous",
        }
    )

    def threshold(self, key: str, default: float) -> float:
        """A suite's time limit (``import-timeout``, ``cuda-op-timeout``, ``jit-timeout``) in seconds."""
        return float(self.thresholds.get(key, default))

    def to_json(self) -> dict[str, Any]:
        return {
            "cell": self.cell,
            "axes": dict(self.axes),
            "cuda": self.cuda,
            "packages": dict(self.packages),
            "site_packages": self.site_packages,
            "venv": self.venv,
            "work_dir": self.work_dir,
            "keep": self.keep,
            "archs": list(self.archs),
            "targets": [t.to_json() for t in self.targets],
            "thresholds": dict(self.thresholds),
            "previous": {k: {"state": v.state, "reason": v.reason} for k, v in self.previous.items()},
        }

    @classmethod
    def from_json(cls, data: Any) -> SuiteContext:
        """A context as to_json wrote it; ContextError names the first key that is not."""
        raw = _table(data, "context", cls.KEYS)
        previous: dict[str, PreviousStage] = {}
        for name, stage in dict(raw["previous"]).items():
            got = _table(stage, f"context.previous.{name}", frozenset({"state", "reason"}))
            previous[str(name)] = PreviousStage(state=str(got["state"]), reason=str(got["reason"]))
        return cls(
            cell=str(raw["cell"]),
            axes={str(k): str(v) for k, v in dict(raw["axes"]).items()},
            cuda=None if raw["cuda"] is None else str(raw["cuda"]),
            packages={str(k): str(v) for k, v in dict(raw["packages"]).items()},
            site_packages=str(raw["site_packages"]),
            venv=str(raw["venv"]),
            work_dir=str(raw["work_dir"]),
            keep=str(raw["keep"]),
            archs=_strings(raw["archs"], "context.archs"),
            targets=tuple(TargetInfo.from_json(t, f"context.targets[{i}]") for i, t in enumerate(raw["targets"])),
            thresholds={str(k): float(v) for k, v in dict(raw["thresholds"]).items()},
            previous=previous,
        )

    @classmethod
    def read(cls, path: Path) -> SuiteContext:
        return cls.from_json(json.loads(path.read_text(encoding="utf-8")))
