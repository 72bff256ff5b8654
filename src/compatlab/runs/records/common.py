"""What every stage's details may hold at the top: its ``failures`` and ``warnings`` (one line each), and the
readers the stage records share: a JSON value coerced to the type a record holds, an odd one to its empty value
(a stored result of an older lab is read, never refused here; ``StageResult.from_json`` checked its shape).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from compatlab.runs.model import StageResult

__all__ = ["Notes", "number", "table", "tables", "text", "texts"]


def texts(value: object) -> tuple[str, ...]:
    """A list of strings (each item as its string), () for anything else."""
    return tuple(str(v) for v in value) if isinstance(value, list | tuple) else ()


def text(value: object) -> str | None:
    """A string, None for anything else (an absent key)."""
    return value if isinstance(value, str) else None


def number(value: object) -> float | None:
    """A finite int or float (kept as it is), None for anything else: a bool is not a number."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value if math.isfinite(value) else None


def table(value: object) -> dict[str, Any]:
    """A JSON table, {} for anything else."""
    return {str(k): v for k, v in value.items()} if isinstance(value, Mapping) else {}


def tables(value: object) -> tuple[dict[str, Any], ...]:
    """The tables of a list, anything else in it left out."""
    return tuple(table(v) for v in value if isinstance(v, Mapping)) if isinstance(value, list | tuple) else ()


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Notes:
    """The one-line failures and warnings a stage lists in its details (pins, the suites), () where none."""

    failures: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()

    @classmethod
    def of(cls, result: StageResult) -> Notes:
        return cls(failures=texts(result.details.get("failures")), warnings=texts(result.details.get("warnings")))
