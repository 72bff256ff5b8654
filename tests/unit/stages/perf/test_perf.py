"""The EAGLE-3 perf suite against real stand-in servers on 127.0.0.1 (fixtures.standin_server)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from compatlab.cells import expand
from compatlab.config.matrix import parse_matrix
from compatlab.errors import ConfigError
from compatlab.stages.base import CellContext
from compatlab.stages.perf.client import Target, run_level
from compatlab.stages.perf.stage import (
    FIELD_META,
    FIELD_SERVER,
    PerfConfig,
    ServerProcess,
    load_prompts,
    main,
    parse_perf,
    resolve_argv,
    run_perf,
    run_perf_stage,
)

SRC = str(Path(__file__).resolve().parents[3])  # tests/, where fixtures lives
# Runs the stand-in without relying on PYTHONPATH (a cell's environment drops it).
STANDIN = [sys.executable, "-c",
           f"import sys; sys.path.insert(0, {SRC!r}); from fixtures.standin_server import main; sys.exit(main())",
           "--port", "{port}"]
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


def _config(tmp_path: Path, baseline: list[str], eagle3: list[str], *, perf: dict[str, Any] | None = None,
            thresholds: dict[str, Any] | None = None, server: dict[str, Any] | None = None) -> PerfConfig:
    raw: dict[str, Any] = {
        "servers": {
            "baseline": {"argv": [*STANDIN, *FAST, *baseline], "startup-timeout": 20, "stop-timeout": 5,
                         **(server or {})},
            "eagle3": {"argv": [*STANDIN, *FAST, *eagle3], "startup-timeout": 20, "stop-timeout": 5,
                       **(server or {})},
        },
        "concurrency": [1, 4], "trials": 2, "output-len": 32, "warmup": 1, "requests": 4,
        "request-timeout": 20, "stall-timeout": 5,
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
    assert config.requests_at(16) == 32
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
            "baseline": {"argv": "python -m sglang.launch_server", "startup-timout": 10},
            "eagle3": {"argv": ["python", 42, "--port", "{port}", "${DRAFT-MODEL}"], "port": 0,
                       "health": "/ready", "env": {"HF_HOME": 1}},
            "eagle": {"argv": ["x"]},
        },
        "protocol": "grpc", "concurrency": [1, 1, True], "trials": 0, "output-len": 1.5, "warmpu": 2,
    }
    thresholds = {"perf": {"min-speedup": True, "min-tok-s": {"4": 10.0}, "max-sprad": 0.1}}
    with pytest.raises(ConfigError) as info:
        parse_perf(perf, thresholds)
    assert str(info.value) == "\n".join([
        "17 problems in matrix.toml:",
        "  matrix.toml: perf.warmpu: unknown key; perhaps you meant 'warmup'?",
        "  matrix.toml: perf.servers.baseline.startup-timout: unknown key; perhaps you meant 'startup-timeout'?",
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
    ])


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
    config = _config(tmp_path, ["--tok-s", "400"], ["--tok-s", "1200", "--accept-length", "3"],
                     thresholds={"min-speedup": 1.2, "min-accept-length": 2.0, "min-tok-s": 500})
    report = run_perf(config, tmp_path / "out")
    _assert_gone(report.pids)
    assert (report.state, report.verdict) == ("pass", "pass"), report.reason
    assert re.fullmatch(r"EAGLE-3 beats the baseline: c1: [\d.]+ vs [\d.]+ tok/s \([\d.]+x\), "
                        r"c4: [\d.]+ vs [\d.]+ tok/s \([\d.]+x\)", report.reason)
    f = report.figures
    assert f["speedup_c1"] > 1.5
    assert f["speedup_c4"] > 1.5
    assert 2.5 < f["accept_length_c1"] <= 3.0
    assert f["baseline_ttft_ms_c1"] > 0
    assert f["eagle3_itl_ms_c4"] > 0
    assert report.accept_length_field == FIELD_META
    assert [(t["server"], t["trial"]) for t in report.trials] == [
        ("baseline", 1), ("eagle3", 1), ("eagle3", 2), ("baseline", 2)]  # ABBA
    stage = report.stage_result()
    assert stage.name == "perf"
    assert stage.state == "pass"
    assert all(isinstance(v, float) for v in stage.details["figures"].values())
    assert "listening on" in stage.details["logs"]["eagle3-trial2"]
    assert stage.details["trials"][0]["levels"]["1"]["tokens"] == 4 * 32
    json.dumps(stage.to_json())
    saved = json.loads((tmp_path / "out" / "perf.json").read_text())
    assert saved["schema"] == "compatlab.perf/1"
    assert len(saved["trials"][0]["levels"]["4"]["per_request"]) == 4


def test_fail_speculation_slower_than_baseline(tmp_path: Path) -> None:
    # The field's story at 10x speed: EAGLE-3 at 54 tok/s against a 90 tok/s baseline.
    config = _config(tmp_path, ["--tok-s", "900"], ["--tok-s", "540", "--accept-length", "1.4"],
                     perf={"concurrency": [1]})
    report = run_perf(config, tmp_path / "out")
    _assert_gone(report.pids)
    assert (report.state, report.verdict) == ("fail", "fail")
    assert re.fullmatch(r"EAGLE-3 is slower than the baseline at concurrency 1: [\d.]+ vs [\d.]+ tok/s "
                        r"\(speedup 0\.\d\d, min-speedup 1\)", report.reason), report.reason
    assert 0.5 < report.figures["speedup_c1"] < 0.7


def test_inconclusive_when_noisy(tmp_path: Path) -> None:
    seeds = tmp_path / "seed"  # each start draws the next seed: deterministic noise of +-50 %
    noisy = ["--jitter", "0.5", "--seed-file", str(seeds)]
    config = _config(tmp_path, ["--tok-s", "1000", *noisy], ["--tok-s", "1050", "--accept-length", "2", *noisy],
                     perf={"concurrency": [1], "trials": 3})
    report = run_perf(config, tmp_path / "out")
    _assert_gone(report.pids)
    assert (report.state, report.verdict) == ("error", "inconclusive")
    assert re.fullmatch(r"inconclusive at concurrency 1: the trials spread more than max-spread 10% and their "
                        r"range \(0\.\d\d-[12]\.\d\d\) straddles min-speedup 1; rerun on a quiet box",
                        report.reason), report.reason
    assert report.stage_result().details["rerun"] is True


def test_server_never_healthy(tmp_path: Path) -> None:
    config = _config(tmp_path, ["--startup-delay", "30"], ["--accept-length", "3"],
                     server={"startup-timeout": 1})
    report = run_perf(config, tmp_path / "out")
    _assert_gone(report.pids)
    port = report.trials[0]["port"]
    assert report.state == "error"
    assert report.reason == (f"baseline server did not become healthy within 1 s (/health_generate on port {port})")
    assert "loading for 30 s" in report.log_tail
    stage = report.stage_result()
    assert stage.details["log_tail"] == report.log_tail
    assert len(report.trials) == 1  # the run stops at the first broken server


def test_server_crashes_at_startup(tmp_path: Path) -> None:
    broken = [sys.executable, "-c", "import sys; print('ImportError: undefined symbol: "
              "_ZN3c104cuda29c10_cuda_check_implementationEiPKcS2_ib', flush=True); sys.exit(1)", "{port}"]
    config = parse_perf({"servers": {"baseline": {"argv": broken}, "eagle3": {"argv": broken}}}, {})
    assert config is not None
    report = run_perf(config, tmp_path / "out")
    _assert_gone(report.pids)
    assert (report.state, report.reason) == ("fail", "baseline server exited with exit code 1 before it "
                                                     "became healthy")
    assert report.log_tail.endswith("undefined symbol: _ZN3c104cuda29c10_cuda_check_implementationEiPKcS2_ib")


def test_server_dies_mid_run(tmp_path: Path) -> None:
    # Warm-up (1) and concurrency 1 (4 requests) pass; it dies in the first request at concurrency 4.
    config = _config(tmp_path, ["--tok-s", "2000"], ["--tok-s", "3000", "--accept-length", "3", "--crash-after", "5"])
    report = run_perf(config, tmp_path / "out")
    _assert_gone(report.pids)
    assert report.state == "fail"
    assert re.fullmatch(r"eagle3 server exited with exit code 3 at concurrency 4 \(stream ended before \[DONE\] "
                        r"after \d+ tokens; 0 of 4 requests finished\)", report.reason), report.reason
    assert re.search(r"crashing in request [6-9] as told", report.log_tail)
    assert report.trials[-1]["exit"] == 3


def test_server_stalls_mid_stream(tmp_path: Path) -> None:
    config = _config(tmp_path, ["--tok-s", "2000", "--stall-after", "1"], ["--accept-length", "3"],
                     perf={"stall-timeout": 0.5, "concurrency": [1]})
    report = run_perf(config, tmp_path / "out")
    _assert_gone(report.pids)
    assert report.state == "error"
    assert report.reason == ("baseline server failed a request at concurrency 1: no data for 0.5 s (stalled) "
                             "after 16 tokens")


def test_openai_protocol(tmp_path: Path) -> None:
    config = _config(tmp_path, ["--tok-s", "500"], ["--tok-s", "1500", "--accept-length", "3"],
                     perf={"protocol": "openai", "concurrency": [2], "trials": 1})
    report = run_perf(config, tmp_path / "out")
    _assert_gone(report.pids)
    assert report.state == "pass", report.reason
    assert report.accept_length_field == FIELD_SERVER
    assert 2.5 < report.figures["accept_length_c2"] <= 3.0
    assert report.trials[0]["levels"]["2"]["tokens"] == 4 * 32


def test_stop_kills_the_whole_group(tmp_path: Path) -> None:
    # The leader ignores SIGTERM and has a child that ignores it too: SIGKILL takes the whole group.
    stubborn = ["--ignore-sigterm", "--spawn-child"]
    config = _config(tmp_path, ["--tok-s", "3000", *stubborn], ["--tok-s", "3000", "--accept-length", "2", *stubborn],
                     perf={"trials": 1, "concurrency": [1]}, server={"stop-timeout": 0.3})
    report = run_perf(config, tmp_path / "out")
    _assert_gone(report.pids)
    assert report.state in ("pass", "fail")
    children = [int(m) for t in report.trials for m in re.findall(r"child pid (\d+)", t["log_tail"])]
    assert len(children) == 2
    assert report.trials[0]["exit"] == -9


def test_benchmark_json_works_with_pytest_benchmark_compare(tmp_path: Path) -> None:
    config = _config(tmp_path, ["--tok-s", "2000"], ["--tok-s", "2000", "--accept-length", "2"],
                     perf={"trials": 1, "concurrency": [1]})
    report = run_perf(config, tmp_path / "run1")
    _assert_gone(report.pids)
    first = json.loads((tmp_path / "run1" / "benchmark.json").read_text())
    names = [b["name"] for b in first["benchmarks"]]
    assert names == ["perf_s_per_token[baseline-c1]", "perf_ttft[baseline-c1]", "perf_itl[baseline-c1]",
                     "perf_s_per_token[eagle3-c1]", "perf_ttft[eagle3-c1]", "perf_itl[eagle3-c1]"]
    tok_s = report.figures["eagle3_tok_s_c1"]
    assert first["benchmarks"][3]["stats"]["ops"] == pytest.approx(tok_s)
    # A second run 20 % slower: more seconds per token, which pytest-benchmark's "higher is worse" reads
    # as the regression it is (ops, its inverse, is the throughput).
    slower = json.loads(json.dumps(first))
    for bench in slower["benchmarks"]:
        bench["stats"]["median"] *= 1.2
    (tmp_path / "run2.json").write_text(json.dumps(slower))
    argv = [sys.executable, "-m", "pytest_benchmark", "compare", "--group-by=name", "--columns=median,ops",
            str(tmp_path / "run1" / "benchmark.json"), str(tmp_path / "run2.json")]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "benchmark 'perf_s_per_token[eagle3-c1]': 2 tests" in done.stdout
    assert re.search(r"perf_s_per_token\[eagle3-c1\] \(0/run2\)\s+[\d.]+ \(1\.20\)", done.stdout), done.stdout


def test_client_counts_tokens_and_ttft(tmp_path: Path) -> None:
    config = _config(tmp_path, ["--tok-s", "0"], ["--accept-length", "4"])
    argv, _ = resolve_argv(config, os.environ)["baseline"]
    server = ServerProcess(config.servers["baseline"], [*argv, "--ttft-ms", "50"], dict(os.environ),
                     tmp_path / "s.log")
    with server:
        server.wait_ready()
        level = run_level(Target(port=server.port), ["a b c"], concurrency=3, requests=6, output_len=100)
    _assert_gone([server.pid])
    assert level.errors == []
    assert level.tokens == 600
    assert all(r.events == 100 and r.ttft >= 0.05 for r in level.requests)
    assert level.accept_length is None


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
    return CellContext(matrix=matrix, cell=cell, venv=venv, python=Path(sys.executable),
                       site_packages=venv, work_dir=tmp_path / "cell")


def test_stage_runs_in_the_cell(tmp_path: Path) -> None:
    stage = run_perf_stage(_context(tmp_path, _matrix_text(STANDIN)))
    assert stage.state == "pass", stage.reason
    assert set(stage.details["figures"]) >= {"baseline_tok_s_c1", "eagle3_tok_s_c1", "speedup_c1",
                                              "accept_length_c1"}
    assert (tmp_path / "cell" / "perf" / "benchmark.json").is_file()
    _assert_gone([t["pid"] for t in stage.details["trials"]])


def test_stage_skips_without_the_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TARGET_MODEL", raising=False)
    stage = run_perf_stage(_context(tmp_path, _matrix_text([*STANDIN, "--model", "${TARGET_MODEL}"])))
    assert (stage.state, stage.reason) == ("skip", (
        "skipped: perf.servers.baseline.argv[6]: environment variable TARGET_MODEL is not set; export "
        "TARGET_MODEL=... (e.g. the model's path) before running the perf suite; perf.servers.eagle3.argv[6]: "
        "environment variable TARGET_MODEL is not set; export TARGET_MODEL=... (e.g. the model's path) before "
        "running the perf suite"))


def test_stage_without_perf_section(tmp_path: Path) -> None:
    stage = run_perf_stage(_context(tmp_path, MATRIX))
    assert (stage.state, stage.reason) == ("skip", "skipped: matrix.toml has no [perf] section")


def test_main(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "matrix.toml"
    path.write_text(_matrix_text(STANDIN, '\n[thresholds.perf]\nmin-speedup = 1.2\n'))
    assert main(["--matrix", str(path), "--out", str(tmp_path / "out"), "--venv", sys.prefix]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^c1: baseline [\d.]+ tok/s, eagle3 [\d.]+ tok/s, speedup [\d.]+, accept length [\d.]+: "
                     r"pass$", out, re.M), out
    assert (tmp_path / "out" / "perf.json").is_file()
    path.write_text(_matrix_text(STANDIN, "\n[thresholds.perf]\nmin-speedup = 0\n"))
    assert main(["--matrix", str(path), "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err == (
        f"error: {path}: thresholds.perf.min-speedup: expected a positive number, got 0\n")
