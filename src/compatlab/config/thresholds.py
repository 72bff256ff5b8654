"""``[thresholds]``: the limits of every stage, in one table of keys.

Flat keys are the in-cell suites' timeouts in seconds (``import-timeout`` for loading one extension module,
``cuda-op-timeout`` for one real op on the GPU, ``jit-timeout`` for a JIT-compiled flashinfer op);
sub-tables are the GPU stages' own floors, ``[thresholds.nccl]`` (config/nccl.py) and ``[thresholds.perf]``
(config/perf.py). A new stage's limits are one entry in ``SUITE_KEYS`` or one sub-table here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from compatlab.config.check import Checker, field_default
from compatlab.config.nccl import NcclFloors, parse_nccl_thresholds
from compatlab.config.perf import PerfConfig, PerfThresholds, parse_perf_thresholds
from compatlab.errors import UsageError

__all__ = ["SUITE_KEYS", "Thresholds", "parse_threshold_args", "parse_thresholds", "suite_thresholds"]

# TOML key -> field of Thresholds; the in-cell suites read them by the TOML key (context.json).
SUITE_KEYS = {"import-timeout": "import_timeout", "cuda-op-timeout": "cuda_op_timeout", "jit-timeout": "jit_timeout"}
_TABLES = frozenset({"nccl", "perf"})


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Thresholds:
    import_timeout: float = 180.0
    cuda_op_timeout: float = 180.0
    jit_timeout: float = 900.0
    nccl: NcclFloors = dataclasses.field(default_factory=NcclFloors)
    perf: PerfThresholds = dataclasses.field(
        default_factory=lambda: PerfThresholds(
            min_speedup=dict.fromkeys(field_default(PerfConfig, "concurrency"), PerfThresholds.DEFAULT_MIN_SPEEDUP)
        )
    )

    def for_suites(self) -> dict[str, float]:
        """The in-cell suites' limits under their TOML keys, as the suites read them from context.json."""
        return {key: float(getattr(self, field)) for key, field in SUITE_KEYS.items()}


def _suite_fields(ck: Checker, raw: Mapping[str, Any], where: str) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    for key, field in SUITE_KEYS.items():
        got = ck.number(raw, where, key, expected="a positive number of seconds")
        if got is not None:
            fields[field] = float(got)
    return fields


def parse_threshold_args(items: Sequence[str]) -> dict[str, float]:
    """``KEY=SECONDS`` items of the command line (``compatlab check --threshold``) as a table for
    ``suite_thresholds``; a UsageError names an item that is not one."""
    out: dict[str, float] = {}
    for item in items:
        key, sep, value = item.partition("=")
        try:
            out[key.strip()] = float(value)
        except ValueError:
            sep = ""
        if not sep or not key.strip():
            raise UsageError(f"--threshold {item!r}: expected KEY=SECONDS, e.g. jit-timeout=600")
    return out


def suite_thresholds(raw: Mapping[str, Any], *, source: str) -> Thresholds:
    """Thresholds with the suites' keys from *raw* (e.g. ``--threshold KEY=SECONDS``); ConfigError naming *source*."""
    ck = Checker()
    ck.keys(raw, "", SUITE_KEYS)
    fields = _suite_fields(ck, raw, "")
    ck.raise_if_any(source)
    return Thresholds(**fields)


def parse_thresholds(
    ck: Checker,
    raw: Mapping[str, Any],
    *,
    path: str,
    targets: Iterable[str] = (),
    perf: PerfConfig | None = None,
    where: str = "thresholds",
) -> Thresholds:
    """Validate the raw ``[thresholds]`` table into *ck*; ``[thresholds.perf]`` is judged against *perf*'s levels.

    Without a ``[perf]`` the perf floors are still checked, against the default concurrency levels.
    """
    ck.keys(raw, where, set(SUITE_KEYS) | _TABLES)
    fields = _suite_fields(ck, raw, where)
    fields["nccl"] = parse_nccl_thresholds(ck, raw, targets=targets, path=path)
    if perf is not None:
        fields["perf"] = perf.thresholds
    else:
        levels: Sequence[int] = field_default(PerfConfig, "concurrency")
        fields["perf"] = parse_perf_thresholds(ck, raw, levels)
    return Thresholds(**fields)
