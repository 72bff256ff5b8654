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
from typing import Any, ClassVar, Literal

from compatlab.config import limits
from compatlab.config.check import Checker, field_default, show
from compatlab.errors import ConfigError

__all__ = [
    "HEALTH_PATHS",
    "PROTOCOLS",
    "SERVERS",
    "PerfConfig",
    "PerfThresholds",
    "Protocol",
    "ServerSpec",
    "load_prompts",
    "parse_perf",
    "parse_perf_section",
    "parse_perf_thresholds",
    "resolve_argv",
]

SERVERS = ("baseline", "eagle3")
Protocol = Literal["generate", "openai"]  # SGLang's native /generate, or its OpenAI routes
PROTOCOLS: tuple[Protocol, ...] = ("generate", "openai")
HEALTH_PATHS = ("/health_generate", "/health")
_PERF_KEYS = frozenset(
    {
        "servers",
        "protocol",
        "concurrency",
        "trials",
        "output-len",
        "warmup",
        "requests",
        "seed",
        "prompts",
        "request-timeout",
        "stall-timeout",
    }
)
_SERVER_KEYS = frozenset({"argv", "port", "env", "startup-timeout", "stop-timeout", "release-timeout", "health"})
_THRESHOLD_KEYS = frozenset({"min-speedup", "min-tok-s", "min-accept-length", "max-spread"})
_VAR = re.compile(r"\$\{([^}]*)\}")
_VAR_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_LEVEL = re.compile(r"[0-9]+")


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
class PerfThresholds:
    """``[thresholds.perf]``: floors per concurrency level (missing: not checked) and the noise limit."""

    DEFAULT_MIN_SPEEDUP: ClassVar[float] = 1.0  # at every level not given: EAGLE-3 must not be slower

    min_speedup: Mapping[int, float]
    min_tok_s: Mapping[int, float] = dataclasses.field(default_factory=dict)
    min_accept_length: float | None = None
    max_spread: float = 0.10


# The name the perf stage has always used.
Thresholds = PerfThresholds


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class PerfConfig:
    path: str
    servers: Mapping[str, ServerSpec]
    thresholds: PerfThresholds
    protocol: Protocol = "generate"
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


def _strings_with_vars(ck: Checker, value: str, where: str) -> None:
    for match in _VAR.finditer(value):
        if not _VAR_NAME.fullmatch(match.group(1)):
            ck.error(
                where,
                f"{match.group(0)!r} is not a variable reference; write ${{NAME}} with a name "
                "of letters, digits and '_'",
            )


def _parse_server(ck: Checker, name: str, raw: object) -> ServerSpec | None:
    where = f"perf.servers.{name}"
    if not isinstance(raw, dict):
        ck.error(where, f"expected a table ([{where}]), got {show(raw)}")
        return None
    ck.keys(raw, where, _SERVER_KEYS)
    argv: list[str] = []
    if "argv" not in raw:
        ck.error(
            f"{where}.argv",
            'missing; give the command as a list, e.g. ["python", "-m", "sglang.launch_server", "--port", "{port}"]',
        )
    elif not isinstance(raw["argv"], list):
        ck.error(f"{where}.argv", f"expected an array of strings (never a shell string), got {show(raw['argv'])}")
    elif not raw["argv"]:
        ck.error(f"{where}.argv", "must not be empty")
    else:
        for i, item in enumerate(raw["argv"]):
            if not isinstance(item, str):
                ck.error(f"{where}.argv[{i}]", f"expected a string, got {show(item)}")
            elif ck.text(item, f"{where}.argv[{i}]") is not None:
                _strings_with_vars(ck, item, f"{where}.argv[{i}]")
                argv.append(item)
    fields: dict[str, Any] = {}
    if "port" in raw:
        p = raw["port"]
        if isinstance(p, bool) or not isinstance(p, int) or not 1 <= p <= 65535:
            ck.error(f"{where}.port", f"expected a port number 1-65535, got {show(p)}")
        else:
            fields["port"] = p
    if argv and "port" not in fields and not any("{port}" in a for a in argv):
        ck.error(f"{where}.argv", 'has no \'{port}\' and no port is set; add "--port", "{port}" or set port')
    env: dict[str, str] = {}
    for key, value in ck.table(raw, where, "env").items():
        if not _VAR_NAME.fullmatch(key):
            ck.error(f"{where}.env.{key}", "expected an environment variable name like CUDA_VISIBLE_DEVICES")
        elif not isinstance(value, str):
            ck.error(f"{where}.env.{key}", f"expected a string, got {show(value)}")
        elif ck.text(value, f"{where}.env.{key}") is not None:
            _strings_with_vars(ck, value, f"{where}.env.{key}")
            env[key] = value
    for key, field in (
        ("startup-timeout", "startup_timeout"),
        ("stop-timeout", "stop_timeout"),
        ("release-timeout", "release_timeout"),
    ):
        got = ck.number(raw, where, key)
        if got is not None:
            fields[field] = float(got)
    if "health" in raw:
        health = raw["health"]
        if health not in HEALTH_PATHS:
            known = ", ".join(map(repr, HEALTH_PATHS))
            ck.error(f"{where}.health", f"expected one of {known}, got {show(health)}")
        else:
            fields["health"] = health
    if not argv:
        return None
    return ServerSpec(name=name, argv=tuple(argv), env=env, **fields)


def _per_level(
    ck: Checker, raw: Mapping[str, Any], name: str, levels: Sequence[int], levels_known: bool = True
) -> dict[int, float]:
    """A floor given once for every level, or per level as a table {"1" = 80.0, "16" = 600.0}.

    Levels are checked against *levels* only when they are known (``[perf] concurrency`` had no problem).
    """
    where = "thresholds.perf"
    if name not in raw:
        return {}
    value = raw[name]
    if isinstance(value, dict):
        out = {}
        for key, floor in value.items():
            sub = f"{where}.{name}.{key}"
            if not _LEVEL.fullmatch(key) or (levels_known and int(key) not in levels):
                known = ", ".join(str(c) for c in levels)
                ck.error(sub, f"{key!r} is not a concurrency level of [perf] ({known})")
                continue
            got = ck.number_value(floor, sub)
            if got is not None:
                out[int(key)] = float(got)
        return out
    got = ck.number(raw, where, name)
    return {} if got is None else dict.fromkeys(levels, float(got))


def parse_perf_thresholds(
    ck: Checker, thresholds: Mapping[str, Any], levels: Sequence[int], levels_known: bool = True
) -> PerfThresholds:
    """Validate ``[thresholds.perf]`` (inside the raw ``[thresholds]``) for the concurrency *levels*."""
    raw = ck.table(thresholds, "thresholds", "perf")
    ck.keys(raw, "thresholds.perf", _THRESHOLD_KEYS)
    if "min-speedup" in raw:
        min_speedup = _per_level(ck, raw, "min-speedup", levels, levels_known)
    else:
        min_speedup = dict.fromkeys(levels, PerfThresholds.DEFAULT_MIN_SPEEDUP)
    fields: dict[str, Any] = {"min_tok_s": _per_level(ck, raw, "min-tok-s", levels, levels_known)}
    for key, field in (("min-accept-length", "min_accept_length"), ("max-spread", "max_spread")):
        got = ck.number(raw, "thresholds.perf", key)
        if got is not None:
            fields[field] = float(got)
    return PerfThresholds(min_speedup=min_speedup, **fields)


def parse_perf_section(
    ck: Checker, perf: Mapping[str, Any], thresholds: Mapping[str, Any], path: str, base_dir: Path
) -> PerfConfig | None:
    """Validate ``[perf]`` and ``[thresholds.perf]`` into *ck*; None when there is no ``[perf]``.

    Environment variables are not looked at here (see resolve_argv), so that a matrix validates on a
    machine without the models.
    """
    if not perf:
        return None
    ck.keys(perf, "perf", _PERF_KEYS)
    servers: dict[str, ServerSpec] = {}
    raw_servers = ck.table(perf, "perf", "servers")
    for name, raw in raw_servers.items():
        if name not in SERVERS:
            close = difflib.get_close_matches(name, SERVERS, n=1, cutoff=0.5)
            hint = f"; perhaps you meant {close[0]!r}?" if close else ""
            ck.error(f"perf.servers.{name}", f"unknown server; the suite compares {' and '.join(SERVERS)}{hint}")
            continue
        spec = _parse_server(ck, name, raw)
        if spec is not None:
            servers[name] = spec
    for name in SERVERS:
        if name not in raw_servers:
            ck.error(f"perf.servers.{name}", f"missing; the suite needs [perf.servers.{name}]")
    fields: dict[str, Any] = {}
    if "protocol" in perf:
        if perf["protocol"] not in PROTOCOLS:
            ck.error("perf.protocol", f'expected "generate" or "openai", got {show(perf["protocol"])}')
        else:
            fields["protocol"] = perf["protocol"]
    levels: list[int] = []
    levels_known = True
    raw_levels = perf.get("concurrency", list(field_default(PerfConfig, "concurrency")))
    if not isinstance(raw_levels, list) or not raw_levels:
        ck.error("perf.concurrency", f"expected a non-empty array of positive integers, got {show(raw_levels)}")
        levels_known = False
    else:
        for i, c in enumerate(raw_levels):
            got = ck.number_value(c, f"perf.concurrency[{i}]", integer=True, limit="perf.concurrency")
            if got is None:
                continue
            if got in levels:
                ck.error(f"perf.concurrency[{i}]", f"{got} is listed twice")
            else:
                levels.append(got)
    fields["concurrency"] = tuple(levels)
    for key, field, strict in (
        ("trials", "trials", True),
        ("output-len", "output_len", True),
        ("warmup", "warmup", False),
        ("requests", "requests", True),
        ("seed", "seed", False),
    ):
        bound = f"perf.{key}" if f"perf.{key}" in limits.LIMITS else None
        got = ck.number(perf, "perf", key, integer=True, strict=strict, limit=bound)
        if got is not None:
            fields[field] = got
    for key, field in (("request-timeout", "request_timeout"), ("stall-timeout", "stall_timeout")):
        got = ck.number(perf, "perf", key)
        if got is not None:
            fields[field] = float(got)
    prompts_name = ck.string(perf, "perf", "prompts")
    if prompts_name is not None:
        prompts = base_dir / prompts_name
        if not prompts.is_file():
            ck.error("perf.prompts", f"{prompts_name!r}: no such file (relative to the matrix file)")
        fields["prompts"] = prompts
    return PerfConfig(
        path=path, servers=servers, thresholds=parse_perf_thresholds(ck, thresholds, levels, levels_known), **fields
    )


def parse_perf(
    perf: Mapping[str, Any], thresholds: Mapping[str, Any], path: str = "matrix.toml", base_dir: Path | None = None
) -> PerfConfig | None:
    """Validate ``[perf]`` and ``[thresholds.perf]`` on their own; None when there is no ``[perf]``.

    A matrix does this at load (``Matrix.perf``); this is the same for the two raw tables, raising
    ConfigError listing every problem with its key path.
    """
    ck = Checker()
    config = parse_perf_section(ck, perf, thresholds, path, base_dir or Path(path).parent)
    ck.raise_if_any(path)
    return config


def _expand(text: str, env: Mapping[str, str], where: str, problems: list[str]) -> str:
    def sub(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in env:
            problems.append(
                f"{where}: environment variable {name} is not set; export {name}=... "
                "(e.g. the model's path) before running the perf suite"
            )
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
    except RecursionError:
        raise ConfigError(shown, ["cannot read the prompt set: arrays or objects nested too deeply"]) from None
    items = data.get("prompts") if isinstance(data, dict) else None
    if not isinstance(items, list) or not items:
        raise ConfigError(shown, ["prompts: expected a non-empty array of {id, text} tables"])
    if (too_many := limits.over("perf.prompts", len(items))) is not None:
        raise ConfigError(shown, [f"prompts: {too_many}"])
    problems = [
        f"prompts[{i}].text: expected a non-empty string"
        for i, p in enumerate(items)
        if not isinstance(p, dict) or not isinstance(p.get("text"), str) or not p["text"].strip()
    ]
    if problems:
        raise ConfigError(shown, problems)
    return [str(p["text"]) for p in items]
