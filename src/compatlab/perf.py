"""The EAGLE-3 throughput suite: does speculative decoding beat the baseline on this stack, and by how much?

``[perf]`` in matrix.toml describes two engine runs, ``baseline`` and ``eagle3``; ``[thresholds.perf]`` the
floors. Each trial starts a server in its own process group, waits for health, warms it up, streams the
shipped prompt set at every concurrency level, and stops it (SIGTERM, then SIGKILL to the whole group).
Trials alternate baseline/EAGLE-3 in an ABBA order so that drift of the box does not favour either. The
verdict per concurrency level compares medians; when the trials spread wider than ``max-spread`` *and*
their range straddles a floor, the level is *inconclusive*: a rerun, not a red.

Outputs: ``perf.json`` (everything, versioned), ``benchmark.json`` (pytest-benchmark format; throughput as
seconds per output token so that "higher is worse" holds for ``pytest-benchmark compare``), server logs,
and the cell's ``perf`` StageResult with flat ``details.figures``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import difflib
import http.client
import json
import logging
import os
import platform
import random
import re
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import IO, Any

from .errors import ConfigError, LabError
from .matrix import _Checker, _show
from .perf_client import LevelResult, Target, get_json, run_level
from .proc import ProgramNotFound
from .results import StageResult, write_json_atomic
from .stages import CellContext, cell_env

__all__ = [
    "PERF_SCHEMA",
    "PerfConfig",
    "PerfReport",
    "ServerFailure",
    "ServerProcess",
    "ServerSpec",
    "Thresholds",
    "load_prompts",
    "main",
    "parse_perf",
    "resolve_argv",
    "run_perf",
    "run_perf_stage",
]

log = logging.getLogger(__name__)

PERF_SCHEMA = "compatlab.perf/1"
SERVERS = ("baseline", "eagle3")
PROTOCOLS = ("generate", "openai")
HEALTH_PATHS = ("/health_generate", "/health")
FIELD_META = "meta_info.completion_tokens / meta_info.spec_verify_ct"
FIELD_SERVER = "get_server_info.internal_states[0].avg_spec_accept_length"
_PERF_KEYS = frozenset({"servers", "protocol", "concurrency", "trials", "output-len", "warmup", "requests",
                        "seed", "prompts", "request-timeout", "stall-timeout"})
_SERVER_KEYS = frozenset({"argv", "port", "env", "startup-timeout", "stop-timeout", "health"})
_THRESHOLD_KEYS = frozenset({"min-speedup", "min-tok-s", "min-accept-length", "max-spread"})
_VAR = re.compile(r"\$\{([^}]*)\}")
_VAR_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_LOG_TAIL = 40


# -- configuration ---------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class ServerSpec:
    """One engine run; ``argv`` and ``env`` values may hold ``${VAR}``, argv ``{port}``."""

    name: str
    argv: tuple[str, ...]
    port: int | None = None  # None: a free loopback port is picked per start
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    startup_timeout: float = 1200.0
    stop_timeout: float = 60.0
    health: str = "/health_generate"


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Thresholds:
    """Floors per concurrency level (missing: not checked) and the noise limit."""

    min_speedup: Mapping[int, float]
    min_tok_s: Mapping[int, float] = dataclasses.field(default_factory=dict)
    min_accept_length: float | None = None
    max_spread: float = 0.10


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class PerfConfig:
    path: str
    servers: Mapping[str, ServerSpec]
    thresholds: Thresholds
    protocol: str = "generate"
    concurrency: tuple[int, ...] = (1, 16)
    trials: int = 3
    output_len: int = 256
    warmup: int = 2
    requests: int | None = None
    seed: int = 0
    prompts: Path | None = None
    request_timeout: float = 600.0
    stall_timeout: float = 60.0

    def requests_at(self, concurrency: int) -> int:
        """Requests per level: ``requests`` (at least one per slot), or twice the concurrency, at least 8."""
        if self.requests is not None:
            return max(self.requests, concurrency)
        return max(8, 2 * concurrency)


def _number(ck: _Checker, table: Mapping[str, Any], where: str, name: str, *, integer: bool = False,
            minimum: float = 0, strict: bool = True) -> Any:
    """A TOML number (never a bool) above (or at, when not *strict*) *minimum*; None when absent or bad."""
    if name not in table:
        return None
    value = table[name]
    key = f"{where}.{name}"
    kinds = (int,) if integer else (int, float)
    below = value <= minimum if strict else value < minimum
    if isinstance(value, bool) or not isinstance(value, kinds) or below:
        if integer:
            what = "a positive integer" if strict and minimum == 0 else f"an integer >= {minimum:g}"
        else:
            what = "a positive number" if strict and minimum == 0 else f"a number >= {minimum:g}"
        ck.error(key, f"expected {what}, got {_show(value)}")
        return None
    return value


def _strings_with_vars(ck: _Checker, value: str, where: str) -> None:
    for match in _VAR.finditer(value):
        if not _VAR_NAME.fullmatch(match.group(1)):
            ck.error(where, f"{match.group(0)!r} is not a variable reference; write ${{NAME}} with a name "
                            "of letters, digits and '_'")


def _parse_server(ck: _Checker, name: str, raw: object) -> ServerSpec | None:
    where = f"perf.servers.{name}"
    if not isinstance(raw, dict):
        ck.error(where, f"expected a table ([{where}]), got {_show(raw)}")
        return None
    ck.keys(raw, where, _SERVER_KEYS)
    argv: list[str] = []
    if "argv" not in raw:
        ck.error(f"{where}.argv", 'missing; give the command as a list, e.g. ["python", "-m", '
                                  '"sglang.launch_server", "--port", "{port}"]')
    elif not isinstance(raw["argv"], list):
        ck.error(f"{where}.argv",
                 f"expected an array of strings (never a shell string), got {_show(raw['argv'])}")
    elif not raw["argv"]:
        ck.error(f"{where}.argv", "must not be empty")
    else:
        for i, item in enumerate(raw["argv"]):
            if not isinstance(item, str):
                ck.error(f"{where}.argv[{i}]", f"expected a string, got {_show(item)}")
            else:
                _strings_with_vars(ck, item, f"{where}.argv[{i}]")
                argv.append(item)
    port = None
    if "port" in raw:
        p = raw["port"]
        if isinstance(p, bool) or not isinstance(p, int) or not 1 <= p <= 65535:
            ck.error(f"{where}.port", f"expected a port number 1-65535, got {_show(p)}")
        else:
            port = p
    if argv and port is None and not any("{port}" in a for a in argv):
        ck.error(f"{where}.argv",
                 "has no '{port}' and no port is set; add \"--port\", \"{port}\" or set port")
    env: dict[str, str] = {}
    for key, value in ck.table(raw, where, "env").items():
        if not _VAR_NAME.fullmatch(key):
            ck.error(f"{where}.env.{key}", "expected an environment variable name like CUDA_VISIBLE_DEVICES")
        elif not isinstance(value, str):
            ck.error(f"{where}.env.{key}", f"expected a string, got {_show(value)}")
        else:
            _strings_with_vars(ck, value, f"{where}.env.{key}")
            env[key] = value
    startup = _number(ck, raw, where, "startup-timeout")
    stop = _number(ck, raw, where, "stop-timeout")
    health = raw.get("health", "/health_generate")
    if health not in HEALTH_PATHS:
        known = ", ".join(map(repr, HEALTH_PATHS))
        ck.error(f"{where}.health", f"expected one of {known}, got {_show(health)}")
    if not argv:
        return None
    return ServerSpec(name=name, argv=tuple(argv), port=port, env=env,
                      startup_timeout=float(startup or 1200.0), stop_timeout=float(stop or 60.0),
                      health=str(health))


def _per_level(ck: _Checker, raw: Mapping[str, Any], name: str, levels: Sequence[int]) -> dict[int, float]:
    """A floor given once for every level, or per level as a table {"1" = 80.0, "16" = 600.0}."""
    where = "thresholds.perf"
    if name not in raw:
        return {}
    value = raw[name]
    if isinstance(value, dict):
        out = {}
        for key, floor in value.items():
            sub = f"{where}.{name}.{key}"
            if not key.isdigit() or int(key) not in levels:
                known = ", ".join(str(c) for c in levels)
                ck.error(sub, f"{key!r} is not a concurrency level of [perf] ({known})")
            elif isinstance(floor, bool) or not isinstance(floor, (int, float)) or floor <= 0:
                ck.error(sub, f"expected a positive number, got {_show(floor)}")
            else:
                out[int(key)] = float(floor)
        return out
    got = _number(ck, raw, where, name)
    return {} if got is None else dict.fromkeys(levels, float(got))


def parse_perf(perf: Mapping[str, Any], thresholds: Mapping[str, Any], path: str = "matrix.toml",
               base_dir: Path | None = None) -> PerfConfig | None:
    """Validate ``[perf]`` and ``[thresholds.perf]``; None when the matrix has no ``[perf]``.

    Raises ConfigError listing every problem with its key path. Environment variables are not looked at
    here (see resolve_argv), so that a matrix validates on a machine without the models.
    """
    if not perf:
        return None
    ck = _Checker()
    ck.keys(perf, "perf", _PERF_KEYS)
    servers: dict[str, ServerSpec] = {}
    raw_servers = ck.table(perf, "perf", "servers")
    for name, raw in raw_servers.items():
        if name not in SERVERS:
            close = difflib.get_close_matches(name, SERVERS, n=1, cutoff=0.5)
            hint = f"; perhaps you meant {close[0]!r}?" if close else ""
            ck.error(f"perf.servers.{name}",
                     f"unknown server; the suite compares {' and '.join(SERVERS)}{hint}")
            continue
        spec = _parse_server(ck, name, raw)
        if spec is not None:
            servers[name] = spec
    for name in SERVERS:
        if name not in raw_servers:
            ck.error(f"perf.servers.{name}", f"missing; the suite needs [perf.servers.{name}]")
    protocol = perf.get("protocol", "generate")
    if protocol not in PROTOCOLS:
        ck.error("perf.protocol", f"expected \"generate\" or \"openai\", got {_show(protocol)}")
    levels: list[int] = []
    raw_levels = perf.get("concurrency", [1, 16])
    if not isinstance(raw_levels, list) or not raw_levels:
        ck.error("perf.concurrency",
                 f"expected a non-empty array of positive integers, got {_show(raw_levels)}")
    else:
        for i, c in enumerate(raw_levels):
            if isinstance(c, bool) or not isinstance(c, int) or c < 1:
                ck.error(f"perf.concurrency[{i}]", f"expected a positive integer, got {_show(c)}")
            elif c in levels:
                ck.error(f"perf.concurrency[{i}]", f"{c} is listed twice")
            else:
                levels.append(c)
    trials = _number(ck, perf, "perf", "trials", integer=True)
    output_len = _number(ck, perf, "perf", "output-len", integer=True)
    warmup = _number(ck, perf, "perf", "warmup", integer=True, strict=False)
    requests = _number(ck, perf, "perf", "requests", integer=True)
    seed = _number(ck, perf, "perf", "seed", integer=True, strict=False)
    request_timeout = _number(ck, perf, "perf", "request-timeout")
    stall_timeout = _number(ck, perf, "perf", "stall-timeout")
    prompts = None
    prompts_name = ck.string(perf, "perf", "prompts")
    if prompts_name is not None:
        prompts = (base_dir or Path(path).parent) / prompts_name
        if not prompts.is_file():
            ck.error("perf.prompts", f"{prompts_name!r}: no such file (relative to the matrix file)")
    raw_thresholds = ck.table(thresholds, "thresholds", "perf")
    ck.keys(raw_thresholds, "thresholds.perf", _THRESHOLD_KEYS)
    min_speedup = _per_level(ck, raw_thresholds, "min-speedup", levels)
    if "min-speedup" not in raw_thresholds:
        min_speedup = dict.fromkeys(levels, 1.0)
    min_tok_s = _per_level(ck, raw_thresholds, "min-tok-s", levels)
    min_accept = _number(ck, raw_thresholds, "thresholds.perf", "min-accept-length")
    max_spread = _number(ck, raw_thresholds, "thresholds.perf", "max-spread")
    if ck.problems:
        raise ConfigError(path, ck.problems)
    return PerfConfig(
        path=path, servers=servers, protocol=str(protocol), concurrency=tuple(levels),
        trials=trials or 3, output_len=output_len or 256, warmup=2 if warmup is None else warmup,
        requests=requests, seed=seed or 0, prompts=prompts,
        request_timeout=float(request_timeout or 600.0), stall_timeout=float(stall_timeout or 60.0),
        thresholds=Thresholds(
            min_speedup=min_speedup, min_tok_s=min_tok_s,
            min_accept_length=float(min_accept) if min_accept is not None else None,
            max_spread=float(max_spread) if max_spread is not None else 0.10,
        ),
    )


def _expand(text: str, env: Mapping[str, str], where: str, problems: list[str]) -> str:
    def sub(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in env:
            problems.append(f"{where}: environment variable {name} is not set; export {name}=... "
                            "(e.g. the model's path) before running the perf suite")
            return match.group(0)
        return env[name]

    return _VAR.sub(sub, text)


def resolve_argv(config: PerfConfig, env: Mapping[str, str]) -> dict[str, tuple[list[str], dict[str, str]]]:
    """Substitute ``${VAR}`` from *env* in every server's argv and env, element by element (no shell).

    Returns {server: (argv with '{port}' still in it, extra environment)}; raises ConfigError naming every
    missing variable with its key path.
    """
    problems: list[str] = []
    out = {}
    for name, spec in config.servers.items():
        where = f"perf.servers.{name}"
        argv = [_expand(a, env, f"{where}.argv[{i}]", problems) for i, a in enumerate(spec.argv)]
        extra = {k: _expand(v, env, f"{where}.env.{k}", problems) for k, v in spec.env.items()}
        out[name] = (argv, extra)
    if problems:
        raise ConfigError(config.path, problems)
    return out


def load_prompts(path: Path | None = None) -> list[str]:
    """The fixed prompt set: ``{"prompts": [{"id": ..., "text": ...}, ...]}``; the shipped one by default."""
    shown = str(path) if path else "compatlab/data/prompts.json"
    try:
        if path is None:
            text = resources.files("compatlab").joinpath("data/prompts.json").read_text(encoding="utf-8")
        else:
            text = path.read_text(encoding="utf-8")
        data = json.loads(text)
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(shown, [f"cannot read the prompt set: {exc}"]) from None
    items = data.get("prompts") if isinstance(data, dict) else None
    if not isinstance(items, list) or not items:
        raise ConfigError(shown, ["prompts: expected a non-empty array of {id, text} tables"])
    problems = [f"prompts[{i}].text: expected a non-empty string" for i, p in enumerate(items)
                if not isinstance(p, dict) or not isinstance(p.get("text"), str) or not p["text"].strip()]
    if problems:
        raise ConfigError(shown, problems)
    return [str(p["text"]) for p in items]


# -- one server's life -------------------------------------------------------------------------------


class ServerFailure(LabError):
    """A server failed; *state* is how the stage reports it (fail: it died; error: it hung or timed out).

    Exiting is a fail because the stack could not serve; a timeout or stall is an error because the lab
    cannot tell a broken stack from a slow or busy box.
    """

    def __init__(self, state: str, message: str, tail: str = "") -> None:
        super().__init__(message)
        self.state = state
        self.tail = tail


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServerProcess:
    """A server in its own process group, its output in a log file; a context manager that always stops it.

    ``argv`` may hold ``{port}``; ``spec.port`` None picks a free loopback port.
    """

    def __init__(self, spec: ServerSpec, argv: list[str], env: dict[str, str], log_path: Path) -> None:
        self.spec = spec
        self.port = spec.port or _free_port()
        self.argv = [a.replace("{port}", str(self.port)) for a in argv]
        self.env = env
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self.returncode: int | None = None

    def __enter__(self) -> ServerProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("wb")
        log.info("$ %s", shlex.join(self.argv))
        try:
            self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=self._log,
                                         stderr=subprocess.STDOUT, env=self.env, start_new_session=True)
        except OSError as exc:
            self._log.close()
            raise ServerFailure("fail", f"{self.spec.name} server could not start: {exc}") from None
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def tail(self, lines: int = _LOG_TAIL) -> str:
        try:
            data = self.log_path.read_bytes()[-200 * lines:]
        except OSError:
            return ""
        return "\n".join(data.decode("utf-8", "replace").splitlines()[-lines:])

    def died(self, when: str) -> ServerFailure | None:
        """A failure if the process has exited."""
        assert self.proc is not None
        code = self.proc.poll()
        if code is None:
            return None
        self.returncode = code
        how = _describe_exit(code)
        return ServerFailure("fail", f"{self.spec.name} server exited with {how} {when}", self.tail())

    def wait_ready(self) -> dict[str, Any]:
        """Poll health, then the model info, until ``startup-timeout``; return the model info."""
        deadline = time.monotonic() + self.spec.startup_timeout
        pause = 0.02
        while True:
            failure = self.died("before it became healthy")
            if failure:
                raise failure
            left = deadline - time.monotonic()
            if left <= 0:
                raise ServerFailure("error", f"{self.spec.name} server did not become healthy within "
                                        f"{self.spec.startup_timeout:g} s ({self.spec.health} on port "
                                        f"{self.port})", self.tail())
            try:
                status, _ = get_json("127.0.0.1", self.port, self.spec.health, timeout=min(5.0, left))
                if status == 200:
                    for path in ("/get_model_info", "/model_info"):
                        status, info = get_json("127.0.0.1", self.port, path, timeout=min(5.0, left))
                        if status == 200 and isinstance(info, dict):
                            return info
            except (OSError, http.client.HTTPException):
                pass
            time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
            pause = min(pause * 1.5, 1.0)

    def server_accept_length(self) -> float | None:
        for path in ("/get_server_info", "/server_info"):
            try:
                status, info = get_json("127.0.0.1", self.port, path, timeout=10.0)
            except (OSError, http.client.HTTPException):
                return None
            if status == 200 and isinstance(info, dict):
                states = info.get("internal_states")
                state = states[0] if isinstance(states, list) and states else info
                value = state.get("avg_spec_accept_length") if isinstance(state, dict) else None
                return float(value) if isinstance(value, (int, float)) and value > 0 else None
        return None

    def _signal(self, sig: signal.Signals) -> None:
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)

    def stop(self) -> None:
        """SIGTERM the group, wait ``stop-timeout``, then SIGKILL whatever of the group is left."""
        if self.proc is None:
            return
        try:
            if self.proc.poll() is None:
                self._signal(signal.SIGTERM)
                try:
                    self.proc.wait(timeout=self.spec.stop_timeout)
                except subprocess.TimeoutExpired:
                    log.warning("%s server did not stop within %g s of SIGTERM; killing its process group",
                                self.spec.name, self.spec.stop_timeout)
            # Workers (tensor-parallel ranks) can outlive the leader: the group goes whole.
            self._signal(signal.SIGKILL)
            self.proc.wait(timeout=30)
            if self.returncode is None:
                self.returncode = self.proc.returncode
        finally:
            if self._log is not None:
                self._log.close()


# -- trials ------------------------------------------------------------------------------------------


def _level_record(level: LevelResult, server_accept: float | None) -> dict[str, Any]:
    accept, field = level.accept_length, FIELD_META
    if accept is None and server_accept is not None:
        accept, field = server_accept, FIELD_SERVER
    return {
        "concurrency": level.concurrency,
        "tok_s": level.tok_s,
        "s_per_token": 1 / level.tok_s if level.tok_s else None,
        "ttft_ms": level.ttft * 1000,
        "itl_ms": level.itl * 1000,
        "tokens": level.tokens,
        "requests": len(level.requests),
        "wall_s": level.wall,
        "accept_length": accept,
        "accept_length_field": field if accept is not None else None,
        "server_accept_length": server_accept,
        # prompt, tokens, ttft s, latency s, itl s, verify steps: one row per request
        "per_request": [[r.prompt, r.tokens, round(r.ttft, 6), round(r.latency, 6), round(r.itl, 7),
                         r.spec_verify_ct] for r in level.requests],
    }


def _life(config: PerfConfig, name: str, trial: int, *, argv: list[str], env: dict[str, str],
          prompts: list[str], order: list[int], out_dir: Path, record: dict[str, Any]) -> None:
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
            target = Target(port=server.port, protocol=config.protocol,  # type: ignore[arg-type]
                            model=str(info.get("model_path") or "default"))

            def measure(concurrency: int, requests: int) -> LevelResult:
                return run_level(target, prompts, concurrency=concurrency, requests=requests, order=order,
                                 output_len=config.output_len, seed=config.seed,
                                 timeout=config.request_timeout, idle=config.stall_timeout)

            if config.warmup:
                _check_level(server, measure(1, config.warmup), "during warm-up")
            for c in config.concurrency:
                level = measure(c, config.requests_at(c))
                _check_level(server, level, f"at concurrency {c}")
                record["levels"][str(c)] = _level_record(level, server.server_accept_length())
                log.info("%s trial %d c%d: %.1f tok/s, ttft %.1f ms", name, trial + 1, c, level.tok_s,
                         level.ttft * 1000)
    except ServerFailure as failure:
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
    raise ServerFailure("error", message, server.tail())


# -- verdicts ----------------------------------------------------------------------------------------


def _spread(values: Sequence[float]) -> float:
    mid = statistics.median(values)
    return (max(values) - min(values)) / mid if mid else 0.0


def _judge(lo: float, mid: float, hi: float, floor: float, noisy: bool) -> str:
    """pass/fail when the trials' whole range is on one side of the floor, or the noise is small."""
    if lo >= floor:
        return "pass"
    if hi < floor:
        return "fail"
    if noisy:
        return "inconclusive"
    return "pass" if mid >= floor else "fail"


def _verdicts(config: PerfConfig, lives: list[dict[str, Any]]) -> tuple[dict[str, float], dict[str, Any]]:
    figures: dict[str, float] = {}
    verdicts: dict[str, Any] = {}
    th = config.thresholds
    for c in config.concurrency:
        per: dict[str, dict[str, list[float]]] = {}
        for name in SERVERS:
            levels = [life["levels"][str(c)] for life in lives if life["server"] == name]
            per[name] = {k: [lv[k] for lv in levels if lv[k] is not None]
                         for k in ("tok_s", "ttft_ms", "itl_ms", "accept_length")}
            tok = per[name]["tok_s"]
            figures[f"{name}_tok_s_c{c}"] = statistics.median(tok)
            figures[f"{name}_ttft_ms_c{c}"] = statistics.median(per[name]["ttft_ms"])
            figures[f"{name}_itl_ms_c{c}"] = statistics.median(per[name]["itl_ms"])
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
            checks.append({"check": "min-speedup", "floor": floor, "value": speedup, "range": [lo, hi],
                           "verdict": _judge(lo, speedup, hi, floor, noisy)})
        floor = th.min_tok_s.get(c)
        if floor is not None:
            checks.append({"check": "min-tok-s", "floor": floor, "value": me, "range": [min(e), max(e)],
                           "verdict": _judge(min(e), me, max(e), floor, noisy)})
        if th.min_accept_length is not None:
            if accept:
                value = statistics.median(accept)
                verdict = _judge(min(accept), value, max(accept), th.min_accept_length, noisy)
                checks.append({"check": "min-accept-length", "floor": th.min_accept_length, "value": value,
                               "range": [min(accept), max(accept)], "verdict": verdict})
            else:
                checks.append({"check": "min-accept-length", "floor": th.min_accept_length, "value": None,
                               "verdict": "fail"})
        states = {ch["verdict"] for ch in checks}
        verdict = "fail" if "fail" in states else "inconclusive" if "inconclusive" in states else "pass"
        verdicts[str(c)] = {"verdict": verdict, "spread": spread, "noisy": noisy, "checks": checks}
    return figures, verdicts


def _explain(c: int, check: dict[str, Any], figures: Mapping[str, float], max_spread: float) -> str:
    b, e = figures[f"baseline_tok_s_c{c}"], figures[f"eagle3_tok_s_c{c}"]
    name, floor, value, verdict = check["check"], check["floor"], check["value"], check["verdict"]
    if verdict == "inconclusive":
        lo, hi = check["range"]
        return (f"inconclusive at concurrency {c}: the trials spread more than max-spread {max_spread:.0%} "
                f"and their range ({lo:.2f}-{hi:.2f}) straddles {name} {floor:g}; rerun on a quiet box")
    if name == "min-speedup":
        how = "slower than" if value < 1 else "not enough faster than"
        return (f"EAGLE-3 is {how} the baseline at concurrency {c}: {e:.1f} vs {b:.1f} tok/s "
                f"(speedup {value:.2f}, min-speedup {floor:g})")
    if name == "min-tok-s":
        return f"EAGLE-3 at concurrency {c}: {value:.1f} tok/s is below min-tok-s {floor:g}"
    if value is None:
        return "the eagle3 server reported no accept length; is speculative decoding on?"
    return f"EAGLE-3 accept length at concurrency {c}: {value:.2f} is below min-accept-length {floor:g}"


# -- the run ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(kw_only=True, slots=True)
class PerfReport:
    """What a perf run found; ``state`` is a StageResult state, ``verdict`` adds "inconclusive"."""

    state: str
    verdict: str
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
        trials = [{k: v for k, v in t.items() if k not in ("levels", "log_tail")}
                  | {"levels": {c: {k: v for k, v in lv.items() if k != "per_request"}
                                for c, lv in t.get("levels", {}).items()}}
                  for t in self.trials]
        tails = {f"{t['server']}-trial{t['trial']}": t.get("log_tail", "") for t in self.trials}
        details: dict[str, Any] = {
            "verdict": self.verdict, "figures": self.figures, "verdicts": self.verdicts, "trials": trials,
            "accept_length_field": self.accept_length_field, "logs": tails,
            "rerun": self.verdict == "inconclusive",
        }
        if self.out_dir is not None:
            details["outputs"] = {"perf": str(self.out_dir / "perf.json"),
                                  "benchmark": str(self.out_dir / "benchmark.json")}
        if self.log_tail:
            details["log_tail"] = self.log_tail
        return StageResult(name="perf", state=self.state, reason=self.reason, details=details,
                           seconds=self.seconds)


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
    report = PerfReport(state="error", verdict="error", reason="", out_dir=out_dir)
    try:
        for trial in range(config.trials):
            # ABBA: baseline first in even trials, EAGLE-3 first in odd ones, so drift cancels out.
            names = SERVERS if trial % 2 == 0 else SERVERS[::-1]
            for name in names:
                argv, extra = resolved[name]
                record: dict[str, Any] = {}
                lives.append(record)
                _life(config, name, trial, argv=argv, env={**base_env, **extra}, prompts=prompts, order=order,
                      out_dir=out_dir, record=record)
    except ServerFailure as failure:
        report.state, report.verdict, report.reason = failure.state, failure.state, str(failure)
        report.log_tail = failure.tail
    else:
        figures, verdicts = _verdicts(config, lives)
        report.figures, report.verdicts = figures, verdicts
        report.verdict = _overall(verdicts)
        report.state = {"pass": "pass", "fail": "fail", "inconclusive": "error"}[report.verdict]
        report.reason = _reason(config, figures, verdicts)
        fields = {lv["accept_length_field"] for life in lives if life["server"] == "eagle3"
                  for lv in life["levels"].values() if lv["accept_length_field"]}
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


def _overall(verdicts: Mapping[str, Any]) -> str:
    states = {v["verdict"] for v in verdicts.values()}
    return "fail" if "fail" in states else "inconclusive" if "inconclusive" in states else "pass"


def _reason(config: PerfConfig, figures: Mapping[str, float], verdicts: Mapping[str, Any]) -> str:
    for want in ("fail", "inconclusive"):
        for c in config.concurrency:
            for check in verdicts[str(c)]["checks"]:
                if check["verdict"] == want:
                    return _explain(c, check, figures, config.thresholds.max_spread)
    parts = [f"c{c}: {figures[f'eagle3_tok_s_c{c}']:.1f} vs {figures[f'baseline_tok_s_c{c}']:.1f} tok/s "
             f"({figures[f'speedup_c{c}']:.2f}x)" for c in config.concurrency]
    return "EAGLE-3 beats the baseline: " + ", ".join(parts)


# -- pytest-benchmark output -----------------------------------------------------------------------------


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
    return statistics.median(data[: n // 2]), statistics.median(data[n // 2:])


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
        "min": s[0], "max": s[-1], "mean": mean, "stddev": stddev, "rounds": len(s),
        "median": statistics.median(s), "iqr": iqr, "q1": q1, "q3": q3, "iqr_outliers": iqr_out,
        "stddev_outliers": std_out, "outliers": f"{std_out};{iqr_out}", "ld15iqr": inside[0],
        "hd15iqr": inside[-1], "ops": len(s) / total if total else 0, "total": total, "data": data,
        "iterations": 1,
    }


_METRICS = (
    # key in a level record, benchmark suffix, scale to seconds, what it is
    ("s_per_token", "s_per_token", 1.0, "seconds per output token = 1 / (output tok/s of all streams)"),
    ("ttft_ms", "ttft", 0.001, "median time to first token, seconds"),
    ("itl_ms", "itl", 0.001, "median inter-token latency, seconds"),
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
                benchmarks.append({
                    "group": f"perf c{c} {suffix}", "name": f"perf_{suffix}[{name}-c{c}]",
                    "fullname": f"compatlab.perf::perf_{suffix}[{name}-c{c}]",
                    "params": {"server": name, "concurrency": c}, "param": f"{name}-c{c}",
                    "extra_info": {"unit": what, "protocol": config.protocol,
                                   "output_len": config.output_len},
                    "options": {"disable_gc": False, "timer": "perf_counter", "min_rounds": config.trials,
                                "max_time": 0, "min_time": 0, "warmup": config.warmup > 0},
                    "stats": _stats(data),
                })
    uname = platform.uname()
    return {
        "machine_info": {
            "node": uname.node, "processor": uname.processor, "machine": uname.machine,
            "python_compiler": platform.python_compiler(),
            "python_implementation": platform.python_implementation(),
            "python_implementation_version": platform.python_version(),
            "python_version": platform.python_version(), "python_build": list(platform.python_build()),
            "release": uname.release, "system": uname.system, "cpu": {},
        },
        "commit_info": {"id": None, "time": None, "author_time": None, "dirty": None, "project": "compatlab",
                        "branch": None},
        "benchmarks": benchmarks,
        "datetime": datetime.now(UTC).isoformat(),
        "version": "5.0.0",
    }


# -- the stage and the command line ---------------------------------------------------------------------


def run_perf_stage(ctx: CellContext) -> StageResult:
    """The cell's ``perf`` stage: skipped with a reason when the matrix or the environment cannot run it."""
    start = time.monotonic()
    try:
        config = parse_perf(ctx.matrix.perf, ctx.matrix.thresholds, ctx.matrix.path)
    except ConfigError as exc:
        return StageResult(name="perf", state="error", reason=str(exc))
    if config is None:
        return StageResult(name="perf", state="skip", reason="skipped: matrix.toml has no [perf] section")
    env = cell_env(ctx.venv)
    try:
        report = run_perf(config, ctx.work_dir / "perf", env=env)
    except ConfigError as exc:
        # A missing ${VAR}: this machine has no model to serve, so the stage cannot run here.
        return StageResult(name="perf", state="skip", reason=f"skipped: {'; '.join(exc.problems)}",
                           seconds=time.monotonic() - start)
    except ProgramNotFound as exc:
        return StageResult(name="perf", state="skip", reason=f"skipped: {exc}",
                           seconds=time.monotonic() - start)
    return report.stage_result()


EXIT_CODES = {"pass": 0, "fail": 1, "error": 3, "inconclusive": 4}


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m compatlab.perf --matrix FILE --out DIR [--venv DIR]``.

    Exit status: 0 pass, 1 fail, 2 bad input (matrix, missing ${VAR}), 3 error (a server hung or a
    program is missing), 4 inconclusive (rerun on a quieter box).
    """
    from .matrix import load_matrix

    parser = argparse.ArgumentParser(prog="python -m compatlab.perf", description=__doc__.split("\n")[0])
    parser.add_argument("--matrix", default=os.environ.get("COMPATLAB_MATRIX", "matrix.toml"))
    parser.add_argument("--out", required=True, type=Path,
                        help="directory for perf.json, benchmark.json and the server logs")
    parser.add_argument("--venv", type=Path, default=None,
                        help="serve from this virtual environment (first on PATH, as in a cell)")
    parser.add_argument("--debug", action="store_true", help="tracebacks and debug logging")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.INFO, format="%(message)s",
                        stream=sys.stderr)
    try:
        matrix = load_matrix(args.matrix)
        config = parse_perf(matrix.perf, matrix.thresholds, matrix.path)
        if config is None:
            raise ConfigError(matrix.path,
                              ["perf: missing; add [perf.servers.baseline] and [perf.servers.eagle3]"])
        env = cell_env(args.venv) if args.venv else None
        report = run_perf(config, args.out, env=env)
    except LabError as exc:
        if args.debug:
            raise
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    for c in config.concurrency:
        v = report.verdicts.get(str(c), {})
        f = report.figures
        if v:
            accept = f.get(f"accept_length_c{c}")
            print(f"c{c}: baseline {f[f'baseline_tok_s_c{c}']:.1f} tok/s, "
                  f"eagle3 {f[f'eagle3_tok_s_c{c}']:.1f} tok/s, speedup {f[f'speedup_c{c}']:.2f}"
                  + (f", accept length {accept:.2f}" if accept else "") + f": {v['verdict']}")
    print(f"perf: {report.verdict}: {report.reason}")
    if report.log_tail:
        print("--- server log (tail) ---\n" + report.log_tail)
    print(f"results: {args.out / 'perf.json'}")
    return EXIT_CODES[report.verdict]


if __name__ == "__main__":
    raise SystemExit(main())
