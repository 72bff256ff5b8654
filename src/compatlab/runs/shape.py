"""The strict reading of a result's JSON: one table at a time against its known keys and their types.

``from_json`` of every result (runs/model.py, runs/info.py) reads through ``Shape``: every key is known
(an unknown one is named with the nearest known key, ``perhaps you meant 'stages'?``), every required key is
there, values are of their type, numbers are finite, a state is one of its enum's values. Problems are
collected, not raised at the first: a bad shape raises ShapeError with every problem at once, each with its
key path (``stages[1].state: expected one of pass, warn, fail, error, skip, got 'ok'``). A value found is
shown by its repr cut to 60 characters, a table or a list by its kind, None as ``null``.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["Shape", "ShapeError", "show", "whole"]

_T = TypeVar("_T")


class ShapeError(ValueError):
    """A JSON value that is not the shape of a result; ``problems`` are key paths with what is wrong."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("; ".join(self.problems))


class Shape:
    """Reads one JSON table against its known keys, collecting problems instead of stopping at the first."""

    def __init__(
        self,
        data: object,
        where: str,
        problems: list[str],
        *,
        required: tuple[str, ...],
        optional: tuple[str, ...],
        what: str = "a table",
    ) -> None:
        self.where, self.problems = where, problems
        self.ok = isinstance(data, dict)
        self.data: dict[str, Any] = data if isinstance(data, dict) else {}
        if not self.ok:
            self.say("", f"expected {what}, got {show(data)}")
            return
        for key in required:
            if key not in self.data:
                self.say("", f"missing key {key!r}")
        known = required + optional
        for key in self.data:
            if key not in known:
                near = difflib.get_close_matches(str(key), known, n=1)
                self.say("", f"unknown key {key!r}" + (f"; perhaps you meant {near[0]!r}?" if near else ""))

    def path(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def say(self, key: str, message: str) -> None:
        where = self.path(key) if key else self.where
        self.problems.append(f"{where}: {message}" if where else message)

    def has(self, key: str) -> bool:
        return key in self.data

    def text(self, key: str, default: str = "") -> str:
        value = self.data.get(key, default)
        if isinstance(value, str):
            return value
        self.say(key, f"expected a string, got {show(value)}")
        return default

    def flag(self, key: str, default: bool) -> bool:
        value = self.data.get(key, default)
        if isinstance(value, bool):
            return value
        self.say(key, f"expected true or false, got {show(value)}")
        return default

    def number(self, key: str, default: float = 0.0) -> float:
        value = self.data.get(key, default)
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            return float(value)
        self.say(key, f"expected a finite number, got {show(value)}")
        return default

    def integer(self, key: str, default: int, *, minimum: int = 0) -> int:
        value = self.data.get(key, default)
        if isinstance(value, int) and not isinstance(value, bool) and value >= minimum:
            return value
        self.say(key, f"expected a whole number >= {minimum}, got {show(value)}")
        return default

    def choice(self, key: str, choices: tuple[str, ...]) -> str:
        value = self.data.get(key)
        if isinstance(value, str) and value in choices:
            return value
        if key in self.data:
            self.say(key, f"expected one of {', '.join(choices)}, got {show(value)}")
        return choices[0]

    def table(self, key: str) -> dict[str, Any]:
        value = self.data.get(key, {})
        if isinstance(value, dict) and all(isinstance(k, str) for k in value):
            return dict(value)
        self.say(key, f"expected a table, got {show(value)}")
        return {}

    def strings(self, key: str) -> list[str]:
        value = self.data.get(key, [])
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return list(value)
        self.say(key, f"expected a list of strings, got {show(value)}")
        return []

    def string_table(self, key: str) -> dict[str, str]:
        value = self.data.get(key, {})
        if isinstance(value, dict) and all(isinstance(v, str) for v in value.values()):
            return dict(value)
        self.say(key, f"expected a table of strings, got {show(value)}")
        return {}


def whole(read: Callable[[object, str, list[str]], _T | None], data: object, where: str) -> _T:
    """What *read* makes of *data*, or ShapeError with every problem it found."""
    problems: list[str] = []
    value = read(data, where, problems)
    if problems or value is None:
        raise ShapeError(problems)
    return value


def show(value: object) -> str:
    """A found value for a message: its repr, cut short; containers by kind."""
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "a list"
    if value is None:
        return "null"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
