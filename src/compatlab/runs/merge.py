"""Merging shard run folders into one run (``compatlab merge``): the matrix's whole run from its shards.

A planned cell no shard produced is an ``error`` cell (``missing: ...``), never green; an n/a cell is written
from the matrix. Two different results for one cell are refused, naming both files, unless one comes from a
folder of ``--prefer``; identical copies are one result; a cell the matrix no longer plans is shown, not
dropped. Nothing is written before the shards are known to agree. The merged run is a new run of its own,
listing its shards and their hosts: it never writes into another run (runs/store.py's claim_run, restarted).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from compatlab.errors import ConfigError, LabError, UsageError
from compatlab.runs.files import CELLS, RUN_JSON, expectation, read_cells, run_info
from compatlab.runs.model import CellResult, CellState, Results
from compatlab.runs.planned import Planned
from compatlab.runs.store import claim_run, now_iso

__all__ = ["merge_runs"]

# The name these records always had, before the merge moved out of compatlab.runs.store.
log = logging.getLogger("compatlab.runs.store")


def _canonical(cell: CellResult) -> str:
    return json.dumps(cell.to_json(), sort_keys=True)


def merge_runs(
    plan: Planned,
    shard_dirs: Sequence[Path],
    out_dir: Path,
    *,
    run_id: str,
    prefer: Sequence[Path] = (),
    latest: Path | None = None,
) -> Results:
    """Combine shard run folders into one run; a planned cell no shard produced is an error, never green.

    Two different results for one cell are refused (LabError naming both files) unless one of them comes
    from a folder of *prefer* (the first listed wins); identical copies are one result. Nothing is written
    before the shards are known to agree.
    """
    shard_set = {d.resolve() for d in shard_dirs}
    for p in prefer:
        if p.resolve() not in shard_set:
            raise UsageError(f"--prefer {p}: not one of the shard folders given")
    cells = plan.cells
    planned = {c.id: c for c in cells}
    hosts: list[dict[str, Any]] = []
    found: dict[str, list[tuple[Path, Path, CellResult]]] = {}
    for d in shard_dirs:
        if not (d / CELLS).is_dir():
            raise UsageError(f"{d}: not a run folder (no cells/ inside); pass reports/runs/<run-id> of each shard")
        if (d / RUN_JSON).exists():
            try:
                hosts.append(dict(run_info(d).host))
            except ConfigError as exc:
                log.warning("shard host unknown: %s", exc)
        for path, result in read_cells(d, planned):
            found.setdefault(result.id, []).append((d.resolve(), path, result))
    chosen: dict[str, CellResult] = {}
    conflicts = []
    for cid, candidates in found.items():
        if len({_canonical(r) for _, _, r in candidates}) == 1:
            chosen[cid] = candidates[0][2]
            continue
        pick = next((r for p in prefer for d, _, r in candidates if d == p.resolve()), None)
        if pick is None:
            files = " and ".join(f"{path} ({r.state})" for _, path, r in candidates)
            conflicts.append(f"cell {cid}: different results in {files}")
        else:
            chosen[cid] = pick
    if conflicts:
        raise LabError("; ".join(conflicts) + "; say which shard wins with --prefer DIR")
    with claim_run(
        out_dir,
        run_id=run_id,
        plan=plan,
        restart=True,
        host=hosts[0] if hosts else {},
        shards=[str(d) for d in shard_dirs],
        hosts=hosts,
    ) as run:
        results = []
        for cell in cells:
            if cell.id in chosen:
                results.append(chosen.pop(cell.id))
            elif cell.na is not None:
                results.append(
                    CellResult(id=cell.id, axes=dict(cell.axes), state=CellState.NA, reason=cell.na, finished=now_iso())
                )
            else:
                results.append(
                    CellResult(
                        id=cell.id,
                        axes=dict(cell.axes),
                        state=CellState.ERROR,
                        unexpected=True,
                        finished=now_iso(),
                        reason="missing: no shard produced a result for this cell (lost runner or interrupted shard)",
                        expected=expectation(cell),
                    )
                )
        results.extend(chosen.values())  # cells the matrix no longer plans: shown, not dropped
        keep = {r.id for r in results}
        for path, old in read_cells(out_dir):
            if old.id not in keep and path.is_file() and not path.is_symlink():
                path.unlink()  # a cell of an earlier merge into this folder
        for result in results:
            run.write_cell(result)
        return run.finish(plan, latest=latest)
