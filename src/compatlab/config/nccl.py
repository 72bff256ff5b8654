"""The NCCL suite's configuration: per-phase timeouts and ``[thresholds.nccl]``.

``[thresholds.nccl]`` holds one floor, ``min-busbw-gbps`` (all_reduce's bus bandwidth at the largest size,
in GB/s), for every target, and optionally a sub-table per target name that replaces it on that target:
``[thresholds.nccl.h200x8] min-busbw-gbps = 350``.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Iterable, Mapping
from typing import Any

from compatlab.config.check import Checker, show

__all__ = ["NcclFloors", "NcclThresholds", "NcclTimeouts", "nccl_thresholds", "parse_nccl_thresholds"]


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class NcclTimeouts:
    """Hard limits in seconds per phase; init counts from the start of the rank's process."""

    init: float = 180.0
    correctness: float = 180.0
    bandwidth: float = 600.0
    grace: float = 5.0  # how long the others may take to notice a dead rank before they count as hung
    stack: float = 3.0  # how long to wait for the stacks a rank writes on SIGUSR1

    def phase(self, name: str) -> float:
        return float(getattr(self, name))


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class NcclThresholds:
    """The floor one run is judged by: all_reduce's busbw at the largest size."""

    min_busbw_gbps: float | None = None
    source: str = ""  # the key it came from, for messages


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class NcclFloors:
    """``[thresholds.nccl]`` as written: a floor for every target, and floors per target name."""

    path: str = "matrix.toml"
    min_busbw_gbps: float | None = None
    per_target: Mapping[str, float] = dataclasses.field(default_factory=dict)

    def for_target(self, target: str | None) -> NcclThresholds:
        """The floor on *target* (its own, else the matrix's), naming the key it came from."""
        if target is not None and target in self.per_target:
            return NcclThresholds(
                min_busbw_gbps=self.per_target[target], source=f"{self.path}: thresholds.nccl.{target}.min-busbw-gbps"
            )
        if self.min_busbw_gbps is not None:
            return NcclThresholds(
                min_busbw_gbps=self.min_busbw_gbps, source=f"{self.path}: thresholds.nccl.min-busbw-gbps"
            )
        return NcclThresholds()


_THRESHOLD_KEYS = frozenset({"min-busbw-gbps"})


def parse_nccl_thresholds(
    ck: Checker, thresholds: Mapping[str, Any], *, targets: Iterable[str], path: str
) -> NcclFloors:
    """Validate ``[thresholds.nccl]`` into *ck*; the floors that are valid come back."""
    raw = thresholds.get("nccl")
    if raw is None:
        return NcclFloors(path=path)
    if not isinstance(raw, dict):
        ck.error("thresholds.nccl", f"expected a table, got {show(raw)}")
        return NcclFloors(path=path)
    known_targets = sorted(targets)

    def floor(table: Mapping[str, Any], where: str) -> float | None:
        got = ck.number(table, where, "min-busbw-gbps", expected="a positive number of GB/s")
        return None if got is None else float(got)

    top = floor(raw, "thresholds.nccl")
    per_target: dict[str, float] = {}
    for key, value in raw.items():
        if key in _THRESHOLD_KEYS:
            continue
        if not isinstance(value, dict):
            ck.keys({key: value}, "thresholds.nccl", _THRESHOLD_KEYS)
            continue
        where = f"thresholds.nccl.{key}"
        if key not in known_targets:
            close = difflib.get_close_matches(key, known_targets, n=1, cutoff=0.6)
            if close:
                hint = f"; perhaps you meant {close[0]!r}?"
            elif known_targets:
                hint = f" ({', '.join(known_targets)})"
            else:
                hint = "; this matrix has no [targets.<name>]"
            ck.error(where, f"not a target{hint}")
            continue
        ck.keys(value, where, _THRESHOLD_KEYS)
        got = floor(value, where)
        if got is not None:
            per_target[key] = got
    return NcclFloors(path=path, min_busbw_gbps=top, per_target=per_target)


def nccl_thresholds(
    thresholds: Mapping[str, Any],
    *,
    target: str | None = None,
    targets: Iterable[str] = (),
    path: str = "matrix.toml",
) -> NcclThresholds:
    """Read ``[thresholds.nccl]`` from a raw ``[thresholds]`` table for *target*; ConfigError on any problem.

    A matrix does this at load (``Matrix.thresholds.nccl``); this is the same for a table on its own.
    """
    ck = Checker()
    floors = parse_nccl_thresholds(ck, thresholds, targets=targets, path=path)
    ck.raise_if_any(path)
    return floors.for_target(target)
