"""Pins an existing environment should have: ``compatlab check --pin NAME==VERSION`` and ``--constraints FILE``."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from compatlab.errors import ConfigError, UsageError
from compatlab.urls import redact_text

__all__ = ["parse_pins"]


def parse_pins(pins: Sequence[str], constraints: Path | None = None) -> dict[str, str]:
    """``NAME==VERSION`` pins from the command line and a constraints file: {name: version}.

    A pin is what the pins stage compares against, so only exact pins are taken; anything else is a
    UsageError (ConfigError for a line of the file) that names the pin and the fix.
    """
    from packaging.requirements import InvalidRequirement, Requirement

    out: dict[str, str] = {}
    problems: list[str] = []

    def take(text: str, where: str) -> str | None:
        shown = redact_text(text)  # a direct URL's credentials (`pkg @ https://user:pass@host/pkg.whl`)
        try:
            req = Requirement(text)
        except InvalidRequirement as exc:
            why = redact_text(str(exc))
            return f"{where}: {shown!r} is not a requirement ({why}); expected NAME==VERSION, e.g. torch==2.9.1"
        specs = list(req.specifier)
        if req.url or len(specs) != 1 or specs[0].operator not in ("==", "===") or "*" in specs[0].version:
            return f"{where}: {shown!r} is not a pin; expected NAME==VERSION, e.g. {req.name}==2.9.1"
        out[req.name] = specs[0].version
        return None

    for pin in pins:
        problem = take(pin, "--pin")
        if problem:
            raise UsageError(problem)
    if constraints is not None:
        try:
            lines = constraints.read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise UsageError(f"--constraints {constraints}: cannot read it: {exc.strerror or exc}") from None
        for number, raw in enumerate(lines, 1):
            line = raw.split("#", 1)[0].strip()
            if not line or line.startswith("-"):
                continue  # empty, a comment, or a pip option (-c, --index-url): not a pin
            problem = take(line, f"line {number}")
            if problem:
                problems.append(problem)
        if problems:
            raise ConfigError(str(constraints), problems)
    return out
