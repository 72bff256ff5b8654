"""The EAGLE-3 perf suite against real stand-in servers on 127.0.0.1 (fixtures.standin_server)."""

from __future__ import annotations

import http.client
import itertools
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from compatlab.cells import expand
from compatlab.cli import main
from compatlab.config.matrix import parse_matrix
from compatlab.errors import ConfigError
from compatlab.runs.model import StageState
from compatlab.stages.base import CellContext
from compatlab.stages.perf.stage import (
    FIELD_META,
    FIELD_SERVER,
    PerfConfig,
    ServerProcess,
    group_members,
    load_prompts,
    parse_perf,
    port_is_free,
    resolve_argv,
    run_perf,
    run_perf_stage,
)
from compatlab.stages.sglang.client import Target, run_level
from compatlab.stages.sglang.server import POLL_SAYS

SRC = str(Path(__file__).resolve().parents[3])  # tests/, where fixtures lives
# Runs the stand-in without relying on PYTHONPATH (a cell's environment drops it).
STANDIN = [
    sys.executable,
    "-c",
    f"import sys; sys.path.insert(0, {SRC!r}); from fixtures.standin_server import main; sys.exit(main())",
    "--port",
    "{port}",
]
FAST = ["--ttft-ms", "1"]
STARTED: list[int] = []  # every server pid of this module, checked at the end


def _group_alive(pgid: int) -> list[int]:
    """Pids of live (not zombie) processes in process group *pgid*."""
    alive = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        state, pgrp = fields[0], int(fields[2])
        if pgrp == pgid and state not in ("Z", "X"):
            alive.append(int(entry.name))
    return alive


def _assert_gone(pids: list[int]) -> None:
    STARTED.extend(pids)
    assert pids
    for pid in pids:
        assert _group_alive(pid) == [], f"process group {pid} outlived its server"


@pytest.fixture(scope="module", autouse=True)
def _no_server_outlives_the_suite() -> Iterator[None]:
    yield
    leftovers = {pid: _group_alive(pid) for pid in STARTED}
    assert {pid: alive for pid, alive in leftovers.items() if alive} == {}


def _config(
    tmp_path: Path,
    baseline: list[str],
    eagle3: list[str],
    *,
    perf: dict[str, Any] | None = None,
    thresholds: dict[str, Any] | None = None,
    server: dict[str, Any] | None = None,
) -> PerfConfig:
    raw: dict[str, Any] = {
        "servers": {
            "baseline": {
                "argv": [*STANDIN, *FAST, *baseline],
                "startup-timeout": 20,
                "stop-timeout": 5,
                **(server or {}),
            },
            "eagle3": {"argv": [*STANDIN, *FAST, *eagle3], "startup-timeout": 20, "stop-timeout": 5, **(server or {})},
        },
        "concurrency": [1, 4],
        "trials": 2,
        "output-len": 32,
        "warmup": 1,
        "requests": 4,
        "request-timeout": 20,
        "stall-timeout": 5,
    }
    raw.update(perf or {})
    config = parse_perf(raw, {"perf": thresholds or {}}, "matrix.toml", base_dir=tmp_path)
    assert config is not None
    return config


# -- configuration --------------------------------------------------------------------------------------

README_EXAMPLE = """
[perf]
protocol = "generate"        # or "openai" (/v1/completions)
concurrency = [1, 16]
trials = 3                   # per server, interleaved baseline/EAGLE-3 in ABBA order
output-len = 256             # fixed output length (ignore_eos), temperature 0
warmup = 2                   # requests after health, before measuring
seed = 0                     # orders the prompt set
request-timeout = 600
stall-timeout = 60

[perf.servers.baseline]
argv = ["python", "-m", "sglang.launch_server", "--model-path", "${TARGET_MODEL}", "--tp", "8",
        "--port", "{port}"]
startup-timeout = 1200
env = { CUDA_VISIBLE_DEVICES = "0,1,2,3,4,5,6,7" }

[perf.servers.eagle3]
argv = ["python", "-m", "sglang.launch_server", "--model-path", "${TARGET_MODEL}", "--tp", "8",
        "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "${DRAFT_MODEL}",
        "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
        "--speculative-num-draft-tokens", "4", "--port", "{port}"]
startup-timeout = 1200

[thresholds.perf]
min-speedup = 1.0                        # EAGLE-3 must not be slower than the baseline
min-tok-s = { "1" = 80.0, "16" = 600.0 } # EAGLE-3 floors per concurrency level (or one number)
min-accept-length = 2.0
max-spread = 0.10                        # wider trial spread straddling a floor: inconclusive
"""


def test_readme_example_parses() -> None:
    data = tomllib.loads(README_EXAMPLE)
    config = parse_perf(data["perf"], data["thresholds"])
    assert config is not None
    assert config.concurrency == (1, 16)
    assert config.servers["eagle3"].argv[-1] == "{port}"
    assert config.servers["baseline"].env == {"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}
    assert config.thresholds.min_tok_s == {1: 80.0, 16: 600.0}
    assert config.thresholds.min_speedup == {1: 1.0, 16: 1.0}
    assert config.requests_at(1) == 8
    assert config.requests_at(16) == 64  # four waves
    resolved = resolve_argv(config, {"TARGET_MODEL": "/models/target", "DRAFT_MODEL": "/models/draft"})
    argv, extra = resolved["eagle3"]
    assert argv[4] == "/models/target"
    assert argv[10] == "/models/draft"
    assert extra == {}
    assert resolved["baseline"][1] == {"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}


def test_no_perf_section_is_none() -> None:
    assert parse_perf({}, {}) is None


def test_config_errors_are_listed_whole() -> None:
    perf = {
        "servers": {
            "baseline": {"argv": "python -m sglang.launch_server", "startup-timout": 10},  # spellchecker:disable-line
            "eagle3": {
                "argv": ["python", 42, "--port", "{port}", "${DRAFT-MODEL}"],
                "port": 0,
                "health": "/ready",
                "env": {"HF_HOME": 1},
            },
            "eagle": {"argv": ["x"]},
        },
        "protocol": "grpc",
        "concurrency": [1, 1, True],
        "trials": 0,
        "output-len": 1.5,
        "warmpu": 2,
    }
    thresholds = {"perf": {"min-speedup": True, "min-tok-s": {"4": 10.0}, "max-sprad": 0.1}}
    with pytest.raises(ConfigError) as info:
        parse_perf(perf, thresholds)
    assert (
        str(info.value)
        == "\n".join(
            [
                "17 problems in matrix.toml:",
                "  matrix.toml: perf.warmpu: unknown key; perhaps you meant 'warmup'?",
                "  matrix.toml: perf.servers.baseline.startup-timout: unknown key; perhaps you meant 'startup-timeout'?",  # spellchecker:disable-line
                "  matrix.toml: perf.servers.baseline.argv: expected an array of strings (never a shell string), "
                "got 'python -m sglang.launch_server'",
                "  matrix.toml: perf.servers.eagle3.argv[1]: expected a string, got 42",
                "  matrix.toml: perf.servers.eagle3.argv[4]: '${DRAFT-MODEL}' is not a variable reference; "
                "write ${NAME} with a name of letters, digits and '_'",
                "  matrix.toml: perf.servers.eagle3.port: expected a port number 1-65535, got 0",
                "  matrix.toml: perf.servers.eagle3.env.HF_HOME: expected a string, got 1",
                "  matrix.toml: perf.servers.eagle3.health: expected one of '/health_generate', '/health', got '/ready'",
                "  matrix.toml: perf.servers.eagle: unknown server; the suite compares baseline and eagle3; "
                "perhaps you meant 'eagle3'?",
                '  matrix.toml: perf.protocol: expected "generate" or "openai", got \'grpc\'',
                "  matrix.toml: perf.concurrency[1]: 1 is listed twice",
                "  matrix.toml: perf.concurrency[2]: expected a positive integer, got true",
                "  matrix.toml: perf.trials: expected a positive integer, got 0",
                "  matrix.toml: perf.output-len: expected a positive integer, got 1.5",
                "  matrix.toml: thresholds.perf.max-sprad: unknown key; perhaps you meant 'max-spread'?",
                "  matrix.toml: thresholds.perf.min-speedup: expected a positive number, got true",
                "  matrix.toml: thresholds.perf.min-tok-s.4: '4' is not a concurrency level of [perf] (1)",
            ]
        )
    )


def test_missing_servers_and_port_placeholder() -> None:
    with pytest.raises(ConfigError) as info:
        parse_perf({"servers": {"baseline": {"argv": ["python", "-m", "sglang.launch_server"]}}}, {})
    assert str(info.value) == (
        "2 problems in matrix.toml:\n"
        "  matrix.toml: perf.servers.baseline.argv: has no '{port}' and no port is set; "
        'add "--port", "{port}" or set port\n'
        "  matrix.toml: perf.servers.eagle3: missing; the suite needs [perf.servers.eagle3]"
    )


def test_missing_environment_variable_is_named() -> None:
    data = tomllib.loads(README_EXAMPLE)
    config = parse_perf(data["perf"], data["thresholds"])
    assert config is not None
    with pytest.raises(ConfigError) as info:
        resolve_argv(config, {"TARGET_MODEL": "/models/target"})
    assert str(info.value) == (
        "matrix.toml: perf.servers.eagle3.argv[10]: environment variable DRAFT_MODEL is not set; "
        "export DRAFT_MODEL=... (e.g. the model's path) before running the perf suite"
    )


def test_shipped_prompts() -> None:
    prompts = load_prompts()
    assert 30 <= len(prompts) <= 60
    assert len(set(prompts)) == len(prompts)


# -- runs against stand-in servers ----------------------------------------------------------------------


def test_pass_eagle3_faster(tmp_path: Path) -> None:
    # Rates low enough that the stand-ins sleep more than they compute: a busy box does not blur them.
    config = _config(
        tmp_path,
        ["--tok-s", "400"],
        ["--tok-s", "1200", "--accept-length", "3"],
        thresholds={"min-speedup": 1.2, "min-accept-length": 2.0, "min-tok-s": 500},
    )
    report = run_perf(config, tmp_path / "out")
    _assert_gone(report.pids)
    assert (report.state, report.verdict) == ("pass", "pass"), report.reason
    assert re.fullmatch(
        r"EAGLE-3 beats the baseline: c1: [\d.]+ vs [\d.]+ tok/s \([\d.]+x\), "
        r"c4: [\d.]+ vs [\d.]+ tok/s \([\d.]+x\)",
        report.reason,
    )
    f = report.figures
    assert f["speedup_c1"] > 1.5
    assert f["speedup_c4"] > 1.5
    assert 2.5 < f["accept_length_c1"] <= 3.0
    assert f["baseline_median_ttft_ms_c1"] > 0
    assert f["eagle3_median_itl_ms_c4"] > 0
    assert report.accept_length_field == FIELD_META
    assert [(t["server"], t["trial"]) for t in report.trials] == [
        ("baseline", 1),
        ("eagle3", 1),
        ("eagle3", 2),
        ("baseline", 2),
    ]  # ABBA
    stage = report.stage_result()
    assert stage.name == "perf"
    assert stage.state == StageState.PASS
    assert all(isinstance(v, float) for v in stage.details["figures"].values())
    assert "listening on" in stage.details["logs"]["eagle3-trial2"]
    assert stage.details["trials"][0]["levels"]["1"]["tokens"] == 4 * 32
    json.dumps(stage.to_json())
    saved = json.loads((tmp_path / "out" / "perf.json").read_text())
    assert saved["schema"] == "compatlab.perf/1"
    assert len(saved["trials"][0]["levels"]["4"]["per_request"]) == 4


def test_fail_speculation_slower_than_baseline(tmp_path: Path) -> None:
    # The field's story at 10x speed: EAGLE-3 at 54 tok/s against a 90 tok/s baseline.
    config = _config(
        tmp_path, ["--tok-s", "900"], ["--tok-s", "540", "--accept-length", "1.4"], perf={"concurrency": [1]}
    )
    report = run_perf(config, tmp_path / "out")
    _assert_gone(report.pids)
    assert (report.state, report.verdict) == ("fail", "fail")
    assert re.fullmatch(
        r"EAGLE-3 is slower than the baseline at concurrency 1: [\d.]+ vs [\d.]+ tok/s "
        r"\(speedup 0\.\d\d, min-speedup 1\)",
        report.reason,
    ), report.reason
    assert 0.5 < report.figures["speedup_c1"] < 0.7


def test_inconclusive_when_noisy(tmp_path: Path) -> None:
    seeds = tmp_path / "seed"  # each start draws the next seed: deterministic noise of +-50 %
    noisy = ["--jitter", "0.5", "--seed-file", str(seeds)]
    config = _config(
        tmp_path,
        ["--tok-s", "1000", *noisy],
        ["--tok-s", "1050", "--accept-length", "2", *noisy],
        perf={"concurrency": [1], "trials": 3},
    )
    report = run_perf(config, tmp_path / "out")
    _assert_gone(report.pids)
    assert (report.state, report.verdict) == ("error", "inconclusive")
    assert re.fullmatch(
        r"inconclusive at concurrency 1: the trials spread more than max-spread 10% and their "
        r"range \(0\.\d\d-[12]\.\d\d\) straddles min-speedup 1; rerun on a quiet box",
        report.reason,
    ), report.reason
    assert report.stage_result().details["rerun"] is True


def test_server_never_healthy(tmp_path: Path) -> None:
    config = _config(tmp_path, ["--startup-delay", "30"], ["--accept-length", "3"], server={"startup-timeout": 1})
    report = run_perf(config, tmp_path / "out")
    _assert_gone(report.pids)
    port = report.trials[0]["port"]
    assert report.state == StageState.ERROR
    assert report.reason == (f"baseline server did not become healthy within 1 s (/health_generate on port {port})")
    assert "loading for 30 s" in report.log_tail
    stage = report.stage_result()
    assert stage.details["log_tail"] == report.log_tail
    assert len(report.trials) == 1  # the run stops at the first broken server


def test_server_crashes_at_startup(tmp_path: Path) -> None:
    broken = [
        sys.executable,
        "-c",
        "import sys; print('ImportError: undefined symbol: "
        "_ZN3c104cuda29c10_cuda_check_implementationEiPKcS2_ib', flush=True); sys.exit(1)",
        "{port}",
    ]
    config = parse_perf({"servers": {"baseline": {"argv": broken}, "eagle3": {"argv": broken}}}, {})
    assert config is not None
    report = run_perf(config, tmp_path / "out")
    _assert_gone(report.pids)
    assert (report.state, report.reason) == ("fail", "baseline server exited with exit code 1 before it became healthy")
    assert report.log_tail.endswith("undefined symbol: _ZN3c104cuda29c10_cuda_check_implementationEiPKcS2_ib")


def test_server_dies_mid_run(tmp_path: Path) -> None:
    # Warm-up (1) and concurrency 1 (4 requests) pass; it dies in the first request at concurrency 4.
    config = _config(tmp_path, ["--tok-s", "2000"], ["--tok-s", "3000", "--accept-length", "3", "--crash-after", "5"])
    report = run_perf(config, tmp_path / "out")
    _assert_gone(report.pids)
    assert report.state == StageState.FAIL
    assert re.fullmatch(
        # What the client sees of a server that dies mid-stream depends on timing: the stream cut short, or
        # the connection reset under it. Both are real, and both name the exit.
        r"eagle3 server exited with exit code 3 at concurrency 4 \((stream ended before \[DONE\] after \d+ "
        r"tokens|ConnectionResetError: \[Errno 104\] Connection reset by peer); 0 of 4 requests finished\)",
        report.reason,
    ), report.reason
    assert re.search(r"crashing in request [6-9] as told", report.log_tail)
    assert report.trials[-1]["exit"] == 3


def test_server_stalls_mid_stream(tmp_path: Path) -> None:
    config = _config(
        tmp_path,
        ["--tok-s", "2000", "--stall-after", "1"],
        ["--accept-length", "3"],
        perf={"stall-timeout": 0.5, "concurrency": [1]},
    )
    report = run_perf(config, tmp_path / "out")
    _assert_gone(report.pids)
    assert report.state == StageState.ERROR
    assert report.reason == (
        "baseline server failed a request at concurrency 1: no data for 0.5 s (stalled) after 16 tokens"
    )


def test_openai_protocol(tmp_path: Path) -> None:
    config = _config(
        tmp_path,
        ["--tok-s", "500"],
        ["--tok-s", "1500", "--accept-length", "3"],
        perf={"protocol": "openai", "concurrency": [2], "trials": 1},
    )
    report = run_perf(config, tmp_path / "out")
    _assert_gone(report.pids)
    assert report.state == StageState.PASS, report.reason
    assert report.accept_length_field == FIELD_SERVER
    assert 2.5 < report.figures["accept_length_c2"] <= 3.0
    assert report.trials[0]["levels"]["2"]["tokens"] == 4 * 32


def test_stop_kills_the_whole_group(tmp_path: Path) -> None:
    # The leader ignores SIGTERM and has a child that ignores it too: SIGKILL takes the whole group.
    stubborn = ["--ignore-sigterm", "--spawn-child"]
    config = _config(
        tmp_path,
        ["--tok-s", "3000", *stubborn],
        ["--tok-s", "3000", "--accept-length", "2", *stubborn],
        perf={"trials": 1, "concurrency": [1]},
        server={"stop-timeout": 0.3},
    )
    report = run_perf(config, tmp_path / "out")
    _assert_gone(report.pids)
    assert report.state in (StageState.PASS, StageState.FAIL)
    logs = [Path(t["log"]).read_text(encoding="utf-8") for t in report.trials]  # whole: decode lines fill tails
    children = [int(m) for log in logs for m in re.findall(r"child pid (\d+)", log)]
    assert len(children) == 2
    assert report.trials[0]["exit"] == -9


def test_benchmark_json_works_with_pytest_benchmark_compare(tmp_path: Path) -> None:
    config = _config(
        tmp_path,
        ["--tok-s", "2000"],
        ["--tok-s", "2000", "--accept-length", "2"],
        perf={"trials": 1, "concurrency": [1]},
    )
    report = run_perf(config, tmp_path / "run1")
    _assert_gone(report.pids)
    first = json.loads((tmp_path / "run1" / "benchmark.json").read_text())
    names = [b["name"] for b in first["benchmarks"]]
    latency = [f"{stat}_{what}" for what in ("ttft", "itl", "tpot") for stat in ("mean", "median", "p99")]
    assert names == [
        f"perf_{metric}[{server}-c1]" for server in ("baseline", "eagle3") for metric in ("s_per_token", *latency)
    ]
    tok_s = report.figures["eagle3_tok_s_c1"]
    assert first["benchmarks"][10]["stats"]["ops"] == pytest.approx(tok_s)
    assert first["benchmarks"][5]["extra_info"]["unit"] == (
        "median inter-token latency, pooled per token, seconds (SGLang's median_itl_ms)"
    )
    # A second run 20 % slower: more seconds per token, which pytest-benchmark's "higher is worse" reads
    # as the regression it is (ops, its inverse, is the throughput).
    slower = json.loads(json.dumps(first))
    for bench in slower["benchmarks"]:
        bench["stats"]["median"] *= 1.2
    (tmp_path / "run2.json").write_text(json.dumps(slower))
    argv = [
        sys.executable,
        "-m",
        "pytest_benchmark",
        "compare",
        "--group-by=name",
        "--columns=median,ops",
        str(tmp_path / "run1" / "benchmark.json"),
        str(tmp_path / "run2.json"),
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "benchmark 'perf_s_per_token[eagle3-c1]': 2 tests" in done.stdout
    assert re.search(r"perf_s_per_token\[eagle3-c1\] \(0/run2\)\s+[\d.]+ \(1\.20\)", done.stdout), done.stdout


def test_client_counts_tokens_and_ttft(tmp_path: Path) -> None:
    config = _config(tmp_path, ["--tok-s", "0"], ["--accept-length", "4"])
    argv, _ = resolve_argv(config, os.environ)["baseline"]
    server = ServerProcess(config.servers["baseline"], [*argv, "--ttft-ms", "50"], dict(os.environ), tmp_path / "s.log")
    with server:
        server.wait_ready()
        level = run_level(Target(port=server.port), ["a b c"], concurrency=3, requests=6, output_len=100)
    _assert_gone([server.pid])
    assert level.errors == []
    assert level.tokens == 600
    assert all(r.events == 100 and r.ttft >= 0.05 for r in level.requests)
    assert level.accept_length is None


# -- what a real SGLang server does that the stand-in now does too ----------------------------------------

ERROR = "CUDA error: out of memory (stand-in --error-after)"
ABORT = "Request aborted by the scheduler (stand-in --abort-after)"


@pytest.mark.parametrize(
    ("protocol", "flag", "told"),
    [
        ("generate", "--error-after", f"the server sent an error in the stream after 15 tokens: {ERROR}"),
        ("openai", "--error-after", f"the server sent an error in the stream after 15 tokens: {ERROR}"),
        ("generate", "--abort-after", f"the server aborted the request after 15 tokens: {ABORT}"),
        ("openai", "--abort-after", "the server aborted the request after 15 tokens (finish_reason abort)"),
    ],
)
def test_an_error_or_abort_inside_a_200_stream_is_an_error_never_a_pass(
    tmp_path: Path, protocol: str, flag: str, told: str
) -> None:
    # SGLang answers 200, then sends data: {"error": ...} (or a final chunk whose finish_reason is an
    # abort), then data: [DONE]. A server that fails every request this way must not pass the stage.
    failing = ["--tok-s", "3000", flag, "0"]
    config = _config(
        tmp_path,
        failing,
        [*failing, "--accept-length", "3"],
        perf={"protocol": protocol},
        thresholds={"min-speedup": 0.1},
    )
    report = run_perf(config, tmp_path / "out")
    _assert_gone(report.pids)
    assert (report.state, report.verdict) == ("error", "error")
    assert report.reason == f"baseline server failed a request during warm-up: {told}"
    assert report.figures == {}
    assert not (tmp_path / "out" / "benchmark.json").exists()


def test_a_failed_request_mid_run_names_the_servers_message(tmp_path: Path) -> None:
    # Warm-up (1) and concurrency 1 (4 requests) pass; from the sixth request on the stream errs.
    config = _config(
        tmp_path,
        ["--tok-s", "3000"],
        ["--tok-s", "3000", "--accept-length", "3", "--error-after", "5", "--fault-message", "KV cache pool is full"],
    )
    report = run_perf(config, tmp_path / "out")
    _assert_gone(report.pids)
    assert report.state == StageState.ERROR
    assert report.reason == (
        "eagle3 server failed a request at concurrency 4: the server sent an error in the "
        "stream after 13 tokens: KV cache pool is full"
    )


PROMPT_ROW, TOKENS_ROW, FIRST_TOKENS_ROW, VERIFY_ROW = 0, 1, 5, 6  # columns of a level's per_request rows


def test_itl_is_pooled_per_token_as_sglangs_benchmark_does(tmp_path: Path) -> None:
    # EAGLE-3 verify steps of 1-4 tokens: each chunk's gap counts once per token it added, pooled over all
    # requests (SGLang's median ITL), not a median of per-request means.
    config = _config(tmp_path, ["--tok-s", "0"], ["--tok-s", "4000", "--accept-length", "1-4", "--seed", "7"])
    argv, _ = resolve_argv(config, os.environ)["eagle3"]
    server = ServerProcess(config.servers["eagle3"], argv, dict(os.environ), tmp_path / "s.log")
    with server:
        server.wait_ready()
        level = run_level(Target(port=server.port), ["a b c"], concurrency=2, requests=4, output_len=64)
    _assert_gone([server.pid])
    assert level.errors == []
    pooled = [gap for r in level.requests for gap in r.itl]
    assert level.itls == pooled
    for r in level.requests:
        assert r.tokens == 64
        assert r.first_tokens == 1  # the first chunk is the prefill's one token
        assert len(r.itl) == r.tokens - 1  # one entry per token after the first
        assert r.tpot == (r.latency - r.ttft) / (r.tokens - 1)
        assert r.spec_verify_ct is not None
        assert 63 / 4 <= r.spec_verify_ct <= 63
    stats = level.latency_stats()
    assert stats["mean_itl_ms"] == statistics.fmean(pooled) * 1000
    assert stats["median_itl_ms"] == statistics.median(pooled) * 1000
    assert stats["p99_itl_ms"] == pytest.approx(statistics.quantiles(pooled, n=100, method="inclusive")[98] * 1000)
    assert stats["median_tpot_ms"] == statistics.median(r.tpot or 0.0 for r in level.requests) * 1000
    assert stats["median_ttft_ms"] == statistics.median(r.ttft for r in level.requests) * 1000
    assert level.accept_length == 4 * 64 / sum(r.spec_verify_ct or 0 for r in level.requests)


def test_level_records_carry_sglangs_names(tmp_path: Path) -> None:
    config = _config(
        tmp_path,
        ["--tok-s", "3000"],
        ["--tok-s", "3000", "--accept-length", "3"],
        perf={"trials": 1, "concurrency": [2]},
        thresholds={"min-speedup": 0.1},
    )
    report = run_perf(config, tmp_path / "out")
    _assert_gone(report.pids)
    assert report.state == StageState.PASS, report.reason
    latency = {f"{stat}_{what}_ms" for what in ("ttft", "itl", "tpot") for stat in ("mean", "median", "p99")}
    level = report.trials[0]["levels"]["2"]
    assert latency <= set(level)
    assert {f"{server}_{key}_c2" for server in ("baseline", "eagle3") for key in latency} <= set(report.figures)
    assert {row[FIRST_TOKENS_ROW] for row in level["per_request"]} == {1}


def test_the_servers_accept_length_covers_one_level_after_a_flush(tmp_path: Path) -> None:
    # avg_spec_accept_length is lifetime and decode-only: /flush_cache before each level makes it that
    # level's own figure, which the per-request counts reproduce exactly (the stand-in logs every step).
    eagle = ["--tok-s", "3000", "--accept-length", "1-4", "--seed", "3", "--log-interval", "1"]
    config = _config(
        tmp_path, ["--tok-s", "3000"], eagle, perf={"trials": 1, "warmup": 2}, thresholds={"min-speedup": 0.1}
    )
    report = run_perf(config, tmp_path / "out")
    _assert_gone(report.pids)
    assert report.state == StageState.PASS, report.reason
    eagle3 = next(t for t in report.trials if t["server"] == "eagle3")
    for c in ("1", "4"):
        level = eagle3["levels"][c]
        rows = level["per_request"]
        own = sum(row[TOKENS_ROW] - 1 for row in rows) / sum(row[VERIFY_ROW] for row in rows)
        assert level["server_accept_length"] == own
    # After warm-up (before c1) and before c4; in the whole log: SGLang's decode lines fill the tail.
    assert Path(eagle3["log"]).read_text(encoding="utf-8").count("cache flushed") == 2


def test_an_accept_length_not_logged_yet_is_unknown_not_a_fail(tmp_path: Path) -> None:
    # The OpenAI protocol has no per-request verify counts; early on SGLang has not logged the key.
    config = _config(
        tmp_path,
        ["--tok-s", "3000"],
        ["--tok-s", "3000", "--accept-length", "3", "--log-interval", "100000"],
        perf={"protocol": "openai", "trials": 1, "concurrency": [1]},
        thresholds={"min-accept-length": 2.0, "min-speedup": 0.1},
    )
    report = run_perf(config, tmp_path / "out")
    _assert_gone(report.pids)
    assert (report.state, report.verdict) == ("error", "error")
    assert report.reason == (
        "EAGLE-3 accept length at concurrency 1 is unknown: the streams carry no meta_info.spec_verify_ct and "
        "the eagle3 server's avg_spec_accept_length is not logged yet (/server_info; SGLang logs it every 40 "
        'decode batches): use protocol "generate" or more requests'
    )
    eagle3 = next(t for t in report.trials if t["server"] == "eagle3")
    assert eagle3["levels"]["1"]["server_accept_length_note"] == "not logged yet"


@pytest.mark.parametrize(
    ("baseline", "eagle3", "reason"),
    [
        (
            [],
            ["--accept-length", "3", "--speculative-algorithm", "none"],
            "the eagle3 server does not run EAGLE3: /server_info reports speculative_algorithm null; add "
            '"--speculative-algorithm", "EAGLE3" to perf.servers.eagle3.argv',
        ),
        (
            ["--speculative-algorithm", "EAGLE3"],
            ["--accept-length", "3"],
            'the baseline server speculates: /server_info reports speculative_algorithm "EAGLE3"; drop '
            "--speculative-algorithm from perf.servers.baseline.argv",
        ),
    ],
)
def test_server_info_must_show_eagle3_on_and_the_baseline_off(
    tmp_path: Path, baseline: list[str], eagle3: list[str], reason: str
) -> None:
    config = _config(
        tmp_path, ["--tok-s", "3000", *baseline], ["--tok-s", "3000", *eagle3], perf={"trials": 1, "concurrency": [1]}
    )
    report = run_perf(config, tmp_path / "out")
    _assert_gone(report.pids)
    assert (report.state, report.reason) == ("error", reason)


@pytest.mark.parametrize("routes", ["both", "none", "only"])
def test_current_route_names_first_the_deprecated_ones_as_fallbacks(tmp_path: Path, routes: str) -> None:
    # "none": a newer SGLang without /get_model_info and /get_server_info; "only": an older one.
    flags = ["--legacy-routes", routes, "--tok-s", "3000"]
    config = _config(
        tmp_path,
        flags,
        [*flags, "--accept-length", "3"],
        perf={"trials": 1, "concurrency": [1], "protocol": "openai"},
        thresholds={"min-speedup": 0.1},
    )
    report = run_perf(config, tmp_path / "out")
    _assert_gone(report.pids)
    assert report.state == StageState.PASS, report.reason
    assert report.accept_length_field == "server_info.internal_states[0].avg_spec_accept_length"
    assert [t["speculative_algorithm"] for t in report.trials] == [None, "EAGLE3"]
    for trial in report.trials:
        assert "is deprecated" not in trial["log_tail"]


def test_openai_requests_name_the_model_of_v1_models(tmp_path: Path) -> None:
    flags = ["--tok-s", "3000", "--model", "/models/target", "--served-model-name", "target-served"]
    config = _config(
        tmp_path, flags, [*flags, "--accept-length", "3"], perf={"trials": 1, "concurrency": [1], "protocol": "openai"}
    )
    report = run_perf(config, tmp_path / "out")
    _assert_gone(report.pids)
    assert [(t["model"], t["served_model"]) for t in report.trials] == [("/models/target", "target-served")] * 2


def test_stop_waits_until_the_port_is_free(tmp_path: Path) -> None:
    # A process outside the group keeps the listening socket for 1.5 s: the next server could not bind.
    config = _config(tmp_path, ["--port-holder", "1.5"], [], server={"release-timeout": 30})
    argv, _ = resolve_argv(config, os.environ)["baseline"]
    server = ServerProcess(config.servers["baseline"], argv, dict(os.environ), tmp_path / "s.log")
    with server:
        server.wait_ready()
    _assert_gone([server.pid])
    assert group_members(server.pid) == []
    assert port_is_free(server.port)
    assert server.leftover is None


def test_a_port_still_held_after_release_timeout_is_an_error(tmp_path: Path) -> None:
    config = _config(
        tmp_path,
        ["--tok-s", "3000", "--port-holder", "5"],
        ["--accept-length", "3"],
        perf={"trials": 1, "concurrency": [1]},
        server={"release-timeout": 0.3},
    )
    report = run_perf(config, tmp_path / "out")
    _assert_gone(report.pids)
    port = report.trials[0]["port"]
    assert (report.state, report.reason) == (
        "error",
        f"port {port} is still in use 0.3 s after the baseline server's process group exited",
    )


def test_health_is_503_during_sglangs_own_warm_up(tmp_path: Path) -> None:
    config = _config(tmp_path, ["--startup-delay", "0.2", "--warmup", "0.5", "--verbose"], [])
    argv, _ = resolve_argv(config, os.environ)["baseline"]
    server = ServerProcess(config.servers["baseline"], argv, dict(os.environ), tmp_path / "s.log")
    with server:
        info = server.wait_ready()
    _assert_gone([server.pid])
    assert info["model_path"] == "standin/model"
    log = server.tail(200)
    assert '"GET /health_generate HTTP/1.1" 503' in log
    assert log.index("503") < log.index('"GET /health_generate HTTP/1.1" 200')
    assert '"GET /model_info HTTP/1.1" 200' in log


def test_the_standin_streams_sglangs_wire_format(tmp_path: Path) -> None:
    config = _config(tmp_path, [], ["--tok-s", "0", "--accept-length", "1-4"])
    argv, _ = resolve_argv(config, os.environ)["eagle3"]
    server = ServerProcess(config.servers["eagle3"], argv, dict(os.environ), tmp_path / "s.log")
    with server:
        server.wait_ready()
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        body = {"text": "a b", "stream": True, "sampling_params": {"max_new_tokens": 20, "ignore_eos": True}}
        conn.request("POST", "/generate", json.dumps(body), {"Content-Type": "application/json"})
        lines = conn.getresponse().read().decode().split("\n\n")
        conn.close()
        backlog = None
        if shutil.which("ss"):
            listing = subprocess.run(
                ["ss", "-ltnH", f"sport = :{server.port}"], capture_output=True, text=True, timeout=10, check=True
            ).stdout.split()
            backlog = int(listing[2])  # Send-Q of a listening socket: its backlog
    _assert_gone([server.pid])
    assert lines[-2:] == ["data: [DONE]", ""]
    events = [json.loads(line.removeprefix("data: ")) for line in lines[:-2]]
    metas = [e["meta_info"] for e in events]
    assert metas[0]["completion_tokens"] == 1  # prefill: exactly one token
    assert all(1 <= b["completion_tokens"] - a["completion_tokens"] <= 4 for a, b in itertools.pairwise(metas))
    assert [len(e["output_ids"]) for e in events] == [m["completion_tokens"] for m in metas]
    assert ["spec_verify_ct" in m for m in metas] == [False] * (len(metas) - 1) + [True]  # final chunk only
    assert metas[-1]["finish_reason"] == {"type": "length", "length": 20}
    assert metas[-1]["spec_verify_ct"] == len(events) - 1
    if backlog is not None:
        assert backlog == min(2048, int(Path("/proc/sys/net/core/somaxconn").read_text()))


# -- the stage and the command line ---------------------------------------------------------------------

MATRIX = """
[axes]
torch = ["2.9.1"]
sgl-kernel = ["0.3.21"]
flashinfer = ["0.6.4"]
cuda = ["12.8"]
"""


def _matrix_text(argv: list[str], extra: str = "") -> str:
    servers = f"""
[perf]
concurrency = [1]
trials = 1
output-len = 32
warmup = 0
requests = 2

[perf.servers.baseline]
argv = {json.dumps([*argv, "--tok-s", "1000"])}

[perf.servers.eagle3]
argv = {json.dumps([*argv, "--tok-s", "3000", "--accept-length", "3"])}
"""
    return MATRIX + servers + extra


def _context(tmp_path: Path, text: str) -> CellContext:
    matrix = parse_matrix(tomllib.loads(text), str(tmp_path / "matrix.toml"))
    cell = expand(matrix)[0]
    venv = Path(sys.prefix)
    return CellContext(
        matrix=matrix, cell=cell, venv=venv, python=Path(sys.executable), site_packages=venv, work_dir=tmp_path / "cell"
    )


def test_stage_runs_in_the_cell(tmp_path: Path) -> None:
    stage = run_perf_stage(_context(tmp_path, _matrix_text(STANDIN)))
    assert stage.state == StageState.PASS, stage.reason
    assert set(stage.details["figures"]) >= {"baseline_tok_s_c1", "eagle3_tok_s_c1", "speedup_c1", "accept_length_c1"}
    assert (tmp_path / "cell" / "perf" / "benchmark.json").is_file()
    _assert_gone([t["pid"] for t in stage.details["trials"]])


def test_stage_skips_without_the_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TARGET_MODEL", raising=False)
    stage = run_perf_stage(_context(tmp_path, _matrix_text([*STANDIN, "--model", "${TARGET_MODEL}"])))
    assert (stage.state, stage.reason) == (
        "skip",
        (
            "skipped: perf.servers.baseline.argv[6]: environment variable TARGET_MODEL is not set; export "
            "TARGET_MODEL=... (e.g. the model's path) before running the perf suite; perf.servers.eagle3.argv[6]: "
            "environment variable TARGET_MODEL is not set; export TARGET_MODEL=... (e.g. the model's path) before "
            "running the perf suite"
        ),
    )


def test_stage_without_perf_section(tmp_path: Path) -> None:
    stage = run_perf_stage(_context(tmp_path, MATRIX))
    assert (stage.state, stage.reason) == ("skip", "skipped: matrix.toml has no [perf] section")


def test_main(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "matrix.toml"
    path.write_text(_matrix_text(STANDIN, "\n[thresholds.perf]\nmin-speedup = 1.2\n"))
    assert main(["perf", "--matrix", str(path), "--out", str(tmp_path / "out"), "--venv", sys.prefix]) == 0
    out = capsys.readouterr().out
    assert re.search(
        r"^c1: baseline [\d.]+ tok/s, eagle3 [\d.]+ tok/s, speedup [\d.]+, accept length [\d.]+: "
        r"pass$",
        out,
        re.M,
    ), out
    assert (tmp_path / "out" / "perf.json").is_file()
    path.write_text(_matrix_text(STANDIN, "\n[thresholds.perf]\nmin-speedup = 0\n"))
    assert main(["perf", "--matrix", str(path), "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err == (
        f"error: {path}: thresholds.perf.min-speedup: expected a positive number, got 0\n"
    )


def test_a_poll_the_start_up_deadline_cut_short_keeps_the_poll_before_it(tmp_path: Path) -> None:
    """A server that opens its port but drips every answer (a byte each 10 s): the first health poll has its
    whole 5 s and gets no answer; the last has what the 5.4 s start-up deadline leaves (~0.4 s). The reason
    tells the first, never the deadline's own cut ("within 0 s"). The first's own figure is less than 5 s where
    the server took its time to open the port (4.97 s on a loaded machine): what it was is not the point."""
    config = _config(tmp_path, ["--drip", "10"], ["--accept-length", "3"], server={"startup-timeout": 5.4})
    report = run_perf(config, tmp_path / "out")
    _assert_gone(report.pids)
    port = report.trials[0]["port"]
    assert report.state == StageState.ERROR
    said = re.fullmatch(
        re.escape(
            f"baseline server did not become healthy within 5.4 s (/health_generate on port {port}); the last poll: "
            f"http://127.0.0.1:{port}/health_generate: no complete answer within "
        )
        + r"(\d+(?:\.\d+)?) s",
        report.reason,
    )
    assert said, report.reason
    assert POLL_SAYS <= float(said.group(1)) <= 5.0
