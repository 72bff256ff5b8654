"""Do our perf figures agree with SGLang's own benchmark client? Both against the same stand-in, side by side.

SGLang's client (``sglang.benchmark.serving``, the code behind ``python -m sglang.bench_serving``) runs from
a throwaway venv: ``sglang`` installed without its dependencies, plus the few libraries its benchmark
module imports (see ``DEPS``), driven by ``_sglang_bench_driver.py`` with a tiny word-level tokenizer made
locally. Ours is ``compatlab.stages.sglang.client``. For each server kind (a baseline: one token a step; EAGLE-3:
verify steps of 1-4 tokens) and concurrency (1, 16), one stand-in serves both clients, alternating, a few
rounds; the table shows the medians over rounds and how far ours is from SGLang's::

    PYTHONPATH=src python benchmarks/bench_vs_sglang.py                  # venv in /tmp/compatlab-sglang-bench
    PYTHONPATH=src python benchmarks/bench_vs_sglang.py --venv DIR --rounds 5 --sglang 0.5.23

Against a real SGLang (``--real PYTHON --model DIR``, e.g. on the GPU box): the script starts
``PYTHON -m sglang.launch_server --model-path DIR --load-format dummy`` (``--launch-arg`` adds arguments;
DIR is a model the serve stage made, see ``compatlab.stages.serve.model``), then runs ``PYTHON -m
sglang.bench_serving`` (its ``custom`` dataset) and ours with the same prompts, interleaved (ABBA) over
``--rounds``: the prompts are words ``w<id>`` of the generated word-level tokenizer, one word one token, so
both clients send the very same prompt token ids. The table shows medians and each side's spread
(max - min over the median) of throughput, TTFT and ITL at each concurrency::

    PYTHONPATH=src python benchmarks/bench_vs_sglang.py --real ~/cell/bin/python --model ~/m/target \
        --rounds 5 --launch-arg=--attention-backend --launch-arg=triton

Both clients warm up with one request and flush the cache before measuring, as SGLang's does with
``--flush-cache``. Exit status 0 when throughput, TTFT and ITL agree within ``--tolerance`` (2 %), 1 when
not, 2 when SGLang's client cannot be installed or imported here.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from compatlab.config.perf import ServerSpec
from compatlab.proc import run
from compatlab.stages.sglang.client import Target, run_level
from compatlab.stages.sglang.server import ServerProcess

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
DRIVER = HERE / "_sglang_bench_driver.py"
# What sglang.benchmark.serving (0.5.23) imports, directly or through sglang.benchmark.datasets.
DEPS = (
    "aiohttp",
    "msgspec",
    "numpy",
    "orjson",
    "requests",
    "tqdm",
    "transformers",
    "pillow",
    "datasets",
    "pybase64",
    "psutil",
)
SERVERS = {"baseline": [], "eagle3": ["--accept-length", "1-4", "--seed", "11"]}
FIGURES = (
    # SGLang's result key, label, which agree within the tolerance
    ("output_throughput", "output tok/s", True),
    ("mean_ttft_ms", "mean TTFT ms", True),
    ("median_ttft_ms", "median TTFT ms", True),
    ("p99_ttft_ms", "p99 TTFT ms", False),
    ("mean_itl_ms", "mean ITL ms", True),
    ("median_itl_ms", "median ITL ms", True),
    ("p99_itl_ms", "p99 ITL ms", False),
    ("mean_tpot_ms", "mean TPOT ms", False),
    ("median_tpot_ms", "median TPOT ms", False),
    ("accept_length", "accept length", False),
)


def ensure_venv(venv: Path, version: str) -> Path:
    """The throwaway venv's Python, made with uv when missing."""
    python = venv / "bin" / "python"
    if python.is_file():
        return python
    uv = shutil.which("uv")
    if uv is None:
        raise SystemExit("uv not found; it makes the throwaway venv for SGLang's client")
    env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never"}
    steps = [
        [uv, "venv", "-q", str(venv), "--python", f"{sys.version_info.major}.{sys.version_info.minor}"],
        [uv, "pip", "install", "-q", "--python", str(python), "--no-deps", f"sglang=={version}"],
        [uv, "pip", "install", "-q", "--python", str(python), *DEPS],
    ]
    for argv in steps:
        done = run(argv, timeout=900, env=env)
        if not done.ok:
            raise SystemExit(
                f"cannot make the venv for SGLang's client: {' '.join(argv)}: "
                f"{(done.stderr or done.stdout).strip()[-500:]}"
            )
    return python


def sglang_round(
    python: Path, tokenizer: Path, port: int, *, concurrency: int, requests: int, output_len: int, out: Path
) -> dict[str, Any]:
    argv = [
        str(python),
        str(DRIVER),
        str(tokenizer),
        "--",
        "--backend",
        "sglang",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--model",
        str(tokenizer),
        "--tokenizer",
        str(tokenizer),
        "--dataset-name",
        "random-ids",
        "--num-prompts",
        str(requests),
        "--random-input-len",
        "16",
        "--random-output-len",
        str(output_len),
        "--random-range-ratio",
        "1",
        "--max-concurrency",
        str(concurrency),
        "--warmup-requests",
        "1",
        "--flush-cache",
        "--disable-tqdm",
        "--output-file",
        str(out),
    ]
    return _run_sglang_bench(
        argv, out, requests, env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    )


def _run_sglang_bench(argv: list[str], out: Path, requests: int, *, env: dict[str, str]) -> dict[str, Any]:
    """Run SGLang's benchmark client; the result line it wrote to *out*, all *requests* completed."""
    out.unlink(missing_ok=True)
    done = run(argv, timeout=600, env=env)
    if not done.ok or not out.is_file():
        raise SystemExit(f"SGLang's benchmark failed (exit {done.returncode}):\n{(done.stdout + done.stderr)[-3000:]}")
    result: dict[str, Any] = json.loads(out.read_text().splitlines()[-1])
    if result["completed"] != requests:
        raise SystemExit(f"SGLang's benchmark completed {result['completed']} of {requests} requests")
    return result


def our_round(server: ServerProcess, *, concurrency: int, requests: int, output_len: int) -> dict[str, Any]:
    target = Target(port=server.port)
    prompt = [" ".join(["the", "model", "token", "fast"] * 4)]
    warm = run_level(target, prompt, concurrency=1, requests=1, output_len=min(output_len, 32), timeout=60)
    assert not warm.errors, warm.errors[0].error
    server.flush_cache("after warm-up")
    level = run_level(target, prompt, concurrency=concurrency, requests=requests, output_len=output_len, timeout=120)
    assert not level.errors, level.errors[0].error
    stats = level.latency_stats()
    return {"output_throughput": level.tok_s, **stats, "accept_length": level.accept_length}


def real_prompts(model: Path, *, count: int, length: int, seed: int) -> list[str]:
    """*count* prompts of *length* words ``w<id>`` (one token each in the generated tokenizer), specials avoided."""
    config = json.loads((model / "config.json").read_text(encoding="utf-8"))
    config = config.get("text_config", config)
    eos = config.get("eos_token_id")
    special = {config.get("bos_token_id"), 0, *(eos if isinstance(eos, list) else [eos])}
    rng = random.Random(seed)  # noqa: S311 - reproducible prompts, not secrets
    ids = [i for i in range(3, int(config["vocab_size"])) if i not in special]
    return [" ".join(f"w{i}" for i in rng.sample(ids, length)) for _ in range(count)]


def real_main(args: argparse.Namespace) -> int:
    """Both clients against one real SGLang server (see the module docstring)."""
    python, model = Path(args.real), Path(args.model)
    prompts = real_prompts(model, count=64, length=args.prompt_len, seed=args.seed)
    argv = [
        str(python),
        "-m",
        "sglang.launch_server",
        "--model-path",
        str(model),
        "--load-format",
        "dummy",
        "--host",
        "127.0.0.1",
        "--port",
        "{port}",
        *args.launch_arg,
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    spec = ServerSpec(name="real", argv=tuple(argv), startup_timeout=900, stop_timeout=30)
    levels = [int(c) for c in args.concurrency.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "prompts.jsonl"
        data.write_text(
            "".join(
                json.dumps({"conversations": [{"content": p}, {"content": "w5 w6 w7 w8"}]}) + "\n" for p in prompts
            ),
            encoding="utf-8",
        )
        server = ServerProcess(spec, argv, env, Path(args.log or Path(tmp) / "server.log"))
        table: dict[tuple[int, str], list[dict[str, Any]]] = {}
        with server:
            server.wait_ready()
            print(
                f"real SGLang at port {server.port}: {model}; {args.rounds} rounds, ABBA order, "
                f"{args.output_len} output tokens, prompts of {args.prompt_len} token ids",
                flush=True,
            )
            for r in range(args.rounds):
                for c in levels:
                    requests = c * args.requests_per_stream
                    order = ("sglang", "compatlab") if r % 2 == 0 else ("compatlab", "sglang")
                    for who in order:
                        if who == "sglang":
                            got = _real_sglang_round(
                                python,
                                model,
                                server.port,
                                data,
                                concurrency=c,
                                requests=requests,
                                output_len=args.output_len,
                                out=Path(tmp) / "sglang.jsonl",
                                env=env,
                            )
                        else:
                            got = _real_our_round(
                                server, prompts, concurrency=c, requests=requests, output_len=args.output_len
                            )
                        table.setdefault((c, who), []).append(got)
                        print(
                            f"  round {r + 1} c{c} {who}: {got['output_throughput']:.1f} tok/s, median TTFT "
                            f"{got['median_ttft_ms']:.1f} ms, median ITL {got['median_itl_ms']:.2f} ms",
                            flush=True,
                        )
    print(f"\nmedians over {args.rounds} rounds (spread = (max - min) / median)")
    print(f"  {'c':>3} {'figure':<16}{'SGLang':>10}{'spread':>8}{'compatlab':>11}{'spread':>8}{'relative':>10}")
    for c in levels:
        for key, label in (
            ("output_throughput", "output tok/s"),
            ("median_ttft_ms", "median TTFT ms"),
            ("median_itl_ms", "median ITL ms"),
        ):
            cols = []
            for who in ("sglang", "compatlab"):
                values = [row[key] for row in table[(c, who)]]
                mid = statistics.median(values)
                cols.append((mid, (max(values) - min(values)) / mid if mid else 0.0))
            (ma, sa), (mb, sb) = cols
            print(f"  {c:>3} {label:<16}{ma:10.2f}{sa:8.1%}{mb:11.2f}{sb:8.1%}{_pct(mb, ma):>10}")
    return 0


def _real_sglang_round(
    python: Path,
    model: Path,
    port: int,
    data: Path,
    *,
    concurrency: int,
    requests: int,
    output_len: int,
    out: Path,
    env: dict[str, str],
) -> dict[str, Any]:
    argv = [
        str(python),
        "-m",
        "sglang.bench_serving",
        "--backend",
        "sglang",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--model",
        str(model),
        "--tokenizer",
        str(model),
        "--dataset-name",
        "custom",
        "--dataset-path",
        str(data),
        "--num-prompts",
        str(requests),
        "--sharegpt-output-len",
        str(output_len),
        "--max-concurrency",
        str(concurrency),
        "--warmup-requests",
        "1",
        "--flush-cache",
        "--disable-tqdm",
        "--output-file",
        str(out),
    ]
    return _run_sglang_bench(argv, out, requests, env=env)


def _real_our_round(
    server: ServerProcess, prompts: list[str], *, concurrency: int, requests: int, output_len: int
) -> dict[str, Any]:
    target = Target(port=server.port)
    warm = run_level(target, prompts[:1], concurrency=1, requests=1, output_len=min(output_len, 32), timeout=120)
    assert not warm.errors, warm.errors[0].error
    server.flush_cache("after warm-up")
    level = run_level(target, prompts, concurrency=concurrency, requests=requests, output_len=output_len, timeout=300)
    assert not level.errors, level.errors[0].error
    return {"output_throughput": level.tok_s, **level.latency_stats()}


def _pct(ours: float | None, theirs: float | None) -> str:
    if ours is None or theirs is None or not theirs:
        return "n/a"
    return f"{(ours - theirs) / theirs * 100:+.1f} %"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--venv", type=Path, default=Path(tempfile.gettempdir()) / "compatlab-sglang-bench")
    parser.add_argument("--sglang", default="0.5.23", help="the sglang version whose client to run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tok-s", type=float, default=100.0, help="the stand-in's tokens per second per stream")
    parser.add_argument("--output-len", type=int, default=96)
    parser.add_argument("--ttft-ms", type=float, default=50.0, help="the stand-in's prefill time")
    parser.add_argument("--tolerance", type=float, default=0.02)
    real = parser.add_argument_group("against a real SGLang")
    real.add_argument("--real", metavar="PYTHON", help="an interpreter with sglang: serve and bench with it")
    real.add_argument("--model", metavar="DIR", help="the model folder to serve (config.json and tokenizer)")
    real.add_argument("--launch-arg", action="append", default=[], help="an extra launch_server argument")
    real.add_argument("--concurrency", default="1,8")
    real.add_argument("--requests-per-stream", type=int, default=4)
    real.add_argument("--prompt-len", type=int, default=128)
    real.add_argument("--seed", type=int, default=0)
    real.add_argument("--log", help="where to keep the server's log")
    args = parser.parse_args(argv)
    if args.real:
        if not args.model:
            parser.error("--real needs --model DIR")
        return real_main(args)
    python = ensure_venv(args.venv, args.sglang)
    check = run([str(python), "-c", "import importlib.metadata as m; print(m.version('sglang'))"], timeout=60)
    version = check.stdout.strip() or "?"
    tokenizer = args.venv / "tokenizer"
    path = [str(SRC), str(HERE.parent / "tests"), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    agree = True
    print(
        f"SGLang's client: sglang.benchmark.serving from sglang {version}; ours: compatlab.stages.sglang.client; "
        f"stand-in at {args.tok_s:g} tok/s per stream, prefill {args.ttft_ms:g} ms, {args.output_len} tokens, "
        f"medians of {args.rounds} rounds"
    )
    with tempfile.TemporaryDirectory() as tmp:
        for name, flags in SERVERS.items():
            for concurrency in (1, 16):
                requests = max(8, 4 * concurrency)
                server_argv = [
                    sys.executable,
                    "-m",
                    "fixtures.standin_server",
                    "--port",
                    "{port}",
                    "--tok-s",
                    str(args.tok_s),
                    "--ttft-ms",
                    str(args.ttft_ms),
                    "--log-interval",
                    "1",
                    *flags,
                ]
                spec = ServerSpec(name=name, argv=tuple(server_argv), startup_timeout=30, stop_timeout=5)
                server = ServerProcess(spec, server_argv, env, Path(tmp) / f"{name}-c{concurrency}.log")
                theirs: list[dict[str, Any]] = []
                ours: list[dict[str, Any]] = []
                with server:
                    server.wait_ready()
                    for _ in range(args.rounds):
                        theirs.append(
                            sglang_round(
                                python,
                                tokenizer,
                                server.port,
                                concurrency=concurrency,
                                requests=requests,
                                output_len=args.output_len,
                                out=Path(tmp) / "sglang.jsonl",
                            )
                        )
                        ours.append(
                            our_round(server, concurrency=concurrency, requests=requests, output_len=args.output_len)
                        )
                print(f"\n{name}, concurrency {concurrency}, {requests} requests")
                print(f"  {'figure':<16}{'SGLang':>10}{'compatlab':>11}{'difference':>12}{'relative':>10}")
                for key, label, strict in FIGURES:
                    a = [r[key] for r in theirs if r.get(key) is not None]
                    b = [r[key] for r in ours if r.get(key) is not None]
                    ma = statistics.median(a) if a else None
                    mb = statistics.median(b) if b else None
                    note = ""
                    if strict and (ma is None or mb is None or abs(mb - ma) > args.tolerance * abs(ma)):
                        agree = False
                        note = "  <-- beyond tolerance"
                    shown = [f"{v:10.2f}" if v is not None else f"{'-':>10}" for v in (ma, mb)]
                    delta = f"{mb - ma:+12.2f}" if ma is not None and mb is not None else f"{'':>12}"
                    print(f"  {label:<16}{shown[0]} {shown[1]}{delta}{_pct(mb, ma):>10}{note}")
    print(
        f"\n{'agree' if agree else 'DISAGREE'}: throughput, mean/median TTFT and mean/median ITL within "
        f"{args.tolerance:.0%}"
    )
    return 0 if agree else 1


if __name__ == "__main__":
    raise SystemExit(main())
