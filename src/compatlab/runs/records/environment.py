"""What ``incell/inspect_env.py`` printed about an interpreter: read by key here, once (``Inspection.from_json``).

``compatlab check`` runs the checked interpreter with ``python -m compatlab.incell.inspect_env`` and reads this
record of it (``existing.inspect_environment``); the JSON's shape is that module's docstring. A key the lab
needs that is missing is a KeyError: the two are one package, copied into the cell together.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

__all__ = ["InspectedDist", "Inspection"]


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class InspectedDist:
    """One distribution the interpreter sees (the first of its name on ``sys.path``)."""

    name: str  # as its METADATA spells it
    version: str
    native: int  # how many shared objects its RECORD lists
    site: str  # the site directory it is installed in; "" when it cannot say

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> InspectedDist:
        return cls(name=data["name"], version=data["version"], native=data["native"], site=data["site"])


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Inspection:
    """The interpreter (``sys.executable``, its version, prefixes and purelib), what it can import of the lab's
    tools, every distribution it sees, the distributions that could not be read, and torch/version.py's text."""

    python: str | None  # "" or None when the interpreter cannot say where it is
    version: str
    prefix: str
    base_prefix: str
    purelib: str
    pytest: bool
    pip: bool
    dists: tuple[InspectedDist, ...]
    torch_version_py: str | None = None
    # (the *.dist-info folder, what is wrong with it), sorted
    problems: tuple[tuple[str, str], ...] = ()

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Inspection:
        return cls(
            python=data["python"],
            version=data["version"],
            prefix=data["prefix"],
            base_prefix=data["base_prefix"],
            purelib=data["purelib"],
            pytest=bool(data["pytest"]),
            pip=bool(data["pip"]),
            dists=tuple(InspectedDist.from_json(d) for d in data["dists"]),
            torch_version_py=data.get("torch_version_py"),
            problems=tuple(sorted((str(w), str(why)) for w, why in data.get("problems", []))),
        )

    @property
    def is_venv(self) -> bool:
        return self.prefix != self.base_prefix

    @property
    def site(self) -> str:
        """The site directory holding most of the distributions with native code, else purelib."""
        counts: dict[str, int] = {}
        for d in self.dists:
            if d.native and d.site:
                counts[d.site] = counts.get(d.site, 0) + 1
        return max(counts, key=lambda s: counts[s]) if counts else self.purelib
