"""The NCCL suite's configuration: per-phase timeouts and ``[thresholds.nccl]``."""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Iterable, Mapping
from typing import Any


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
    """``[thresholds.nccl]``: a floor for all_reduce's busbw at the largest size."""

    min_busbw_gbps: float | None = None
    source: str = ""  # the key it came from, for messages


_THRESHOLD_KEYS = frozenset({"min-busbw-gbps"})


def _show(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "a table"
    return type(value).__name__


def nccl_thresholds(
    thresholds: Mapping[str, Any], *, target: str | None = None, targets: Iterable[str] = (),
    path: str = "matrix.toml",
) -> NcclThresholds:
    """Read ``[thresholds.nccl]`` (and ``[thresholds.nccl.<target>]``), raising ConfigError on any problem."""
    from compatlab.errors import ConfigError

    raw = thresholds.get("nccl")
    if raw is None:
        return NcclThresholds()
    if not isinstance(raw, dict):
        raise ConfigError(path, [f"thresholds.nccl: expected a table, got {_show(raw)}"])
    known_targets = sorted(targets)
    problems: list[str] = []

    def number(table: Mapping[str, Any], where: str) -> float | None:
        value = table.get("min-busbw-gbps")
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            problems.append(f"{where}.min-busbw-gbps: expected a positive number of GB/s, got {_show(value)}")
            return None
        return float(value)

    def unknown(name: str, where: str, allowed: Iterable[str]) -> None:
        close = difflib.get_close_matches(name, sorted(allowed), n=1, cutoff=0.6)
        hint = (f"; perhaps you meant {close[0]!r}?" if close
                else f"; allowed keys: {', '.join(sorted(_THRESHOLD_KEYS))}")
        problems.append(f"{where}.{name}: unknown key{hint}")

    top = number(raw, "thresholds.nccl")
    per_target: dict[str, float | None] = {}
    for key, value in raw.items():
        if key in _THRESHOLD_KEYS:
            continue
        if isinstance(value, dict):
            where = f"thresholds.nccl.{key}"
            if known_targets and key not in known_targets:
                close = difflib.get_close_matches(key, known_targets, n=1, cutoff=0.6)
                hint = f"; perhaps you meant {close[0]!r}?" if close else f" ({', '.join(known_targets)})"
                problems.append(f"{where}: not a target{hint}")
                continue
            for name in value:
                if name not in _THRESHOLD_KEYS:
                    unknown(name, where, _THRESHOLD_KEYS)
            per_target[key] = number(value, where)
        else:
            unknown(key, "thresholds.nccl", _THRESHOLD_KEYS)
    if problems:
        raise ConfigError(path, problems)
    if target is not None and per_target.get(target) is not None:
        return NcclThresholds(min_busbw_gbps=per_target[target],
                              source=f"{path}: thresholds.nccl.{target}.min-busbw-gbps")
    if top is not None:
        return NcclThresholds(min_busbw_gbps=top, source=f"{path}: thresholds.nccl.min-busbw-gbps")
    return NcclThresholds()
