"""Exceptions with exit codes; only the entry points turn them into messages."""

from __future__ import annotations

import errno

__all__ = ["UNWRITABLE", "ConfigError", "LabError", "Unwritable", "UsageError", "lab_error"]

# What a folder the lab must write answers when it cannot be written: read-only, no permission, full.
UNWRITABLE = frozenset({errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EDQUOT, errno.ENOTDIR})


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


class Unwritable(LabError):
    """A file or folder the lab must write cannot be: ``cannot write PATH: why``, then the fix, in one line."""

    def __init__(self, path: object, why: str, fix: str = "") -> None:
        self.path, self.why, self.fix = path, why, fix
        super().__init__(f"cannot write {path}: {why}" + (f"; {fix}" if fix else ""))

    def fixed(self, fix: str) -> Unwritable:
        """The same error with *fix* said after it (the first fix said stays)."""
        return self if self.fix else Unwritable(self.path, self.why, fix)


def lab_error(exc: BaseException) -> str:
    """The reason of a stage the lab itself broke: a LabError in its own words, anything else as its repr."""
    return f"lab error: {exc if isinstance(exc, LabError) else repr(exc)}"
