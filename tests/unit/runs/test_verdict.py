"""The verdict policy (runs/verdict.py): decided once when a cell ends, recorded as the cell's culprit, and
read back by the renderers instead of being decided again."""

from __future__ import annotations

from pathlib import Path

import pytest

from compatlab import runner
from compatlab.cells import expand
from compatlab.config.matrix import load_matrix
from compatlab.render.view import build
from compatlab.runs.model import SCHEMA, CellResult, CellState, Results, RunInfo, ShapeError, StageResult, StageState
from compatlab.runs.verdict import culprit, explains, verdict
from compatlab.stages import CellContext, Stage
from fixtures.matrices import ONE_CELL


def _stage(name: str, state: StageState, reason: str = "") -> Stage:
    def run(_ctx: CellContext) -> StageResult:
        return StageResult(name=name, state=state, reason=reason)

    return Stage(name=name, run=run)


def test_the_runner_records_the_stage_that_explains_the_cell(tmp_path: Path) -> None:
    toml = tmp_path / "matrix.toml"
    toml.write_text(ONE_CELL.format(torch="https://download.example", url="https://pypi.example"), encoding="utf-8")
    matrix = load_matrix(toml, use_lock=False)
    cell = expand(matrix)[0]
    ctx = CellContext(matrix=matrix, cell=cell, venv=tmp_path, python=tmp_path / "python", work_dir=tmp_path)
    stages = (
        _stage("pins", StageState.PASS),
        _stage("static", StageState.ERROR, "cannot read x.so"),
        _stage("import", StageState.FAIL, "x.so: undefined symbol f"),
    )
    ctx = runner.run_pipeline(ctx, stages)
    result = runner.conclude(ctx, expected=None, started="2026-01-01T00:00:00+00:00", seconds=1.0)
    assert (result.state, result.culprit, result.reason) == (
        CellState.FAIL,
        "import",
        "import: x.so: undefined symbol f",
    )
    assert result.to_json()["culprit"] == "import"
    assert CellResult.from_json(result.to_json()) == result


def _cell(*stages: StageResult, recorded: str = "") -> CellResult:
    state, _reason, _bad = verdict(stages)
    return CellResult(id="c1", axes={"torch": "2.9.1"}, state=state, stages=stages, culprit=recorded)


def test_the_page_shows_the_recorded_culprit_and_a_record_without_one_gets_the_same_policy() -> None:
    pins = StageResult(name="pins", state=StageState.FAIL, reason="torch was replaced")
    static = StageResult(name="static", state=StageState.FAIL, reason="undefined symbol f")
    recorded = _cell(pins, static, recorded="static")
    older = _cell(pins, static)  # written before the lab recorded its culprit
    assert culprit(recorded) == static
    assert culprit(older) == explains(older.stages) == pins
    results = Results(run=RunInfo(id="r1"), cells=(recorded,))
    (shown,) = build(results).tables[0].slots.values()
    assert (shown.culprit, shown.reason) == (static, "undefined symbol f")


def test_each_state_has_its_culprit() -> None:
    amber = (StageResult(name="pins", state=StageState.PASS), StageResult(name="cuda", state=StageState.SKIP))
    grey = (StageResult(name="pins", state=StageState.ERROR, reason="uv died"), *amber)
    green = (StageResult(name="cuda", state=StageState.SKIP, required=False),)
    assert verdict(amber)[0::2] == (CellState.PARTIAL, amber[1])
    assert verdict(grey) == (CellState.ERROR, "pins: uv died", grey[0])
    assert verdict(green) == (CellState.PASS, "", None)


def test_a_recorded_culprit_names_one_of_the_cell_s_stages() -> None:
    data = _cell(StageResult(name="pins", state=StageState.FAIL, reason="x"), recorded="pins").to_json()
    data["culprit"] = "pin"
    with pytest.raises(ShapeError) as caught:
        Results.from_json({"schema": SCHEMA, "run": {"id": "r1"}, "cells": [data]})
    assert caught.value.problems == ["cells[0] (c1): culprit: expected the name of one of the cell's stages, got 'pin'"]
