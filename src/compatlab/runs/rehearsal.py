"""A rehearsal's result: an install applied to a copy of an environment, both judged by ``check``'s pipeline.

``rehearsal.json`` (REHEARSAL_SCHEMA) is what renderers read (render/rehearsal.py writes ``rehearsal.md`` and
``index.html`` beside it); each environment judged has its own one-cell run beside them, as ``compatlab
check`` writes it (``original/``, ``after/``, ``safer-<n>/``). Written once, atomically, at the end.
"""

from __future__ import annotations

import dataclasses
from enum import StrEnum
from pathlib import Path
from typing import Any

from compatlab.runs.atomic import write_json_atomic

__all__ = [
    "REHEARSAL_SCHEMA",
    "Attempt",
    "Change",
    "Install",
    "Judged",
    "ModuleChange",
    "ModuleState",
    "Outcome",
    "Rehearsal",
]

REHEARSAL_SCHEMA = "compatlab.rehearsal/1"


class ModuleState(StrEnum):
    """A module (a package's import, or a shared object) in one environment."""

    PASS = "pass"  # noqa: S105 - a state, not a password
    WARN = "warn"  # failed alone; its package's import does not need it
    FAIL = "fail"
    ABSENT = "absent"  # not in this environment

    @property
    def works(self) -> bool:
        return self in (ModuleState.PASS, ModuleState.WARN)


class Outcome(StrEnum):
    """The rehearsal's answer to "can I run this install tonight?"."""

    SAFE = "safe"  # nothing that works now breaks
    BREAKS = "breaks"  # something that works now breaks
    INSTALL_FAILS = "install-fails"  # uv refused or failed: the environment would stay as it is
    ERROR = "error"  # the lab could not judge: the question is unanswered


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Change:
    """One distribution the install changes; ``old``/``new`` "" where it is added or removed."""

    name: str
    old: str
    new: str
    old_cuda: str = ""  # the CUDA it is built for or belongs to, where the lab can tell
    new_cuda: str = ""
    asked_by: tuple[str, ...] = ()  # who requires it after the install: "flashish 0.6.0 requires torch>=2.0.0"

    @property
    def old_variant(self) -> str:
        """The build variant, the version's local label (``cu130`` of ``2.9.1+cu130``); "" for a generic build."""
        return self.old.partition("+")[2]

    @property
    def new_variant(self) -> str:
        return self.new.partition("+")[2]

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "old": self.old,
            "new": self.new,
            "old_variant": self.old_variant,
            "new_variant": self.new_variant,
            "old_cuda": self.old_cuda,
            "new_cuda": self.new_cuda,
            "asked_by": list(self.asked_by),
        }


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class ModuleChange:
    """A module whose verdict differs between the environment as it is and after the install."""

    module: str
    dist: str
    before: ModuleState
    after: ModuleState
    cause: str = ""  # why it fails after (the stage results' words), or why it failed before, for a fix
    code: str = ""  # the cause's code (incell/causes.py), where a stage gave one

    def to_json(self) -> dict[str, Any]:
        return {
            "module": self.module,
            "dist": self.dist,
            "before": self.before.value,
            "after": self.after.value,
            "cause": self.cause,
            **({"code": self.code} if self.code else {}),
        }


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Install:
    """What uv did to a copy: its exit, the one-line reason of a failure, the time it took."""

    ok: bool
    reason: str = ""
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "reason": self.reason, "seconds": self.seconds}


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Judged:
    """One environment through ``check``'s pipeline: its cell's state and reason, and where its run is."""

    state: str  # the CellState's value
    reason: str
    report: str  # the folder of its one-cell run (index.html, results.json, packages.md)
    seconds: float

    def to_json(self) -> dict[str, Any]:
        return {"state": self.state, "reason": self.reason, "report": self.report, "seconds": self.seconds}


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Attempt:
    """An install applied to a copy and judged: the request as typed, or a safer command tried for it."""

    label: str  # what was tried, in words
    command: tuple[str, ...]  # the uv command as the box owner would run it on the environment (redacted)
    install: Install
    outcome: Outcome
    changes: tuple[Change, ...] = ()
    broken_pins: tuple[str, ...] = ()
    breaks: tuple[ModuleChange, ...] = ()
    fixes: tuple[ModuleChange, ...] = ()
    new_broken: tuple[ModuleChange, ...] = ()  # modules the install adds that fail
    gone: tuple[ModuleChange, ...] = ()  # modules that worked, of distributions the install removes
    judged: Judged | None = None
    constraints: dict[str, str] = dataclasses.field(default_factory=dict)  # what it held, name -> version
    constraints_file: str = ""
    copy: dict[str, Any] = dataclasses.field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "command": list(self.command),
            "outcome": self.outcome.value,
            "install": self.install.to_json(),
            "changes": [c.to_json() for c in self.changes],
            "broken_pins": list(self.broken_pins),
            "breaks": [m.to_json() for m in self.breaks],
            "fixes": [m.to_json() for m in self.fixes],
            "new_broken": [m.to_json() for m in self.new_broken],
            "gone": [m.to_json() for m in self.gone],
            "judged": self.judged.to_json() if self.judged else None,
            "constraints": dict(self.constraints),
            "constraints_file": self.constraints_file,
            "copy": dict(self.copy),
        }


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Rehearsal:
    """The whole answer: the environment judged as it is, the request, and the safer commands tried."""

    id: str
    environment: str  # its folder
    python: str  # its interpreter's version
    started: str
    seconds: float
    original: Judged
    request: Attempt
    safer: tuple[Attempt, ...] = ()
    gpus: int = 0

    @property
    def outcome(self) -> Outcome:
        return self.request.outcome

    @property
    def suggested(self) -> Attempt | None:
        """The first safer command that was tried and keeps what works."""
        return next((a for a in self.safer if a.outcome == Outcome.SAFE), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": REHEARSAL_SCHEMA,
            "id": self.id,
            "environment": self.environment,
            "python": self.python,
            "started": self.started,
            "seconds": self.seconds,
            "gpus": self.gpus,
            "outcome": self.outcome.value,
            "original": self.original.to_json(),
            "request": self.request.to_json(),
            "safer": [a.to_json() for a in self.safer],
            "suggested": self.safer.index(self.suggested) if self.suggested else None,
        }

    def write(self, path: Path) -> None:
        write_json_atomic(path, self.to_json())
