"""The perf stage's details: its overall verdict, the figures (flat: ``speedup_c1``, ``eagle3_tok_s_c4``), the
verdict at each concurrency level, the trials (without per-request rows), the field the server reports the
accept length in, each trial's log tail, whether the run should be repeated (an inconclusive verdict), and
where the full reports are.

A verdict is a stage state or ``inconclusive`` (the trials' noise straddles the floor) or ``unknown`` (a
figure the server did not give): ``stages/perf/stage.py``'s ``Verdict``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from compatlab.runs.model import StageResult
from compatlab.runs.records.common import number, table, tables, text

__all__ = ["LevelVerdict", "PerfDetails"]


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class LevelVerdict:
    """One concurrency level: its verdict, the trials' spread, whether that is noise, and each check
    ({"figure", "floor", … as the stage judged it})."""

    verdict: str
    spread: float | None
    noisy: bool
    checks: tuple[dict[str, Any], ...]

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LevelVerdict:
        return cls(
            verdict=str(data.get("verdict", "")),
            spread=number(data.get("spread")),
            noisy=bool(data.get("noisy")),
            checks=tables(data.get("checks")),
        )

    def to_json(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "spread": self.spread, "noisy": self.noisy, "checks": list(self.checks)}


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class PerfDetails:
    """``outputs`` ({"perf", "benchmark"}: the reports' paths) and ``log_tail`` (a run that failed before its
    trials) are None where absent."""

    verdict: str
    figures: Mapping[str, float] = dataclasses.field(default_factory=dict)
    verdicts: Mapping[str, LevelVerdict] = dataclasses.field(default_factory=dict)
    trials: tuple[dict[str, Any], ...] = ()
    accept_length_field: str | None = None
    logs: Mapping[str, str] = dataclasses.field(default_factory=dict)
    rerun: bool = False
    outputs: Mapping[str, str] | None = None
    log_tail: str | None = None

    @classmethod
    def of(cls, result: StageResult) -> PerfDetails:
        d = result.details
        outputs = d.get("outputs")
        return cls(
            verdict=str(d.get("verdict", "")),
            figures={k: v for k, v in table(d.get("figures")).items() if number(v) is not None},
            verdicts={k: LevelVerdict.from_json(table(v)) for k, v in table(d.get("verdicts")).items()},
            trials=tables(d.get("trials")),
            accept_length_field=text(d.get("accept_length_field")),
            logs={k: str(v) for k, v in table(d.get("logs")).items()},
            rerun=d.get("rerun") is True,
            outputs=None if outputs is None else {k: str(v) for k, v in table(outputs).items()},
            log_tail=text(d.get("log_tail")),
        )

    def to_details(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "verdict": self.verdict,
            "figures": dict(self.figures),
            "verdicts": {k: v.to_json() for k, v in self.verdicts.items()},
            "trials": list(self.trials),
            "accept_length_field": self.accept_length_field,
            "logs": dict(self.logs),
            "rerun": self.rerun,
        }
        if self.outputs is not None:
            out["outputs"] = dict(self.outputs)
        if self.log_tail:
            out["log_tail"] = self.log_tail
        return out
