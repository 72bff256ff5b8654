"""Spread a matrix over machines: deterministic shards and a CI fan-out list (runs/store.py merges them)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from compatlab.cells import Cell, expand
from compatlab.config import limits
from compatlab.config.matrix import Matrix
from compatlab.errors import UsageError

__all__ = ["ci_matrix", "parse_shard", "shard_cells"]


def parse_shard(text: str, *, where: str = "--shard") -> tuple[int, int]:
    """'2/4' -> (2, 4); 1-based, as people count machines."""
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if not m or not 1 <= int(m.group(1)) <= int(m.group(2)):
        raise UsageError(f"{where}: expected i/n with 1 <= i <= n (e.g. 2/4), got {text!r}")
    limits.check("--shard", int(m.group(2)), where=f"{where} {text.strip()}")
    return int(m.group(1)), int(m.group(2))


def shard_cells(cells: Sequence[Cell], index: int, count: int) -> list[Cell]:
    """The cells of shard *index* of *count*: every cell in exactly one shard.

    Cells that run are dealt round-robin in matrix order, so shard sizes differ by at most one; n/a cells
    (which cost nothing) are dealt the same way on their own, so they never unbalance the real work.
    """
    live = [c for c in cells if c.na is None]
    na = [c for c in cells if c.na is not None]
    mine = {c.id for i, c in enumerate(live) if i % count == index - 1}
    mine |= {c.id for i, c in enumerate(na) if i % count == index - 1}
    return [c for c in cells if c.id in mine]


def ci_matrix(matrix: Matrix, *, shards: int | None) -> dict[str, Any]:
    """The JSON a CI matrix strategy consumes with ``fromJson``: one job per shard, or per live cell."""
    if shards:
        return {"include": [{"shard": f"{i}/{shards}"} for i in range(1, shards + 1)]}
    return {"include": [{"cell": c.id, "session": f"matrix({c.id})"} for c in expand(matrix) if c.na is None]}
