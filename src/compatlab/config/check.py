"""The one problem collector every section of matrix.toml is validated with.

A problem is a key path and a message: ``axes.torch[2].index: expected a URL, got 42``. Paths join table
keys with ``.`` and array items with ``[i]``, the same way everywhere, so that the final sweep over the
raw document (``Checker.sweep``) can tell which values a section has already reported.

Values are checked for what TOML allows and the lab cannot use: a float that is NaN or infinite (a NaN
timeout never expires, a NaN spread compares false against every limit), an integer outside TOML's 64-bit
range (tomllib accepts any size), and control characters in strings and keys (a newline inside a version,
an index URL or an arch name; ``urllib`` silently drops tabs and newlines from URLs). Unicode's line and
paragraph separators count as control characters here: they break a line just the same.
"""

from __future__ import annotations

import dataclasses
import datetime
import difflib
import math
import unicodedata
from collections.abc import Collection, Mapping
from typing import Any
from urllib.parse import urlparse

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import InvalidVersion, Version

from compatlab.config import limits
from compatlab.errors import ConfigError
from compatlab.urls import redact, redact_text

__all__ = ["Checker", "control_character", "field_default", "join", "show", "type_name"]

INT64 = 2**63


def field_default(model: Any, name: str) -> Any:
    """A dataclass field's default as the model writes it, so that a default is written once."""
    field = next(f for f in dataclasses.fields(model) if f.name == name)
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return field.default


def join(key: str, name: str) -> str:
    """The path of *name* inside the table at *key* ('' is the document)."""
    return f"{key}.{name}" if key else name


def control_character(text: str) -> str | None:
    """The first control character of *text* (C0, DEL, C1, U+2028, U+2029), or None."""
    for ch in text:
        if unicodedata.category(ch) in ("Cc", "Zl", "Zp"):
            return ch
    return None


def _escape(text: str) -> str:
    """*text* with every control character written as an escape, so that a problem stays one line."""
    if control_character(text) is None:
        return text
    return "".join(ch.encode("unicode_escape").decode("ascii") if control_character(ch) else ch for ch in text)


def type_name(value: object) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a float"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array" if value else "an empty array"
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, datetime.datetime):
        return "a date-time"
    if isinstance(value, datetime.date):
        return "a date"
    if isinstance(value, datetime.time):
        return "a time"
    return type(value).__name__


def show(value: object) -> str:
    """A value as a message shows it: strings quoted (and escaped), numbers as written, others by type."""
    if isinstance(value, str):
        text = value if len(value) <= 80 else value[:77] + "..."
        return repr(text)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value) if not isinstance(value, int) or abs(value) < 10**30 else "a huge integer"
    return type_name(value)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class Checker:
    """Collects every problem of a file, so that one run shows them all; raised at once by ``raise_if_any``."""

    def __init__(self) -> None:
        self._found: list[tuple[str, str]] = []

    @property
    def problems(self) -> list[str]:
        return [_escape(f"{key}: {message}" if key else message) for key, message in self._found]

    def error(self, key: str, message: str) -> None:
        self._found.append((key, message))

    def raise_if_any(self, path: str) -> None:
        if self._found:
            raise ConfigError(path, self.problems)

    def reported(self, key: str) -> bool:
        """Whether *key*, or a table or array it is in, already has a problem."""
        return any(not seen or key == seen or key.startswith((seen + ".", seen + "[")) for seen, _ in self._found)

    def keys(self, table: Mapping[str, Any], key: str, allowed: Collection[str]) -> None:
        """Every key of *table* must be one of *allowed*; a near miss gets a suggestion."""
        for name in table:
            if name in allowed:
                continue
            close = difflib.get_close_matches(name, sorted(allowed), n=1, cutoff=0.6)
            if close:
                hint = f"; perhaps you meant {close[0]!r}?"
            else:
                hint = f"; allowed keys: {', '.join(sorted(allowed))}" if allowed else ""
            self.error(join(key, name), f"unknown key{hint}")

    def table(self, data: Mapping[str, Any], key: str, name: str) -> dict[str, Any]:
        value = data.get(name, {})
        if not isinstance(value, dict):
            self.error(join(key, name), f"expected a table, got {show(value)}")
            return {}
        return value

    def text(self, value: str, where: str) -> str | None:
        """*value* unless it holds a control character (then reported)."""
        ch = control_character(value)
        if ch is not None:
            self.error(
                where,
                f"{show(value)} contains the control character U+{ord(ch):04X}; remove it "
                "(values are one line, without control characters)",
            )
            return None
        return value

    def string(self, table: Mapping[str, Any], key: str, name: str, *, required: bool = False) -> str | None:
        where = join(key, name)
        if name not in table:
            if required:
                self.error(where, "missing; this key is required")
            return None
        value = table[name]
        if not isinstance(value, str):
            self.error(where, f"expected a string, got {show(value)}")
            return None
        if not value.strip():
            self.error(where, "must not be empty")
            return None
        return self.text(value, where)

    def number(
        self,
        table: Mapping[str, Any],
        key: str,
        name: str,
        *,
        integer: bool = False,
        minimum: float = 0,
        strict: bool = True,
        expected: str | None = None,
        limit: str | None = None,
    ) -> Any:
        """A TOML number (never a bool), finite, above (at or above unless *strict*) *minimum*, and a count
        within the bound of *limit* (a key of ``limits.LIMITS``) when one is named.

        None when absent or bad (then reported). *expected* replaces the generated "a positive integer".
        """
        if name not in table:
            return None
        return self.number_value(
            table[name],
            join(key, name),
            integer=integer,
            minimum=minimum,
            strict=strict,
            expected=expected,
            limit=limit,
        )

    def number_value(
        self,
        value: object,
        where: str,
        *,
        integer: bool = False,
        minimum: float = 0,
        strict: bool = True,
        expected: str | None = None,
        limit: str | None = None,
    ) -> Any:
        if expected is None:
            if integer:
                expected = "a positive integer" if strict and minimum == 0 else f"an integer >= {minimum:g}"
            else:
                expected = "a positive number" if strict and minimum == 0 else f"a number >= {minimum:g}"
        if isinstance(value, float) and not math.isfinite(value):
            self.error(where, f"expected a finite number, got {show(value)}")
            return None
        if isinstance(value, int) and not isinstance(value, bool) and not -INT64 <= value < INT64:
            self.error(where, f"expected {expected}, got an integer outside TOML's 64-bit range")
            return None
        kinds: tuple[type, ...] = (int,) if integer else (int, float)
        if isinstance(value, bool) or not isinstance(value, kinds):
            self.error(where, f"expected {expected}, got {show(value)}")
            return None
        assert isinstance(value, (int, float))
        if value < minimum or (strict and value == minimum):
            self.error(where, f"expected {expected}, got {show(value)}")
            return None
        if limit is not None and (problem := limits.over(limit, value)) is not None:
            self.error(where, problem)
            return None
        return value

    def url(self, value: object, where: str) -> str | None:
        if not isinstance(value, str):
            self.error(where, f"expected a URL, got {show(value)}")
            return None
        if self.text(value, where) is None:
            return None
        parsed = urlparse(value)
        if parsed.scheme not in ("http", "https", "file") or (parsed.scheme != "file" and not parsed.netloc):
            self.error(where, f"expected an http(s):// or file:// URL, got {redact(value)!r}")
            return None
        return value

    def version(self, value: object, where: str) -> str | None:
        if not isinstance(value, str):
            self.error(where, f"expected a version string, got {show(value)}")
            return None
        if self.text(value, where) is None:
            return None
        if value != value.strip():
            self.error(where, f"{value!r} has spaces around it; write {value.strip()!r}")
            return None
        try:
            Version(value)
        except InvalidVersion:
            self.error(where, f"{value!r} is not a valid PEP 440 version")
            return None
        return value

    def requirement(self, value: object, where: str) -> str | None:
        if not isinstance(value, str):
            self.error(where, f"expected a requirement string, got {show(value)}")
            return None
        if self.text(value, where) is None:
            return None
        try:
            Requirement(value)
        except InvalidRequirement as exc:
            self.error(where, f"{redact_text(value)!r} is not a valid requirement ({redact_text(str(exc))})")
            return None
        return value

    def str_list(self, table: Mapping[str, Any], key: str, name: str) -> list[str] | None:
        """A string or an array of strings; None when absent. Items are ``where[i]`` only in an array."""
        where = join(key, name)
        if name not in table:
            return None
        value = table[name]
        if isinstance(value, str):
            return [value] if self.text(value, where) is not None else []
        if not isinstance(value, list):
            self.error(where, f"expected a string or an array of strings, got {show(value)}")
            return None
        out = []
        for i, item in enumerate(value):
            if not isinstance(item, str):
                self.error(f"{where}[{i}]", f"expected a string, got {show(item)}")
            elif self.text(item, f"{where}[{i}]") is not None:
                out.append(item)
        return out

    def sweep(self, data: Mapping[str, Any]) -> None:
        """Every key and value of the raw document, for what no section may hold; skips what is reported.

        A safety net behind the sections' own checks: whatever a section reads or forgets, a NaN, a huge
        integer or a control character anywhere in the file is a problem.
        """
        stack: list[tuple[str, object]] = [("", data)]
        while stack:
            where, value = stack.pop()
            if isinstance(value, dict):
                items = list(value.items())
                for name, item in reversed(items):
                    sub = join(where, name)
                    ch = control_character(name)
                    if ch is not None:
                        if not self.reported(sub):
                            self.error(
                                sub, f"the key {name!r} contains the control character U+{ord(ch):04X}; rename it"
                            )
                        continue
                    stack.append((sub, item))
            elif isinstance(value, list):
                for i in reversed(range(len(value))):
                    stack.append((f"{where}[{i}]", value[i]))
            elif self.reported(where):
                continue
            elif isinstance(value, str):
                self.text(value, where)
            elif _is_number(value):
                self.number_value(value, where, minimum=-math.inf, expected="a number")
