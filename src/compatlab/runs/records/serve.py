"""The serve stage's details: the cell's SGLang, the GPUs and tensor-parallel size it served with, notes,
each server's record (its figures, or its state, reason, the cause read from its log and the log's path), what
the weights are, the model made for it, the figures (``<server>_tok_s_c1``, ``…_startup_s``) and the JIT cache
it used, in that order; a key is absent (None here) where the stage stopped before it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from compatlab.runs.model import StageResult
from compatlab.runs.records.common import number, table, tables, text, texts

__all__ = ["ServeDetails"]


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class ServeDetails:
    """``servers``: name -> its record; one that did not serve has a ``state`` (fail, error, skip)."""

    sglang: str | None = None
    gpus: tuple[dict[str, Any], ...] | None = None
    tp: int | None = None
    notes: tuple[str, ...] | None = None
    servers: Mapping[str, Mapping[str, Any]] | None = None
    weights: str | None = None
    architecture: str | None = None
    layers: int | None = None
    model_notes: tuple[str, ...] | None = None
    figures: Mapping[str, float] | None = None
    jit_cache: Mapping[str, Any] | None = None

    @property
    def served(self) -> dict[str, Mapping[str, Any]]:
        """The servers that served (no ``state``), by name."""
        return {n: r for n, r in (self.servers or {}).items() if "state" not in r}

    @classmethod
    def of(cls, result: StageResult) -> ServeDetails:
        d = result.details

        def whole(key: str) -> int | None:
            value = d.get(key)
            return value if isinstance(value, int) and not isinstance(value, bool) else None

        return cls(
            sglang=text(d.get("sglang")),
            gpus=tables(d["gpus"]) if "gpus" in d else None,
            tp=whole("tp"),
            notes=texts(d["notes"]) if "notes" in d else None,
            servers={k: table(v) for k, v in table(d["servers"]).items()} if "servers" in d else None,
            weights=text(d.get("weights")),
            architecture=text(d.get("architecture")),
            layers=whole("layers"),
            model_notes=texts(d["model_notes"]) if "model_notes" in d else None,
            figures={k: v for k, v in table(d["figures"]).items() if number(v) is not None} if "figures" in d else None,
            jit_cache=table(d["jit_cache"]) if "jit_cache" in d else None,
        )

    def to_details(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for field in dataclasses.fields(self):
            value: Any = getattr(self, field.name)
            if value is None:
                continue
            if isinstance(value, tuple):
                value = list(value)
            elif isinstance(value, Mapping):
                value = {k: dict(v) if isinstance(v, Mapping) else v for k, v in value.items()}
            out[field.name] = value
        return out
