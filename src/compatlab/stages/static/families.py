"""Families of distributions that must be installed at one version (the table is data/families.toml).

flashinfer ships its Python code (flashinfer-python), its precompiled kernels (flashinfer-cubin) and its
JIT cache (flashinfer-jit-cache) as separate distributions; ``import flashinfer`` compares their versions
and raises when they differ, so a resolver that upgrades one of them alone breaks the import.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import tomllib
from collections.abc import Mapping
from functools import cache

from packaging.utils import canonicalize_name

from compatlab.errors import ConfigError

__all__ = ["Family", "FamilyMix", "families", "family_mixes"]

_TABLE = "families.toml"


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Family:
    name: str
    members: tuple[str, ...]
    says: str = ""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class FamilyMix:
    """Two installed members of one family at different versions."""

    family: Family
    first: tuple[str, str]  # (distribution, version) of the member the others must match
    other: tuple[str, str]

    @property
    def message(self) -> str:
        (a, va), (b, vb) = self.first, self.other
        text = f"{a} {va} and {b} {vb} are one family ({self.family.name}) and must be the same version"
        return text + (f": {self.family.says}" if self.family.says else "")


def _public(version: str) -> str:
    return version.split("+", 1)[0]


@cache
def families() -> tuple[Family, ...]:
    """The table, read once; ConfigError naming the entry when it is malformed."""
    text = importlib.resources.files("compatlab").joinpath("data", _TABLE).read_text(encoding="utf-8")
    data = tomllib.loads(text)
    out: list[Family] = []
    problems: list[str] = []
    for name, entry in data.items():
        members = entry.get("members") if isinstance(entry, dict) else None
        if not isinstance(members, list) or len(members) < 2 or not all(isinstance(m, str) for m in members):
            problems.append(f"{name}.members: expected a list of two or more distribution names, got {members!r}")
            continue
        out.append(Family(name=name, members=tuple(members), says=str(entry.get("says", ""))))
    if problems:
        raise ConfigError(f"compatlab/data/{_TABLE}", problems)
    return tuple(out)


def family_mixes(installed: Mapping[str, str]) -> list[FamilyMix]:
    """Every member installed at another version than the family's first installed member."""
    by_name = {canonicalize_name(n): (n, v) for n, v in installed.items()}
    out: list[FamilyMix] = []
    for family in families():
        present = [by_name[canonicalize_name(m)] for m in family.members if canonicalize_name(m) in by_name]
        if len(present) < 2:
            continue
        first = present[0]
        out.extend(
            FamilyMix(family=family, first=first, other=o) for o in present[1:] if _public(o[1]) != _public(first[1])
        )
    return out
