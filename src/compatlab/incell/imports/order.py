"""The order the import stage learned on an environment: a distribution's modules before another's adoption.

The plan orders distributions by their Requires-Dist (plan.by_requirements), but an adopted package's import
can bring in the modules of a declared distribution that none of its requirements names (compressed_tensors
imports scipy; timm, torchvision). Every load of that distribution after it is then refused by the adopting
server and answered by the server that adopts nothing, whose child imports what it needs again (scipy's 64
loads in the environment of ``uv pip install sglang==0.5.23``). The loader keeps each such pair, the refused
load's distribution and the adopted package's (``Loader.learned``); the next run on the same environment puts
the first before the second, so its loads go where its requirements are imported and are not refused.

Either way each of those modules is loaded with its own package not imported (by the server that adopts
nothing, or in the adopting server before its package is adopted), so the order changes what a load costs,
not what it is asked. Kept as JSON, one file per environment in the cell's ``keep`` folder (beside the venvs
of a matrix, else the lab's cache), named by a digest of the interpreter, the environment and every surveyed
distribution's name and version; a file that cannot be read, or is for another environment, orders nothing.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

from compatlab.incell.loading.installed import Installed

__all__ = ["LearnedOrder"]

_SCHEMA = 1
_MAX_PAIRS = 10000  # a file with more is not one this module wrote


@dataclasses.dataclass(kw_only=True)
class LearnedOrder:
    """``before``: each distribution -> those whose modules to load before its package is adopted, as learned
    on this environment; ``path`` the file that keeps them (None: nowhere to keep them); ``problem`` why what
    was there is not used, or could not be kept ("" if none)."""

    before: dict[str, list[str]]
    path: Path | None
    key: str
    problem: str = ""

    @classmethod
    def at(cls, folder: Path | None, surveyed: Mapping[str, Installed]) -> LearnedOrder:
        """What was learned on this environment, read from its file in *folder* (the cell's ``keep``);
        nothing when there is none."""
        key = _key(surveyed)
        if folder is None:
            return cls(before={}, path=None, key=key)
        path = folder / f"{key[:32]}.json"
        order = cls(before={}, path=path, key=key)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return order
        except (OSError, ValueError) as exc:
            order.problem = f"the learned order {path} could not be read ({exc}): not used"
            return order
        before = _pairs(data, key, set(surveyed))
        if before is None:
            order.problem = f"the learned order {path} is not one for this environment: not used"
            return order
        order.before = before
        return order

    @property
    def pairs(self) -> int:
        return sum(len(v) for v in self.before.values())

    def keep(self, learned: Mapping[str, set[str]]) -> int:
        """Add *learned* (an adopted package's distribution -> those refused after it) to what is kept, and
        write it if anything is new; the number of pairs new this run."""
        new = 0
        merged = {dist: list(deps) for dist, deps in self.before.items()}
        for dist, deps in sorted(learned.items()):
            for dep in sorted(deps):
                if dep != dist and dep not in merged.setdefault(dist, []):
                    merged[dist].append(dep)
                    new += 1
        if not new or self.path is None:
            return new
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".order-", dir=self.path.parent)
            with os.fdopen(fd, "w", encoding="utf-8") as file:
                json.dump({"schema": _SCHEMA, "key": self.key, "before": merged}, file, indent=1, sort_keys=True)
            os.replace(tmp, self.path)
        except OSError as exc:  # said after what reading it said, if anything
            kept = f"the learned order could not be kept in {self.path} ({exc})"
            self.problem = f"{self.problem}; {kept}" if self.problem else kept
            return new
        self.before = merged
        return new


def _key(surveyed: Mapping[str, Installed]) -> str:
    said = [sys.implementation.cache_tag or "", sys.prefix, *sorted(f"{d}=={s.version}" for d, s in surveyed.items())]
    return hashlib.sha256("\n".join(said).encode()).hexdigest()


def _pairs(data: object, key: str, dists: set[str]) -> dict[str, list[str]] | None:
    """The pairs of a file this module wrote for *key*, those of distributions surveyed now; None otherwise."""
    if not isinstance(data, dict) or data.get("schema") != _SCHEMA or data.get("key") != key:
        return None
    before = data.get("before")
    if not isinstance(before, dict):
        return None
    out: dict[str, list[str]] = {}
    count = 0
    for dist, deps in before.items():
        if not isinstance(dist, str) or not isinstance(deps, list) or not all(isinstance(d, str) for d in deps):
            return None
        count += len(deps)
        if dist in dists:
            out[dist] = [d for d in deps if d in dists and d != dist]
    return out if count <= _MAX_PAIRS else None
