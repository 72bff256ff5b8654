"""Every count read from input has an upper bound (config/limits.py): past it, `compatlab validate` and the
command line say so in one line per count, naming the key, the bound and why, and start nothing."""

from __future__ import annotations

import time
from pathlib import Path

from compatlab.config.limits import LIMITS
from fixtures.labutil import lab

MATRIX = """
max-cells = 200000
[axes.torch]
select = { latest = 1000 }
[[axes.cuda]]
version = "12.8"
[[rules.neighbours]]
of = "shipped"
distance = 1000
[install]
retries = 1000000000
[targets.box]
gpus = 100000
[serve]
layers = 1000
draft-layers = 1000
tp = 1000
output-len = 10000000
requests = 1000000
concurrency = [1, 1000000]
[perf]
concurrency = [1, 1000000]
trials = 1000
warmup = 100000
requests = 1000000
output-len = 10000000
[perf.servers.baseline]
argv = ["python", "-m", "sglang.launch_server", "--port", "{port}"]
[perf.servers.eagle3]
argv = ["python", "-m", "sglang.launch_server", "--port", "{port}"]
"""


def _why(key: str, value: int) -> str:
    limit = LIMITS[key]
    return f"{value:,} is more than {limit.maximum:,}, the most allowed: {limit.why}"


def test_every_count_in_matrix_toml_is_bounded(tmp_path: Path) -> None:
    (tmp_path / "matrix.toml").write_text(MATRIX)
    done = lab(tmp_path, "validate", "--matrix", "matrix.toml")
    assert (done.returncode, done.stdout) == (2, "")
    got = sorted(line.strip() for line in done.stderr.splitlines()[1:])
    assert done.stderr.startswith(f"error: {len(got)} problems in matrix.toml:\n")
    unlocked = (
        "matrix.toml: axes.torch: selects its versions (every release) from its index, and there is no matrix.lock; "
        "run `compatlab lock` (or `nox -s lock`) to resolve them"
    )
    assert got == sorted(
        [unlocked]
        + [
            f"matrix.toml: {where}: {_why(key, value)}"
            for where, key, value in [
                ("max-cells", "max-cells", 200_000),
                ("axes.torch.select.latest", "select.latest", 1000),
                ("rules.neighbours[0].distance", "rules.neighbours.distance", 1000),
                ("install.retries", "install.retries", 1_000_000_000),
                ("targets.box.gpus", "targets.gpus", 100_000),
                ("serve.layers", "serve.layers", 1000),
                ("serve.draft-layers", "serve.draft-layers", 1000),
                ("serve.tp", "serve.tp", 1000),
                ("serve.output-len", "serve.output-len", 10_000_000),
                ("serve.requests", "serve.requests", 1_000_000),
                ("serve.concurrency[1]", "serve.concurrency", 1_000_000),
                ("perf.concurrency[1]", "perf.concurrency", 1_000_000),
                ("perf.trials", "perf.trials", 1000),
                ("perf.warmup", "perf.warmup", 100_000),
                ("perf.requests", "perf.requests", 1_000_000),
                ("perf.output-len", "perf.output-len", 10_000_000),
            ]
        ]
    )


def test_every_count_on_the_command_line_is_bounded_and_refused_at_once(tmp_path: Path) -> None:
    (tmp_path / "matrix.toml").write_text('[[axes.torch]]\nversion = "2.9.1"\n[[axes.cuda]]\nversion = "12.8"\n')
    cases = [
        (("ci-matrix", "--matrix", "matrix.toml", "--shards", "100000000"), f"--shards: {_why('--shards', 10**8)}"),
        (("cells", "--matrix", "matrix.toml", "--shard", "1/100000"), f"--shard 1/100000: {_why('--shard', 10**5)}"),
        (("prune", "--runs", "runs", "--keep", "1000000000"), f"--keep: {_why('--keep', 10**9)}"),
        (("nccl", "--world-size", "100000"), f"--world-size: {_why('--world-size', 10**5)}"),
        (("nccl", "--world-size", "2", "--sweeps", "1000"), f"--sweeps: {_why('--sweeps', 1000)}"),
        (("nccl", "--world-size", "2", "--iters", "100000"), f"--iters: {_why('--iters', 10**5)}"),
        (("nccl", "--world-size", "2", "--warmup", "100000"), f"--warmup: {_why('--warmup', 10**5)}"),
    ]
    for args, said in cases:
        t0 = time.monotonic()
        done = lab(tmp_path, *args)
        assert (done.returncode, done.stdout, done.stderr) == (2, "", f"error: {said}\n"), args
        assert time.monotonic() - t0 < 30, args  # refused before any work, not after it
