"""One module the import stage loaded (or could not): an entry of the stage's ``modules`` list.

The import suite builds entries in the cell and the lab reads them back (the stage's details in a cell's
result; the per-package table, the pins it blames, the libraries loaded by path), so both sides use this
class: frozen (``dataclasses.replace`` makes a changed copy), written with ``to_json`` and read with
``from_json``, which refuses a key it does not know. Standard library only, Python 3.10 and later.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

__all__ = ["EntryError", "ImportEntry"]

_KEYS = (
    "module",
    "dist",
    "ok",
    "seconds",
    "loaded",
    "failure",
    "reason",
    "mapped",
    "alone",
    "needed",
    "needed_why",
    "verdict",
    "failed_loads",
    "cause",
    "preloaded",
)


class EntryError(ValueError):
    """A ``modules`` entry that is not the shape this module writes."""


@dataclasses.dataclass(frozen=True)
class ImportEntry:
    """``module`` is a shared object's label (``pkg/_ops.so``) or a package (``pkg``); ``ok`` whether it
    loaded. A failure carries ``failure`` (loading.failure.LoadFailure's JSON: its kind, symbol, library …) and
    ``reason`` (one line). ``loaded`` says how a module loaded when not the plain way (by name, or by its
    package's import, which ``mapped`` it: then ``alone`` is how it failed by itself). ``needed`` is False
    for a failed module its package's import does not need (``verdict`` says why); ``needed_why`` says why
    one stays needed."""

    module: str
    dist: str
    ok: bool
    seconds: float = 0.0
    loaded: str | None = None
    failure: Mapping[str, Any] | None = None
    reason: str | None = None
    mapped: tuple[str, ...] | None = None  # a package import: its distribution's shared objects it mapped
    alone: Mapping[str, Any] | None = None
    needed: bool | None = None
    needed_why: str | None = None
    verdict: str | None = None
    # What the import tried to load and could not ({"name", "how", "error", "kind", "cause", "judged"}):
    # judged "cause" (the import failed on it), "not-picked" (the package loaded another build after it),
    # "feature" (the import worked without it: a warning) or "absent" (a library by name this machine lacks).
    failed_loads: tuple[Mapping[str, Any], ...] | None = None
    cause: str | None = None  # the failure's code in incell/causes.py
    # A library of its own package it was loaded after, its label (torchaudio's libtorchaudio.so): it
    # needs that one and no RUNPATH finds it; its package loads it first.
    preloaded: str | None = None

    @property
    def is_package(self) -> bool:
        """A package's import (``pkg``), not a shared object (``pkg/_ops.so``)."""
        return not self.module.endswith(".so")

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key in _KEYS:
            value = getattr(self, key)
            if value is None:
                continue
            if key == "mapped":
                value = list(value)
            elif key == "failed_loads":
                value = [dict(v) for v in value]
            elif key in ("failure", "alone"):
                value = dict(value)
            out[key] = value
        return out

    @classmethod
    def from_json(cls, data: Any) -> ImportEntry:
        """An entry as to_json wrote it; EntryError names a key it does not know or a missing one."""
        if not isinstance(data, dict):
            raise EntryError(f"a modules entry: expected a table, got {data!r}")
        unknown = sorted(set(data) - set(_KEYS))
        missing = [k for k in ("module", "dist", "ok") if k not in data]
        if unknown or missing:
            raise EntryError(f"a modules entry of {data.get('module')!r}: unknown keys {unknown}, missing {missing}")
        mapped = data.get("mapped")
        failed_loads = data.get("failed_loads")
        return cls(
            module=str(data["module"]),
            dist=str(data["dist"]),
            ok=bool(data["ok"]),
            seconds=float(data.get("seconds", 0.0)),
            loaded=data.get("loaded"),
            failure=data.get("failure"),
            reason=data.get("reason"),
            mapped=None if mapped is None else tuple(str(m) for m in mapped),
            alone=data.get("alone"),
            needed=data.get("needed"),
            needed_why=data.get("needed_why"),
            verdict=data.get("verdict"),
            failed_loads=None if failed_loads is None else tuple(dict(v) for v in failed_loads),
            cause=data.get("cause"),
            preloaded=data.get("preloaded"),
        )
