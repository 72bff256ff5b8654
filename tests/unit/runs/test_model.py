"""The results model: states as StrEnums, strict from_json with key paths, JSON that round-trips."""

from __future__ import annotations

import json
from typing import Any

import pytest

from compatlab.runs.model import (
    SCHEMA,
    CellResult,
    CellState,
    Results,
    RunInfo,
    ShapeError,
    StageResult,
    StageState,
    cell_state,
)


def test_states_keep_their_string_values() -> None:
    assert [s.value for s in StageState] == ["pass", "warn", "fail", "error", "skip"]
    assert [s.value for s in CellState] == ["pass", "fail", "partial", "error", "n/a"]
    stage = StageResult(name="pins", state=StageState.WARN)
    assert stage.state is StageState.WARN
    assert json.dumps(stage.to_json()["state"]) == '"warn"'
    assert cell_state([stage, StageResult(name="cuda", state=StageState.SKIP)]) is CellState.PARTIAL
    with pytest.raises(ValueError, match="'green' is not a valid StageState"):
        StageResult(name="pins", state="green")  # type: ignore[arg-type]


def cell_json(**changes: Any) -> dict[str, Any]:
    data = CellResult(
        id="c1",
        axes={"torch": "2.9.1"},
        state=CellState.FAIL,
        stages=(StageResult(name="static", state=StageState.FAIL, reason="undefined symbol"),),
    ).to_json()
    data.update(changes)
    return data


def test_a_cell_round_trips() -> None:
    data = cell_json(expected={"state": "fail", "reason": "known"}, freeze=["torch==2.9.1"], seconds=1.5)
    assert CellResult.from_json(json.loads(json.dumps(data))).to_json() == data


@pytest.mark.parametrize(
    ("changes", "problems"),
    [
        ({"state": "green"}, ["state: expected one of pass, fail, partial, error, n/a, got 'green'"]),
        (
            {"stages": [{"name": "static", "state": "ok"}, {"state": "pass"}]},
            [
                "stages[0].state: expected one of pass, warn, fail, error, skip, got 'ok'",
                "stages[1]: missing key 'name'",
            ],
        ),
        (
            {"seconds": float("nan"), "attempts": 0, "unexpected": "yes"},
            [
                "unexpected: expected true or false, got 'yes'",
                "seconds: expected a finite number, got nan",
                "attempts: expected a whole number >= 1, got 0",
            ],
        ),
        (
            {"axes": {"torch": 2}, "freeze": "torch==2.9.1"},
            [
                "axes: expected a table of strings, got a table",
                "freeze: expected a list of strings, got 'torch==2.9.1'",
            ],
        ),
        ({"staets": []}, ["unknown key 'staets'; perhaps you meant 'stages'?"]),
    ],
)
def test_a_bad_cell_names_every_problem_with_its_key_path(changes: dict[str, Any], problems: list[str]) -> None:
    with pytest.raises(ShapeError) as info:
        CellResult.from_json(cell_json(**changes))
    assert info.value.problems == problems


def test_a_cell_must_be_a_table_with_an_id() -> None:
    with pytest.raises(ShapeError) as info:
        CellResult.from_json([])
    assert info.value.problems == ["expected a table, got a list"]
    data = cell_json()
    del data["id"]
    with pytest.raises(ShapeError) as info:
        CellResult.from_json(data)
    assert info.value.problems == ["missing key 'id'"]


def test_results_and_run_info() -> None:
    info = RunInfo(id="r2", started="2026-12-02T10:15:00+00:00", report={"rows": ("torch",)}, axes={"cuda": ("12.8",)})
    results = Results(run=info, cells=(CellResult.from_json(cell_json()),))
    data = json.loads(json.dumps(results.to_json()))
    # Keys left at their defaults are left out.
    assert data["run"] == {
        "id": "r2",
        "started": "2026-12-02T10:15:00+00:00",
        "report": {"rows": ["torch"]},
        "axes": {"cuda": ["12.8"]},
    }
    assert Results.from_json(data) == results
    # Ordered by start (ns when known), then id: a run that started in the same second still orders.
    assert RunInfo(id="a", started_ns=2).order > RunInfo(id="b", started_ns=1).order
    assert RunInfo(id="b", started=info.started).order > RunInfo(id="a", started=info.started).order
    with pytest.raises(ShapeError) as err:
        Results.from_json(
            {
                "schema": SCHEMA,
                "run": {"id": "x", "report": {"rows": 3}, "axes": {"cuda": "12.8"}},
                "cells": [{"id": "c", "axes": {}, "state": "green"}],
            }
        )
    assert err.value.problems == [
        "run.report.rows: expected a list of axis names, got 3",
        "run.axes.cuda: expected a list of versions, got '12.8'",
        "cells[0] (c): state: expected one of pass, fail, partial, error, n/a, got 'green'",
    ]
