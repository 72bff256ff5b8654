"""The measured figures a stage records: the NCCL stage's ``busbw_gbps`` and the ``figures`` table of the serve
and perf stages (``name`` -> a finite number: ``baseline_tok_s_c1``, ``speedup_c1``, ``jit_cache_reused_files``).

``rank`` orders them for a grid cell that has room for a few: bus bandwidth, speedups, throughputs, the rest.
"""

from __future__ import annotations

import dataclasses

from compatlab.runs.model import StageResult
from compatlab.runs.records.common import number, table

__all__ = ["Figure", "figures_of"]


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Figure:
    name: str
    value: float

    @property
    def rank(self) -> int:
        name = self.name
        return 0 if "busbw" in name else 1 if "speedup" in name else 2 if "tok_s" in name else 3


def figures_of(result: StageResult) -> tuple[Figure, ...]:
    """The stage's figures, ``busbw_gbps`` first, then its ``figures`` in their order; a value that is not a
    finite number (a bool, a string, NaN) is left out."""
    out: list[Figure] = []
    busbw = number(result.details.get("busbw_gbps"))
    if busbw is not None:
        out.append(Figure(name="busbw_gbps", value=float(busbw)))
    for name, value in table(result.details.get("figures")).items():
        got = number(value)
        if got is not None:
            out.append(Figure(name=name, value=float(got)))
    return tuple(out)
