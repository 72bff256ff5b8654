"""The run's start line: the previous run's seconds per cell, read before the new run replaces them."""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from compatlab.plan import Plan, duration_words, previous_seconds
from compatlab.runs.model import CellResult, CellState, Results, RunInfo

NOW = dt.datetime(2026, 12, 3, 17, 0, 0, tzinfo=dt.UTC)


def test_durations_read_as_people_say_them() -> None:
    assert [duration_words(s) for s in (4.4, 59.6, 564, 3600 * 2 + 300)] == [
        "4 s",
        "1 min 00 s",
        "9 min 24 s",
        "2 h 05 min",
    ]


@pytest.fixture
def utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.mark.usefixtures("utc")
def test_the_start_line_sums_what_was_timed_and_says_what_was_not() -> None:
    plan = Plan(cells=("a", "b", "c"), previous={"a": 100.0, "b": 200.4, "z": 5.0})
    assert plan.start_line("r1", now=NOW, not_applicable=66) == (
        "run r1: 3 cells (66 n/a), about 5 min 00 s as in the previous run (1 not timed before, not counted), "
        "ending about 17:05 UTC"
    )
    assert plan.cell_words("b", now=NOW) == (
        "2/3, about 3 min 20 s as in the previous run; the run ends about 17:03 UTC and 1 cell not timed"
    )
    assert plan.cell_words("c", now=NOW) == "3/3, not timed before"
    assert Plan(cells=("a",), previous={}).start_line("r2", now=NOW) == (
        "run r2: 1 cell, none timed in the previous run: no estimate"
    )


def test_the_previous_seconds_are_those_of_cells_that_ran(tmp_path: Path) -> None:
    assert previous_seconds(tmp_path) == {}
    cells = (
        CellResult(id="a", axes={}, state=CellState.PASS, seconds=12.5),
        CellResult(id="b", axes={}, state=CellState.NA),
        CellResult(id="c", axes={}, state=CellState.ERROR, seconds=3.0),
    )
    (tmp_path / "results.json").write_text(json.dumps(Results(run=RunInfo(id="r0"), cells=cells).to_json()))
    assert previous_seconds(tmp_path) == {"a": 12.5, "c": 3.0}
    (tmp_path / "results.json").write_text("{")
    assert previous_seconds(tmp_path) == {}
