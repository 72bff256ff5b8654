"""Merging shards: a planned cell no shard produced is an error, two different results need --prefer."""

from __future__ import annotations

from pathlib import Path

import pytest

from compatlab.errors import LabError, UsageError
from compatlab.runs import store
from compatlab.runs.merge import merge_runs
from compatlab.runs.model import CellResult, CellState, StageResult, StageState
from compatlab.runs.planned import Planned, PlannedCell

PLAN = Planned(
    path="matrix.toml",
    name="box",
    report={},
    axes={"torch": ("2.9.1", "2.10.0", "2.11.0"), "cuda": ("12.8",)},
    cells=(
        PlannedCell(id="c1", axes={"torch": "2.9.1"}),
        PlannedCell(id="c2", axes={"torch": "2.10.0"}, expect="fail", expect_reason="known"),
        PlannedCell(id="c3", axes={"torch": "2.11.0"}, na="torch 2.11.0 has no CUDA 12.8 build"),
    ),
)


def _cell(cid: str, state: StageState) -> CellResult:
    return CellResult(
        id=cid,
        axes={},
        state=CellState.PASS if state == StageState.PASS else CellState.FAIL,
        stages=(StageResult(name="static", state=state),),
    )


def _shard(folder: Path, *cells: CellResult) -> Path:
    with store.claim_run(folder, run_id=folder.name, plan=PLAN, host={"hostname": folder.name}) as run:
        for cell in cells:
            run.write_cell(cell)
    return folder


def test_shards_merge_into_a_new_run_and_a_missing_cell_is_an_error(tmp_path: Path) -> None:
    s1 = _shard(tmp_path / "s1", _cell("c1", StageState.PASS), _cell("old", StageState.PASS))
    s2 = _shard(tmp_path / "s2", _cell("c1", StageState.PASS))
    results = merge_runs(PLAN, [s1, s2], tmp_path / "merged", run_id="m1")
    assert [(c.id, c.state) for c in results.cells] == [
        ("c1", "pass"),
        ("c2", "error"),
        ("c3", "n/a"),
        ("old", "pass"),  # a cell the matrix no longer plans: shown, not dropped
    ]
    missing = results.by_id["c2"]
    assert missing.reason == "missing: no shard produced a result for this cell (lost runner or interrupted shard)"
    assert (missing.unexpected, missing.expected and missing.expected.state) == (True, CellState.FAIL)
    assert results.by_id["c3"].reason == "torch 2.11.0 has no CUDA 12.8 build"
    info = store.run_info(tmp_path / "merged")
    assert (info.id, info.done, info.shards, [h["hostname"] for h in info.hosts]) == (
        "m1",
        True,
        (str(s1), str(s2)),
        ["s1", "s2"],
    )
    assert store.load_results(tmp_path / "merged" / "results.json") == results


def test_two_different_results_of_one_cell_are_refused_unless_one_shard_is_preferred(tmp_path: Path) -> None:
    s1 = _shard(tmp_path / "s1", _cell("c1", StageState.PASS))
    s2 = _shard(tmp_path / "s2", _cell("c1", StageState.FAIL))
    with pytest.raises(LabError) as info:
        merge_runs(PLAN, [s1, s2], tmp_path / "merged", run_id="m1")
    cells = tmp_path / "s1" / "cells", tmp_path / "s2" / "cells"
    assert str(info.value) == (
        f"cell c1: different results in {cells[0] / 'c1.json'} (pass) and {cells[1] / 'c1.json'} (fail); "
        "say which shard wins with --prefer DIR"
    )
    assert not (tmp_path / "merged").exists()  # nothing written before the shards agree
    results = merge_runs(PLAN, [s1, s2], tmp_path / "merged", run_id="m1", prefer=[s2])
    assert results.by_id["c1"].state == CellState.FAIL


def test_what_is_not_a_shard_is_refused(tmp_path: Path) -> None:
    s1 = _shard(tmp_path / "s1")
    with pytest.raises(UsageError) as info:
        merge_runs(PLAN, [s1], tmp_path / "merged", run_id="m1", prefer=[tmp_path / "other"])
    assert str(info.value) == f"--prefer {tmp_path / 'other'}: not one of the shard folders given"
    with pytest.raises(UsageError) as info:
        merge_runs(PLAN, [tmp_path], tmp_path / "merged", run_id="m1")
    assert str(info.value) == (
        f"{tmp_path}: not a run folder (no cells/ inside); pass reports/runs/<run-id> of each shard"
    )
