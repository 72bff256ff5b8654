"""The serve stage's configuration: ``[serve]`` in matrix.toml.

The stage starts the cell's own SGLang (``python -m sglang.launch_server --load-format dummy``) on a model
made from the target's architecture: a real ``config.json`` (the model the box serves), shrunk to a few
layers with every width, head count, expert count and quantisation kept, so that the real kernels run at
real shapes without a download. Without ``[serve]`` a small built-in Llama and its EAGLE-3 draft are used,
so a matrix serves out of the box. Paths are relative to the matrix file; nothing is read at load but the
keys: a matrix validates on a machine without the models, and the stage names a missing file.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from compatlab.config.check import Checker
from compatlab.errors import ConfigError, UsageError

__all__ = ["LAB_FLAGS", "ServeConfig", "lab_flag", "load_serve", "parse_serve_section"]

_KEYS = frozenset(
    {
        "model",
        "layers",
        "tokenizer",
        "draft",
        "draft-layers",
        "tp",
        "output-len",
        "concurrency",
        "requests",
        "startup-timeout",
        "request-timeout",
        "args",
        "eagle3-args",
        "eagle3",
    }
)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class ServeConfig:
    """What the serve stage serves and how. ``model``/``draft``/``tokenizer`` None: built in or generated."""

    model: Path | None = None  # a config.json, or a folder holding one
    layers: int = 2
    tokenizer: Path | None = None  # a folder of tokenizer files; None: a word-level one of the vocab size
    draft: Path | None = None  # the EAGLE-3 draft's config.json; None: one layer derived from the target
    draft_layers: int = 1
    tp: int | None = None  # None: the target's gpus (or what this machine has, said so)
    output_len: int = 64
    concurrency: tuple[int, ...] = (1, 8)
    requests: int = 2  # requests per stream at each concurrency level
    startup_timeout: float = 900.0
    request_timeout: float = 300.0
    args: tuple[str, ...] = ()  # extra launch_server arguments for both servers
    eagle3_args: tuple[str, ...] = (
        "--speculative-num-steps",
        "3",
        "--speculative-eagle-topk",
        "1",
        "--speculative-num-draft-tokens",
        "4",
    )
    eagle3: bool = True  # False: the baseline server only

    def tp_size(self, target_gpus: Iterable[int]) -> int:
        """The tensor-parallel size served with: ``tp``, else the largest target's GPU count (1 without one)."""
        return self.tp or max(target_gpus, default=1)


# The flags the serve stage sets itself when it launches ``sglang.launch_server`` (stages/serve/stage.py: _argv),
# with what it sets them to. ``args`` (both servers) and ``eagle3-args`` may not give them again: argparse takes
# the last one given, so ``--host 0.0.0.0`` would serve on every interface and ``--load-format auto`` fetch real
# weights. SGLang's own aliases count too, and so does any abbreviation argparse would expand to one of them.
LAB_FLAGS: Mapping[str, str] = {
    "--model-path": "the target's model, shrunk: [serve] model",
    "--load-format": "dummy",
    "--host": "127.0.0.1",
    "--port": "a free loopback port",
    "--tp-size": "[serve] tp, else the target's GPUs",
    "--speculative-algorithm": "EAGLE3, on the eagle3 server only",
    "--speculative-draft-model-path": "the EAGLE-3 draft: [serve] draft",
}
_ALIASES = {
    "--model": "--model-path",
    "--tensor-parallel-size": "--tp-size",
    "--speculative-draft-model": "--speculative-draft-model-path",
}


def lab_flag(arg: str) -> str | None:
    """The lab's flag that *arg* (``--flag``, ``--flag=value``) would set, or None."""
    if not arg.startswith("--") or len(arg) < 3:
        return None
    name = arg.split("=", 1)[0]
    if name in LAB_FLAGS:
        return name
    if name in _ALIASES:
        return _ALIASES[name]
    # argparse's abbreviations (allow_abbrev): a prefix of the lab's flags that names one of them only.
    matches = {_ALIASES.get(flag, flag) for flag in (*LAB_FLAGS, *_ALIASES) if flag.startswith(name)}
    return matches.pop() if len(matches) == 1 and len(name) >= len("--xx") else None


def _launch_args(ck: Checker, serve: Mapping[str, Any], key: str) -> tuple[str, ...] | None:
    argv = ck.str_list(serve, "serve", key)
    if argv is None:
        return None
    for i, arg in enumerate(argv):
        flag = lab_flag(arg)
        if flag is not None:
            given = arg.split("=", 1)[0]
            said = given if given == flag else f"{given} ({flag})"
            where = f"serve.{key}[{i}]" if isinstance(serve[key], list) else f"serve.{key}"
            ck.error(where, f"{said} is set by the lab ({LAB_FLAGS[flag]}); remove it")
    return tuple(argv)


def _path(ck: Checker, table: Mapping[str, Any], name: str, base_dir: Path) -> Path | None:
    text = ck.string(table, "serve", name)
    if text is None:
        return None
    path = Path(text).expanduser()
    return path if path.is_absolute() else base_dir / path


def parse_serve_section(ck: Checker, serve: Mapping[str, Any], base_dir: Path) -> ServeConfig:
    """Validate ``[serve]`` into *ck*; the defaults (the built-in model) when the table is absent."""
    ck.keys(serve, "serve", _KEYS)
    fields: dict[str, Any] = {}
    for key in ("model", "tokenizer", "draft"):
        got = _path(ck, serve, key, base_dir)
        if got is not None:
            fields[key] = got
    for key, field in (
        ("layers", "layers"),
        ("draft-layers", "draft_layers"),
        ("tp", "tp"),
        ("output-len", "output_len"),
        ("requests", "requests"),
    ):
        got = ck.number(serve, "serve", key, integer=True, limit=f"serve.{key}")
        if got is not None:
            fields[field] = got
    for key, field in (("startup-timeout", "startup_timeout"), ("request-timeout", "request_timeout")):
        got = ck.number(serve, "serve", key)
        if got is not None:
            fields[field] = float(got)
    if "concurrency" in serve:
        raw = serve["concurrency"]
        if not isinstance(raw, list) or not raw:
            ck.error("serve.concurrency", f"expected a non-empty array of positive integers, got {raw!r}")
        else:
            levels = [
                ck.number_value(c, f"serve.concurrency[{i}]", integer=True, limit="serve.concurrency")
                for i, c in enumerate(raw)
            ]
            fields["concurrency"] = tuple(dict.fromkeys(c for c in levels if c is not None))
    for key, field in (("args", "args"), ("eagle3-args", "eagle3_args")):
        argv = _launch_args(ck, serve, key)
        if argv is not None:
            fields[field] = argv
    if "eagle3" in serve:
        if isinstance(serve["eagle3"], bool):
            fields["eagle3"] = serve["eagle3"]
        else:
            ck.error("serve.eagle3", f"expected true or false, got {serve['eagle3']!r}")
    return ServeConfig(**fields)


def load_serve(path: Path) -> ServeConfig:
    """The ``[serve]`` table of a TOML file (a matrix.toml will do): what ``check --serve-from`` serves."""
    import tomllib

    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--serve-from {path}: cannot read it: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(str(path), [f"invalid TOML: {exc}"]) from None
    ck = Checker()
    config = parse_serve_section(ck, ck.table(data, "", "serve"), path.resolve().parent)
    ck.raise_if_any(str(path))
    return config
