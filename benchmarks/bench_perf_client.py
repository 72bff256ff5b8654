"""Is the perf client fast enough not to be the bottleneck? Stream from an unthrottled stand-in server.

The stand-in (``--tok-s 0``: no rate limit) runs in its own process; this process runs only the client,
so its CPU time is the client's. The figure that matters is streamed tokens per second of *client CPU*:
how many tokens one core of this machine can take in. Every event carries one token (no speculation)
and, as SGLang does by default, the cumulative text, which is the client's worst case.

    PYTHONPATH=src python benchmarks/bench_perf_client.py            # prints figures, median of 5
    PYTHONPATH=src python -m pytest benchmarks/bench_perf_client.py  # the same under pytest-benchmark
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from compatlab.stages.perf.stage import ServerProcess, ServerSpec
from compatlab.stages.sglang.client import Target, run_level

CONCURRENCY = 8
REQUESTS = 32
OUTPUT_LEN = 512
FLOOR = 10_000  # streamed tokens per second of client CPU


def _start(log: Path) -> ServerProcess:
    argv = [sys.executable, "-m", "fixtures.standin_server", "--port", "{port}", "--tok-s", "0", "--ttft-ms", "0"]
    env = dict(os.environ)
    root = Path(__file__).resolve().parents[1]
    env["PYTHONPATH"] = os.pathsep.join([str(root / "src"), str(root / "tests"), env.get("PYTHONPATH", "")])
    spec = ServerSpec(name="standin", argv=tuple(argv), startup_timeout=30, stop_timeout=5)
    server = ServerProcess(spec, argv, env, log)
    server.__enter__()
    try:
        server.wait_ready()
    except BaseException:
        server.stop()
        raise
    return server


def one_round(port: int, protocol: str = "generate") -> dict[str, float]:
    """One level of REQUESTS streams, CONCURRENCY at a time; wall and client-CPU token rates."""
    cpu, wall = time.process_time(), time.perf_counter()
    level = run_level(
        Target(port=port, protocol=protocol),  # type: ignore[arg-type]
        ["Write a long story about kernels."],
        concurrency=CONCURRENCY,
        requests=REQUESTS,
        output_len=OUTPUT_LEN,
        timeout=60,
    )
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    assert not level.errors, level.errors[0].error
    events = sum(r.events for r in level.requests)
    return {
        "tokens": level.tokens,
        "events": events,
        "wall_tok_s": level.tokens / wall,
        "cpu_s": cpu,
        "cpu_tok_s": level.tokens / cpu,
        "cpu_us_per_event": cpu / events * 1e6,
    }


@pytest.fixture(scope="module")
def standin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = _start(tmp_path_factory.mktemp("bench") / "standin.log")
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.parametrize("protocol", ["generate", "openai"])
def test_client_sustains_10k_tokens_per_cpu_second(benchmark: Any, standin: ServerProcess, protocol: str) -> None:
    rounds: list[dict[str, float]] = []
    benchmark.pedantic(lambda: rounds.append(one_round(standin.port, protocol)), rounds=5, iterations=1)
    cpu_tok_s = statistics.median(r["cpu_tok_s"] for r in rounds)
    benchmark.extra_info.update(
        cpu_tok_s_median=cpu_tok_s,
        wall_tok_s_median=statistics.median(r["wall_tok_s"] for r in rounds),
        cpu_us_per_event_median=statistics.median(r["cpu_us_per_event"] for r in rounds),
    )
    assert cpu_tok_s > FLOOR


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        return _main(Path(tmp) / "standin.log")


def _main(log: Path) -> int:
    server = _start(log)
    try:
        for protocol in ("generate", "openai"):
            one_round(server.port, protocol)  # warm-up
            rounds = [one_round(server.port, protocol) for _ in range(5)]
            med = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
            print(
                f"{protocol}: {CONCURRENCY} streams x {REQUESTS} requests x {OUTPUT_LEN} tokens, "
                f"median of 5: {med['cpu_tok_s']:,.0f} tokens per client-CPU second "
                f"({med['cpu_us_per_event']:.1f} us per event), {med['wall_tok_s']:,.0f} tok/s wall "
                f"(server and client share {os.cpu_count()} cores)"
            )
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
