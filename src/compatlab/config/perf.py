"""The EAGLE-3 throughput suite's configuration: ``[perf]`` and ``[thresholds.perf]``, ``${VAR}``, prompts.

Parsed into frozen models with every problem collected and named by its key path; environment variables
are only substituted when a run resolves its argv, so a matrix validates on a machine without the models.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import re
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from compatlab.config.matrix import _Checker, _show
from compatlab.errors import ConfigError

SERVERS = ("baseline", "eagle3")
PROTOCOLS = ("generate", "openai")
HEALTH_PATHS = ("/health_generate", "/health")
_PERF_KEYS = frozenset({"servers", "protocol", "concurrency", "trials", "output-len", "warmup", "requests",
                        "seed", "prompts", "request-timeout", "stall-timeout"})
_SERVER_KEYS = frozenset({"argv", "port", "env", "startup-timeout", "stop-timeout", "release-timeout",
                          "health"})
_THRESHOLD_KEYS = frozenset({"min-speedup", "min-tok-s", "min-accept-length", "max-spread"})
_VAR = re.compile(r"\$\{([^}]*)\}")
_VAR_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")



@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class ServerSpec:
    """One engine run; ``argv`` and ``env`` values may hold ``${VAR}``, argv ``{port}``."""

    name: str
    argv: tuple[str, ...]
    port: int | None = None  # None: a free loopback port is picked per start
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    startup_timeout: float = 1200.0
    stop_timeout: float = 60.0
    release_timeout: float = 120.0  # after SIGKILL: until the whole group is gone and the port is free
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
        """Requests per level: ``requests`` (at least one per slot), or four waves (4 x concurrency), at least 8.

        Fewer waves at concurrency 16 leave the level's figures to the ramp-up and the tail.
        """
        if self.requests is not None:
            return max(self.requests, concurrency)
        return max(8, 4 * concurrency)


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
    release = _number(ck, raw, where, "release-timeout")
    health = raw.get("health", "/health_generate")
    if health not in HEALTH_PATHS:
        known = ", ".join(map(repr, HEALTH_PATHS))
        ck.error(f"{where}.health", f"expected one of {known}, got {_show(health)}")
    if not argv:
        return None
    return ServerSpec(name=name, argv=tuple(argv), port=port, env=env,
                      startup_timeout=float(startup or 1200.0), stop_timeout=float(stop or 60.0),
                      release_timeout=float(release or 120.0), health=str(health))


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
