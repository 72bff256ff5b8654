"""The upper bound of every count the lab reads from its input, in one table, each with the reason for it.

A count is a number of things the lab will then make, start or wait for: cells, shards, retries, ranks,
layers, streams, requests, prompts. Each is checked where it is read (matrix.toml through ``Checker.number``
with ``limit=``, the command line through ``check``), and one past its bound is one line that names the key,
the bound and why: ``matrix.toml: serve.concurrency[1]: 1000000 is more than 1,000, the most allowed: …``.
The README's table ("Counts from input") is this table, and a test holds the two together.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from compatlab.errors import UsageError

__all__ = ["LIMITS", "Limit", "check", "over"]


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Limit:
    maximum: int
    why: str


_GPUS = Limit(maximum=256, why="one box's GPUs: one process is started for each")
_STREAMS = Limit(
    maximum=1000,
    why="one open connection per stream, and 1,024 open files is the usual limit of a process",
)
_REQUESTS = Limit(maximum=10_000, why="each is a real request to the server, one after another per stream")
_OUTPUT = Limit(maximum=131_072, why="tokens per request: more than the context of the models served")
_SHARDS = Limit(maximum=256, why="a GitHub Actions matrix runs at most 256 jobs; a shard is one machine")

LIMITS: Mapping[str, Limit] = {
    "max-cells": Limit(
        maximum=100_000, why="every cell is expanded, listed and planned at each start (5,000 list in 2.8 s)"
    ),
    "select.latest": Limit(maximum=100, why="each release is one more value of the axis, and multiplies the cells"),
    "rules.neighbours.distance": Limit(maximum=100, why="releases away from a shipped stack; 100 is every one"),
    "install.retries": Limit(
        maximum=10, why="each retry runs the whole install again; ten errors in a row are not a flaky index"
    ),
    "targets.gpus": _GPUS,
    "serve.layers": Limit(maximum=256, why="the model is shrunk to a few layers; no served model has more"),
    "serve.draft-layers": Limit(maximum=256, why="the EAGLE-3 draft is a layer or two; no served model has more"),
    "serve.tp": _GPUS,
    "serve.output-len": _OUTPUT,
    "serve.requests": _REQUESTS,
    "serve.concurrency": _STREAMS,
    "perf.concurrency": _STREAMS,
    "perf.output-len": _OUTPUT,
    "perf.requests": _REQUESTS,
    "perf.trials": Limit(maximum=100, why="each trial streams every request at every level again"),
    "perf.warmup": Limit(maximum=1000, why="warm-up requests are thrown away; a thousand warm any server"),
    "perf.prompts": Limit(maximum=10_000, why="prompts in the set: the requests cycle through them"),
    "--shards": _SHARDS,
    "--shard": _SHARDS,
    "--keep": Limit(maximum=100_000, why="runs kept under reports/runs; history reads each one's run.json"),
    "--world-size": _GPUS,
    "--sweeps": Limit(maximum=100, why="each sweep times every message size again"),
    "--iters": Limit(maximum=10_000, why="timed collectives per size and sweep"),
    "--warmup": Limit(maximum=1000, why="untimed collectives per size"),
}


def over(key: str, value: float) -> str | None:
    """What is wrong with *value* for the count *key* (a key of LIMITS), or None when it is within its bound."""
    limit = LIMITS[key]
    if value <= limit.maximum:
        return None
    shown = f"{value:,}" if isinstance(value, int) else f"{value:g}"
    return f"{shown} is more than {limit.maximum:,}, the most allowed: {limit.why}"


def check(key: str, value: int | None, *, where: str | None = None) -> None:
    """UsageError, one line, when a count of the command line (*where*, default *key*) is past its bound."""
    if value is None:
        return
    problem = over(key, value)
    if problem is not None:
        raise UsageError(f"{where or key}: {problem}")
