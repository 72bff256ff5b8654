"""The NCCL suite's result: what one run found, filled in by ranks.py (hangs, crashes, rank states) and
report.py (figures, checks, the verdict), and read by stage.py."""

from __future__ import annotations

import dataclasses
from typing import Any

from compatlab.runs.model import StageState

__all__ = ["NcclReport"]


@dataclasses.dataclass(kw_only=True, slots=True)
class NcclReport:
    """What one run of the suite found; ``details()`` is what goes into the stage result."""

    state: StageState  # pass, fail or error
    reason: str
    world_size: int
    backend: str
    env: dict[str, str]
    nccl_version: str | None = None
    torch_version: str | None = None
    device: str | None = None
    topo: str | None = None
    init_seconds: float | None = None
    correctness: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    sweep: dict[str, dict[int, dict[str, Any]]] = dataclasses.field(default_factory=dict)
    busbw_gbps: float | None = None
    threshold: dict[str, Any] | None = None
    hang: dict[str, Any] | None = None
    crash: dict[str, Any] | None = None
    ranks: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    seconds: float = 0.0

    def details(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        for key in ("state", "reason", "seconds"):  # the stage result's own fields
            data.pop(key)
        return data

    @property
    def failures(self) -> list[str]:
        """One message per wrong collective result: op, dtype, size, rank, expected vs got."""
        out = []
        for entry in self.correctness:
            for f in entry["failures"]:
                out.append(f["message"])
        return out
