"""Results: the versioned JSON every renderer reads. Written atomically, cell by cell."""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

__all__ = [
    "CELL_STATES",
    "SCHEMA",
    "STAGE_STATES",
    "CellResult",
    "StageResult",
    "cell_state",
    "load_run",
    "write_json_atomic",
]

SCHEMA = "compatlab.results/1"

# pass: ran and passed; warn: passed with something worth reading; fail: incompatible;
# error: the lab or infrastructure failed; skip: could not run here (reason says why).
StageState = Literal["pass", "warn", "fail", "error", "skip"]
STAGE_STATES: tuple[str, ...] = ("pass", "warn", "fail", "error", "skip")

CellState = Literal["pass", "fail", "partial", "error", "n/a"]
CELL_STATES: tuple[str, ...] = ("pass", "fail", "partial", "error", "n/a")


@dataclasses.dataclass(kw_only=True, slots=True)
class StageResult:
    """One stage of one cell."""

    name: str
    state: str
    reason: str = ""
    details: dict[str, Any] = dataclasses.field(default_factory=dict)
    seconds: float = 0.0
    # A skipped stage that a full verdict needs (a GPU stage on a CPU box) makes the cell partial.
    required: bool = True

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StageResult:
        return cls(
            name=str(data["name"]),
            state=str(data["state"]),
            reason=str(data.get("reason", "")),
            details=dict(data.get("details", {})),
            seconds=float(data.get("seconds", 0.0)),
            required=bool(data.get("required", True)),
        )


def cell_state(stages: Iterable[StageResult]) -> str:
    """Fold stage states into the cell state (see DESIGN.md, 'Cell states').

    An incompatibility wins over an infrastructure error: a red reason is never hidden as grey.
    """
    states = [(s.state, s.required) for s in stages]
    if not states:
        return "error"
    if any(st == "fail" for st, _ in states):
        return "fail"
    if any(st == "error" for st, _ in states):
        return "error"
    if any(st == "skip" and req for st, req in states):
        return "partial"
    return "pass"


@dataclasses.dataclass(kw_only=True, slots=True)
class CellResult:
    """One combination's verdict with everything needed to explain it."""

    id: str
    axes: dict[str, str]
    state: str
    expected: dict[str, str] | None = None  # {"state": "fail", "reason": ...} for known-bad cells
    unexpected: bool = False
    stages: list[StageResult] = dataclasses.field(default_factory=list)
    install: dict[str, Any] = dataclasses.field(default_factory=dict)  # argv, index, overrides
    freeze: list[str] = dataclasses.field(default_factory=list)
    started: str = ""
    finished: str = ""
    seconds: float = 0.0
    attempts: int = 1
    reason: str = ""  # the first failing stage's reason, for the grid

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["stages"] = [s.to_json() for s in self.stages]
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CellResult:
        return cls(
            id=str(data["id"]),
            axes={str(k): str(v) for k, v in dict(data["axes"]).items()},
            state=str(data["state"]),
            expected=dict(data["expected"]) if data.get("expected") else None,
            unexpected=bool(data.get("unexpected", False)),
            stages=[StageResult.from_json(s) for s in data.get("stages", [])],
            install=dict(data.get("install", {})),
            freeze=[str(x) for x in data.get("freeze", [])],
            started=str(data.get("started", "")),
            finished=str(data.get("finished", "")),
            seconds=float(data.get("seconds", 0.0)),
            attempts=int(data.get("attempts", 1)),
            reason=str(data.get("reason", "")),
        )


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON so that a reader sees the old file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=2, sort_keys=False)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_run(path: Path) -> dict[str, Any]:
    """Read a run's results.json and check its schema."""
    from compatlab.errors import ConfigError

    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(str(path), ["no such file; run `nox -s matrix` first"]) from None
    except IsADirectoryError:
        raise ConfigError(str(path), ["is a directory; give the run's results.json"]) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(str(path), [f"not UTF-8 text: {exc.reason} at byte {exc.start}"]) from None
    except OSError as exc:
        raise ConfigError(str(path), [f"cannot read: {exc.strerror}"]) from None
    except json.JSONDecodeError as exc:
        raise ConfigError(str(path), [f"not valid JSON: {exc}"]) from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        got = data.get("schema") if isinstance(data, dict) else type(data).__name__
        raise ConfigError(str(path), [f"schema: expected {SCHEMA!r}, got {got!r}"])
    return data
