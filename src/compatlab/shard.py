"""Spread a matrix over machines: deterministic shards, a CI fan-out list, and the merge of shard runs."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from compatlab.cells import Cell, expand
from compatlab.config.matrix import Matrix
from compatlab.errors import UsageError
from compatlab.runs.model import CellResult, write_json_atomic

__all__ = ["ci_matrix", "merge_runs", "parse_shard", "prune_runs", "shard_cells"]


def parse_shard(text: str, *, where: str = "--shard") -> tuple[int, int]:
    """'2/4' -> (2, 4); 1-based, as people count machines."""
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if not m or not 1 <= int(m.group(1)) <= int(m.group(2)):
        raise UsageError(f"{where}: expected i/n with 1 <= i <= n (e.g. 2/4), got {text!r}")
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


def merge_runs(matrix: Matrix, shard_dirs: Sequence[Path], out_dir: Path, *, run_id: str) -> dict[str, Any]:
    """Combine shard run folders into one run; a planned cell no shard produced is an error, never green."""
    from compatlab.runner import aggregate_run, now_iso

    (out_dir / "cells").mkdir(parents=True, exist_ok=True)
    found: dict[str, Path] = {}
    hosts = []
    for d in shard_dirs:
        if (d / "run.json").exists():
            hosts.append(json.loads((d / "run.json").read_text(encoding="utf-8")).get("host", {}))
        for path in sorted((d / "cells").glob("*.json")):
            found.setdefault(path.stem, path)
    for cell in expand(matrix):
        target = out_dir / "cells" / f"{cell.id}.json"
        if cell.id in found:
            shutil.copyfile(found[cell.id], target)
            continue
        if cell.na is not None:
            result = CellResult(id=cell.id, axes=cell.axes, state="n/a", reason=cell.na, finished=now_iso())
        else:
            result = CellResult(
                id=cell.id, axes=cell.axes, state="error", unexpected=True, finished=now_iso(),
                reason="missing: no shard produced a result for this cell (lost runner or interrupted shard)",
                expected={"state": cell.expect, "reason": cell.expect_reason} if cell.expect else None,
            )
        write_json_atomic(target, result.to_json())
    write_json_atomic(out_dir / "run.json", {
        "id": run_id, "started": now_iso(), "matrix": matrix.path, "matrix_name": matrix.name,
        "host": hosts[0] if hosts else {}, "shards": [str(d) for d in shard_dirs], "hosts": hosts,
    })
    return aggregate_run(matrix, out_dir, run_id=run_id, latest=None)


def prune_runs(runs_dir: Path, keep: int) -> list[Path]:
    """Delete all but the newest *keep* run folders (run ids sort by time); returns what was removed."""
    if keep < 1:
        raise UsageError(f"--keep: expected a positive number of runs, got {keep}")
    def started(p: Path) -> str:
        try:
            return str(json.loads((p / "run.json").read_text(encoding="utf-8")).get("started", ""))
        except (OSError, json.JSONDecodeError):
            return ""

    runs = sorted((p for p in runs_dir.iterdir() if p.is_dir() and (p / "results.json").exists()),
                  key=lambda p: (started(p), p.name))
    doomed = runs[:-keep]
    for path in doomed:
        shutil.rmtree(path)
    return doomed
