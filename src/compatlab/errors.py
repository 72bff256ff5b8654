"""Exceptions with exit codes; only the entry points turn them into messages."""

from __future__ import annotations

__all__ = ["ConfigError", "LabError", "UsageError"]


class LabError(Exception):
    """Base of every error the lab reports to a user; carries the exit code."""

    exit_code = 1


class ConfigError(LabError):
    """matrix.toml (or another input file) is invalid; the message lists every problem."""

    exit_code = 2

    def __init__(self, path: str, problems: list[str]) -> None:
        self.path = path
        self.problems = list(problems)
        lines = [f"{path}: {p}" for p in self.problems]
        if len(lines) == 1:
            super().__init__(lines[0])
        else:
            super().__init__(f"{len(lines)} problems in {path}:\n" + "\n".join(f"  {line}" for line in lines))


class UsageError(LabError):
    """A command line that cannot be honoured."""

    exit_code = 2
