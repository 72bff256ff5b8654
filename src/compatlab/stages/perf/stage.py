"""The EAGLE-3 throughput suite: does speculative decoding beat the baseline on this stack, and by how much?

``[perf]`` in matrix.toml describes two engine runs, ``baseline`` and ``eagle3``; ``[thresholds.perf]`` the
floors. Each trial starts a server in its own process group, waits for health, warms it up, streams the
shipped prompt set at every concurrency level, and stops it (SIGTERM, then SIGKILL to the whole group).
Trials alternate baseline/EAGLE-3 in an ABBA order so that drift of the box does not favour either. The
verdict per concurrency level compares medians; when the trials spread wider than ``max-spread`` *and*
their range straddles a floor, the level is *inconclusive*: a rerun, not a red.

Before measuring, ``/server_info`` must show that the eagle3 server runs EAGLE3 and the baseline does not
speculate. ``/flush_cache`` runs after warm-up and before each level, so that the server's lifetime
``avg_spec_accept_length`` (the fallback accept length) covers that level only, and every level starts
from an empty prefix cache: TTFT is a cold-prefix figure. A level with a failed request (an error or an
abort inside a 200 stream included) is ``error``, naming the server's message: never a pass, never a
"too slow" fail. Latency figures are SGLang's benchmark's, by its names (see ``perf_client``).

Outputs: ``perf.json`` (everything, versioned), ``benchmark.json`` (pytest-benchmark format; throughput as
seconds per output token so that "higher is worse" holds for ``pytest-benchmark compare``), server logs,
and the cell's ``perf`` StageResult with flat ``details.figures``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import platform
import random
import shutil
import statistics
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any

# Public here before the configuration moved out; explicit re-exports for mypy.
from compatlab.config.perf import HEALTH_PATHS as HEALTH_PATHS  # noqa: PLC0414
from compatlab.config.perf import PROTOCOLS as PROTOCOLS  # noqa: PLC0414
from compatlab.config.perf import SERVERS, PerfConfig, ServerSpec, Thresholds, load_prompts, parse_perf, resolve_argv
from compatlab.errors import ConfigError
from compatlab.proc import ProgramNotFound
from compatlab.runs.atomic import write_json_atomic
from compatlab.runs.model import StageResult, StageState
from compatlab.runs.records.perf import LevelVerdict, PerfDetails
from compatlab.stages.base import CellContext, cell_env
from compatlab.stages.bytecode import bytecode_env
from compatlab.stages.sglang.client import STATS, LevelResult, Target, run_level
from compatlab.stages.sglang.server import (
    NOT_LOGGED,
    ServerFailure,
    ServerProcess,
    check_speculation,
    group_members,
    port_is_free,
)

__all__ = [
    "EXIT_CODES",
    "PERF_SCHEMA",
    "PerfConfig",
    "PerfReport",
    "ServerFailure",
    "ServerProcess",
    "ServerSpec",
    "Thresholds",
    "group_members",
    "load_prompts",
    "parse_perf",
    "port_is_free",
    "resolve_argv",
    "run_perf",
    "run_perf_stage",
]

log = logging.getLogger(__name__)

PERF_SCHEMA = "compatlab.perf/1"
FIELD_META = "meta_info.completion_tokens / meta_info.spec_verify_ct"
FIELD_SERVER = "server_info.internal_states[0].avg_spec_accept_length"
# The latency figures of a level, as SGLang's benchmark names them (milliseconds).
LATENCY = tuple(f"{stat}_{what}_ms" for what in ("ttft", "itl", "tpot") for stat in STATS)


def _level_record(level: LevelResult, server_accept: float | None, note: str | None) -> dict[str, Any]:
    accept, field = level.accept_length, FIELD_META
    if accept is None and server_accept is not None:
        accept, field = server_accept, FIELD_SERVER
    return {
        "concurrency": level.concurrency,
        "tok_s": level.tok_s,  # SGLang's output_throughput
        "s_per_token": 1 / level.tok_s if level.tok_s else None,
        **level.latency_stats(),
        "tokens": level.tokens,
        "requests": len(level.requests),
        "wall_s": level.wall,
        "accept_length": accept,
        "accept_length_field": field if accept is not None else None,
        "server_accept_length": server_accept,
        "server_accept_length_note": note,
        # prompt, tokens, ttft s, latency s, tpot s, tokens in the first chunk, verify steps: one row a request
        "per_request": [
            [
                r.prompt,
                r.tokens,
                round(r.ttft, 6),
                round(r.latency, 6),
                None if r.tpot is None else round(r.tpot, 7),
                r.first_tokens,
                r.spec_verify_ct,
            ]
            for r in level.requests
        ],
    }


def _life(
    config: PerfConfig,
    name: str,
    trial: int,
    *,
    argv: list[str],
    env: dict[str, str],
    prompts: list[str],
    order: list[int],
    out_dir: Path,
    record: dict[str, Any],
) -> None:
    """Start, check, warm up, measure and stop one server; fills *record*, raises ServerFailure."""
    spec = config.servers[name]
    server = ServerProcess(spec, argv, env, out_dir / "logs" / f"{name}-trial{trial + 1}.log")
    record.update(server=name, trial=trial + 1, log=str(server.log_path), port=server.port, levels={})
    try:
        with server:
            record["pid"] = server.pid
            start = time.monotonic()
            info = server.wait_ready()
            record["startup_s"] = time.monotonic() - start
            record["model"] = info.get("model_path")
            check_speculation(server, name, record)
            model = server.openai_model(info) if config.protocol == "openai" else "default"
            record["served_model"] = model
            target = Target(
                port=server.port,
                protocol=config.protocol,
                model=model,
            )

            def measure(concurrency: int, requests: int) -> LevelResult:
                return run_level(
                    target,
                    prompts,
                    concurrency=concurrency,
                    requests=requests,
                    order=order,
                    output_len=config.output_len,
                    seed=config.seed,
                    timeout=config.request_timeout,
                    idle=config.stall_timeout,
                )

            if config.warmup:
                _check_level(server, measure(1, config.warmup), "during warm-up")
            for c in config.concurrency:
                server.flush_cache(f"before concurrency {c}")
                level = measure(c, config.requests_at(c))
                _check_level(server, level, f"at concurrency {c}")
                accept, note = server.server_accept_length() if name == "eagle3" else (None, None)
                record["levels"][str(c)] = _level_record(level, accept, note)
                log.info(
                    "%s trial %d c%d: %.1f tok/s, median ttft %.1f ms",
                    name,
                    trial + 1,
                    c,
                    level.tok_s,
                    record["levels"][str(c)]["median_ttft_ms"] or 0.0,
                )
        if server.leftover:
            raise ServerFailure(StageState.ERROR, server.leftover)
    except ServerFailure as failure:
        if server.leftover:
            log.warning("%s", server.leftover)
        if not failure.tail:
            failure.tail = server.tail()
        raise
    finally:
        record["exit"] = server.returncode
        record["log_tail"] = server.tail()


def _check_level(server: ServerProcess, level: LevelResult, when: str) -> None:
    if not level.errors:
        return
    first = level.errors[0]
    done = sum(1 for r in level.requests if r.ok)
    time.sleep(0.2)  # a dying server may need a moment to be reaped
    died = server.died(f"{when} ({first.error}; {done} of {len(level.requests)} requests finished)")
    if died:
        raise died
    message = f"{server.spec.name} server failed a request {when}: {first.error}"
    raise ServerFailure(StageState.ERROR, message, server.tail())


def _spread(values: Sequence[float]) -> float:
    mid = statistics.median(values)
    return (max(values) - min(values)) / mid if mid else 0.0


class Verdict(StrEnum):
    """A perf check's answer: the stage's states, plus inconclusive (the trials' noise straddles the floor)
    and unknown (a figure the server did not give)."""

    PASS = "pass"  # noqa: S105 - a verdict, not a password
    FAIL = "fail"
    ERROR = "error"
    INCONCLUSIVE = "inconclusive"
    UNKNOWN = "unknown"

    @property
    def state(self) -> StageState:
        """The stage's state for this verdict: no answer (inconclusive, unknown) is an error, never a pass."""
        return StageState(self.value) if self in (Verdict.PASS, Verdict.FAIL) else StageState.ERROR


def _judge(lo: float, mid: float, hi: float, floor: float, noisy: bool) -> Verdict:
    """pass/fail when the trials' whole range is on one side of the floor, or the noise is small."""
    if lo >= floor:
        return Verdict.PASS
    if hi < floor:
        return Verdict.FAIL
    if noisy:
        return Verdict.INCONCLUSIVE
    return Verdict.PASS if mid >= floor else Verdict.FAIL


def _verdicts(config: PerfConfig, lives: list[dict[str, Any]]) -> tuple[dict[str, float], dict[str, Any]]:
    figures: dict[str, float] = {}
    verdicts: dict[str, Any] = {}
    th = config.thresholds
    for c in config.concurrency:
        per: dict[str, dict[str, list[float]]] = {}
        for name in SERVERS:
            levels = [life["levels"][str(c)] for life in lives if life["server"] == name]
            per[name] = {k: [lv[k] for lv in levels if lv[k] is not None] for k in ("tok_s", *LATENCY, "accept_length")}
            tok = per[name]["tok_s"]
            figures[f"{name}_tok_s_c{c}"] = statistics.median(tok)
            for key in LATENCY:  # the median over trials of each level figure
                if per[name][key]:
                    figures[f"{name}_{key}_c{c}"] = statistics.median(per[name][key])
            figures[f"{name}_spread_c{c}"] = _spread(tok)
        b, e = per["baseline"]["tok_s"], per["eagle3"]["tok_s"]
        mb, me = statistics.median(b), statistics.median(e)
        speedup = me / mb if mb else 0.0
        figures[f"speedup_c{c}"] = speedup
        accept = per["eagle3"]["accept_length"]
        if accept:
            figures[f"accept_length_c{c}"] = statistics.median(accept)
        spread = max(_spread(b), _spread(e))
        noisy = spread > th.max_spread
        checks = []
        floor = th.min_speedup.get(c)
        if floor is not None:
            lo, hi = (min(e) / max(b), max(e) / min(b)) if min(b) > 0 and max(b) > 0 else (0.0, 0.0)
            checks.append(
                {
                    "check": "min-speedup",
                    "floor": floor,
                    "value": speedup,
                    "range": [lo, hi],
                    "verdict": _judge(lo, speedup, hi, floor, noisy),
                }
            )
        floor = th.min_tok_s.get(c)
        if floor is not None:
            checks.append(
                {
                    "check": "min-tok-s",
                    "floor": floor,
                    "value": me,
                    "range": [min(e), max(e)],
                    "verdict": _judge(min(e), me, max(e), floor, noisy),
                }
            )
        if th.min_accept_length is not None:
            if accept:
                value = statistics.median(accept)
                verdict = _judge(min(accept), value, max(accept), th.min_accept_length, noisy)
                checks.append(
                    {
                        "check": "min-accept-length",
                        "floor": th.min_accept_length,
                        "value": value,
                        "range": [min(accept), max(accept)],
                        "verdict": verdict,
                    }
                )
            else:
                # /server_info showed EAGLE3 on: no figure means the server has not logged one yet.
                checks.append(
                    {
                        "check": "min-accept-length",
                        "floor": th.min_accept_length,
                        "value": None,
                        "verdict": Verdict.UNKNOWN,
                    }
                )
        verdict = _worst({str(ch["verdict"]) for ch in checks})
        verdicts[str(c)] = {"verdict": verdict, "spread": spread, "noisy": noisy, "checks": checks}
    return figures, verdicts


def _explain(c: int, check: dict[str, Any], figures: Mapping[str, float], max_spread: float) -> str:
    b, e = figures[f"baseline_tok_s_c{c}"], figures[f"eagle3_tok_s_c{c}"]
    name, floor, value, verdict = check["check"], check["floor"], check["value"], check["verdict"]
    if verdict == Verdict.INCONCLUSIVE:
        lo, hi = check["range"]
        return (
            f"inconclusive at concurrency {c}: the trials spread more than max-spread {max_spread:.0%} "
            f"and their range ({lo:.2f}-{hi:.2f}) straddles {name} {floor:g}; rerun on a quiet box"
        )
    if name == "min-speedup":
        how = "slower than" if value < 1 else "not enough faster than"
        return (
            f"EAGLE-3 is {how} the baseline at concurrency {c}: {e:.1f} vs {b:.1f} tok/s "
            f"(speedup {value:.2f}, min-speedup {floor:g})"
        )
    if name == "min-tok-s":
        return f"EAGLE-3 at concurrency {c}: {value:.1f} tok/s is below min-tok-s {floor:g}"
    if value is None:
        return (
            f"EAGLE-3 accept length at concurrency {c} is unknown: the streams carry no "
            f"meta_info.spec_verify_ct and the eagle3 server's avg_spec_accept_length is {NOT_LOGGED} "
            '(/server_info; SGLang logs it every 40 decode batches): use protocol "generate" or more '
            "requests"
        )
    return f"EAGLE-3 accept length at concurrency {c}: {value:.2f} is below min-accept-length {floor:g}"


@dataclasses.dataclass(kw_only=True, slots=True)
class PerfReport:
    """What a perf run found: ``state`` the stage's, ``verdict`` the same or inconclusive."""

    state: StageState
    verdict: Verdict
    reason: str
    figures: dict[str, float] = dataclasses.field(default_factory=dict)
    verdicts: dict[str, Any] = dataclasses.field(default_factory=dict)
    trials: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    accept_length_field: str | None = None
    log_tail: str = ""
    seconds: float = 0.0
    out_dir: Path | None = None

    @property
    def pids(self) -> list[int]:
        return [t["pid"] for t in self.trials if "pid" in t]

    def to_json(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        data["out_dir"] = str(self.out_dir) if self.out_dir else None
        return {"schema": PERF_SCHEMA, **data}

    def stage_result(self) -> StageResult:
        trials = [
            {k: v for k, v in t.items() if k not in ("levels", "log_tail")}
            | {
                "levels": {
                    c: {k: v for k, v in lv.items() if k != "per_request"} for c, lv in t.get("levels", {}).items()
                }
            }
            for t in self.trials
        ]
        tails = {f"{t['server']}-trial{t['trial']}": t.get("log_tail", "") for t in self.trials}
        outputs = (
            {"perf": str(self.out_dir / "perf.json"), "benchmark": str(self.out_dir / "benchmark.json")}
            if self.out_dir is not None
            else None
        )
        details = PerfDetails(
            verdict=self.verdict,
            figures=self.figures,
            verdicts={c: LevelVerdict.from_json(v) for c, v in self.verdicts.items()},
            trials=tuple(trials),
            accept_length_field=self.accept_length_field,
            logs=tails,
            rerun=self.verdict == Verdict.INCONCLUSIVE,
            outputs=outputs,
            log_tail=self.log_tail or None,
        ).to_details()
        return StageResult(name="perf", state=self.state, reason=self.reason, details=details, seconds=self.seconds)


def _environment(env: Mapping[str, str] | None) -> dict[str, str]:
    return dict(os.environ if env is None else env)


def run_perf(config: PerfConfig, out_dir: Path, *, env: Mapping[str, str] | None = None) -> PerfReport:
    """Run every trial of both servers, judge, and write ``perf.json`` and ``benchmark.json`` to *out_dir*.

    *env* is the environment for the servers and for ``${VAR}`` (default: this process's). Raises
    ConfigError for a missing variable and ProgramNotFound for a missing program; a server that fails
    becomes the report's state and reason, never an exception.
    """
    start = time.monotonic()
    base_env = _environment(env)
    resolved = resolve_argv(config, base_env)
    for name, (argv, _) in resolved.items():
        if shutil.which(argv[0], path=base_env.get("PATH")) is None:
            raise ProgramNotFound(f"perf.servers.{name}.argv[0]: program {argv[0]!r} not found on PATH")
    prompts = load_prompts(config.prompts)
    order = list(range(len(prompts)))
    random.Random(config.seed).shuffle(order)  # noqa: S311 - a fixed prompt order, not a secret
    lives: list[dict[str, Any]] = []
    report = PerfReport(state=StageState.ERROR, verdict=Verdict.ERROR, reason="", out_dir=out_dir)
    try:
        for trial in range(config.trials):
            # ABBA: baseline first in even trials, EAGLE-3 first in odd ones, so drift cancels out.
            names = SERVERS if trial % 2 == 0 else SERVERS[::-1]
            for name in names:
                argv, extra = resolved[name]
                record: dict[str, Any] = {}
                lives.append(record)
                _life(
                    config,
                    name,
                    trial,
                    argv=argv,
                    env={**base_env, **extra},
                    prompts=prompts,
                    order=order,
                    out_dir=out_dir,
                    record=record,
                )
    except ServerFailure as failure:
        report.state, report.verdict, report.reason = failure.state, Verdict(failure.state), str(failure)
        report.log_tail = failure.tail
    else:
        figures, verdicts = _verdicts(config, lives)
        report.figures, report.verdicts = figures, verdicts
        report.verdict = _overall(verdicts)
        report.state = report.verdict.state
        report.reason = _reason(config, figures, verdicts)
        fields = {
            lv["accept_length_field"]
            for life in lives
            if life["server"] == "eagle3"
            for lv in life["levels"].values()
            if lv["accept_length_field"]
        }
        report.accept_length_field = " and ".join(sorted(fields)) if fields else None
    report.trials = lives
    report.seconds = time.monotonic() - start
    write_json_atomic(out_dir / "perf.json", {**report.to_json(), "config": _config_json(config)})
    if report.figures:
        write_json_atomic(out_dir / "benchmark.json", benchmark_json(config, lives))
    return report


def _config_json(config: PerfConfig) -> dict[str, Any]:
    data = dataclasses.asdict(config)
    data["prompts"] = str(config.prompts) if config.prompts else "compatlab/data/prompts.json"
    data["requests"] = {str(c): config.requests_at(c) for c in config.concurrency}
    return data


def _worst(states: set[str]) -> Verdict:
    """fail (an answer: too slow) over error (no answer) over inconclusive (noise) over pass."""
    for state in (Verdict.FAIL, Verdict.ERROR, Verdict.INCONCLUSIVE):
        if state in states or (state == Verdict.ERROR and Verdict.UNKNOWN in states):
            return state
    return Verdict.PASS


def _overall(verdicts: Mapping[str, Any]) -> Verdict:
    return _worst({v["verdict"] for v in verdicts.values()})


def _reason(config: PerfConfig, figures: Mapping[str, float], verdicts: Mapping[str, Any]) -> str:
    for want in (Verdict.FAIL, Verdict.UNKNOWN, Verdict.INCONCLUSIVE):
        for c in config.concurrency:
            for check in verdicts[str(c)]["checks"]:
                if check["verdict"] == want:
                    return _explain(c, check, figures, config.thresholds.max_spread)
    parts = [
        f"c{c}: {figures[f'eagle3_tok_s_c{c}']:.1f} vs {figures[f'baseline_tok_s_c{c}']:.1f} tok/s "
        f"({figures[f'speedup_c{c}']:.2f}x)"
        for c in config.concurrency
    ]
    return "EAGLE-3 beats the baseline: " + ", ".join(parts)


def _quartiles(data: list[float]) -> tuple[float, float]:
    """Q1 and Q3 computed the way pytest-benchmark's Stats does, so its tables match."""
    n = len(data)
    if n == 1:
        return data[0], data[0]
    if n % 2:
        k, q = n // 4, n % 4
        if q == 1:
            return 0.25 * data[k - 1] + 0.75 * data[k], 0.75 * data[3 * k] + 0.25 * data[3 * k + 1]
        return 0.75 * data[k] + 0.25 * data[k + 1], 0.25 * data[3 * k + 1] + 0.75 * data[3 * k + 2]
    return statistics.median(data[: n // 2]), statistics.median(data[n // 2 :])


def _stats(data: list[float]) -> dict[str, Any]:
    s = sorted(data)
    mean = statistics.mean(s)
    stddev = statistics.stdev(s) if len(s) > 1 else 0.0
    q1, q3 = _quartiles(s)
    iqr = q3 - q1
    lo_fence, hi_fence = q1 - 1.5 * iqr, q3 + 1.5 * iqr
    inside = [x for x in s if lo_fence <= x <= hi_fence] or s
    std_out = sum(1 for x in s if x < mean - stddev or x > mean + stddev)
    iqr_out = sum(1 for x in s if x < lo_fence or x > hi_fence)
    total = sum(s)
    return {
        "min": s[0],
        "max": s[-1],
        "mean": mean,
        "stddev": stddev,
        "rounds": len(s),
        "median": statistics.median(s),
        "iqr": iqr,
        "q1": q1,
        "q3": q3,
        "iqr_outliers": iqr_out,
        "stddev_outliers": std_out,
        "outliers": f"{std_out};{iqr_out}",
        "ld15iqr": inside[0],
        "hd15iqr": inside[-1],
        "ops": len(s) / total if total else 0,
        "total": total,
        "data": data,
        "iterations": 1,
    }


_WHAT = {
    "ttft": "time to first token",
    "itl": "inter-token latency, pooled per token",
    "tpot": "time per output token after the first, per request",
}
_METRICS = (
    # key in a level record, benchmark suffix, scale to seconds, what it is
    ("s_per_token", "s_per_token", 1.0, "seconds per output token = 1 / (output tok/s of all streams)"),
    *(
        (
            key,
            key.removesuffix("_ms"),
            0.001,
            f"{key.split('_')[0]} {_WHAT[key.split('_')[1]]}, seconds (SGLang's {key})",
        )
        for key in LATENCY
    ),
)


def benchmark_json(config: PerfConfig, lives: list[dict[str, Any]]) -> dict[str, Any]:
    """pytest-benchmark's saved-run format: one benchmark per server, level and metric, one round per trial.

    Throughput is stored as seconds per output token, so that pytest-benchmark's "higher is worse"
    (``compare --fail=median:5%``) flags a slowdown; ``ops`` is then tokens per second.
    """
    benchmarks = []
    for c in config.concurrency:
        for name in SERVERS:
            levels = [life["levels"][str(c)] for life in lives if life["server"] == name]
            for key, suffix, scale, what in _METRICS:
                data = [lv[key] * scale for lv in levels if lv[key] is not None]
                if not data:
                    continue
                benchmarks.append(
                    {
                        "group": f"perf c{c} {suffix}",
                        "name": f"perf_{suffix}[{name}-c{c}]",
                        "fullname": f"compatlab.perf::perf_{suffix}[{name}-c{c}]",
                        "params": {"server": name, "concurrency": c},
                        "param": f"{name}-c{c}",
                        "extra_info": {"unit": what, "protocol": config.protocol, "output_len": config.output_len},
                        "options": {
                            "disable_gc": False,
                            "timer": "perf_counter",
                            "min_rounds": config.trials,
                            "max_time": 0,
                            "min_time": 0,
                            "warmup": config.warmup > 0,
                        },
                        "stats": _stats(data),
                    }
                )
    uname = platform.uname()
    return {
        "machine_info": {
            "node": uname.node,
            "processor": uname.processor,
            "machine": uname.machine,
            "python_compiler": platform.python_compiler(),
            "python_implementation": platform.python_implementation(),
            "python_implementation_version": platform.python_version(),
            "python_version": platform.python_version(),
            "python_build": list(platform.python_build()),
            "release": uname.release,
            "system": uname.system,
            "cpu": {},
        },
        "commit_info": {
            "id": None,
            "time": None,
            "author_time": None,
            "dirty": None,
            "project": "compatlab",
            "branch": None,
        },
        "benchmarks": benchmarks,
        "datetime": datetime.now(UTC).isoformat(),
        "version": "5.0.0",
    }


def run_perf_stage(ctx: CellContext) -> StageResult:
    """The cell's ``perf`` stage: skipped with a reason when the matrix or the environment cannot run it."""
    start = time.monotonic()
    config = ctx.matrix.perf
    if config is None:
        return StageResult(name="perf", state=StageState.SKIP, reason="skipped: matrix.toml has no [perf] section")
    env = bytecode_env(ctx, cell_env(ctx.venv))  # its servers' bytecode compiled once (bytecode.py)
    try:
        report = run_perf(config, ctx.work_dir / "perf", env=env)
    except ConfigError as exc:
        # A missing ${VAR}: this machine has no model to serve, so the stage cannot run here.
        return StageResult(
            name="perf",
            state=StageState.SKIP,
            reason=f"skipped: {'; '.join(exc.problems)}",
            seconds=time.monotonic() - start,
        )
    except ProgramNotFound as exc:
        return StageResult(
            name="perf", state=StageState.SKIP, reason=f"skipped: {exc}", seconds=time.monotonic() - start
        )
    return report.stage_result()


EXIT_CODES = {Verdict.PASS: 0, Verdict.FAIL: 1, Verdict.ERROR: 3, Verdict.INCONCLUSIVE: 4}
