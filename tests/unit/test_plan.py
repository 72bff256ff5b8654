"""The run's start line: what the earlier runs took per cell for the stages this run runs, as a range."""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from compatlab.plan import Plan, Span, duration_words, previous_spans
from compatlab.runs.model import RUN_SCHEMA, CellResult, CellState, Results, RunInfo, StageResult, StageState

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
    plan = Plan(cells=("a", "b", "c"), previous={"a": Span(100.0, 100.0), "b": Span(200.4, 200.4), "z": Span(5, 5)})
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
    several = Plan(cells=("a", "b"), previous={"a": Span(100.0, 160.0, 3), "b": Span(200.0, 230.0, 2)})
    assert several.start_line("r3", now=NOW) == (
        "run r3: 2 cells, 5 min 00 s to 6 min 30 s as in the last 3 runs, ending between 17:05 and 17:06 UTC"
    )


def _cell(cid: str, seconds: float, stages: dict[str, float], *, preflight_after: str = "") -> CellResult:
    results = [StageResult(name=n, state=StageState.PASS, seconds=s) for n, s in stages.items()]
    if preflight_after:
        results.append(
            StageResult(
                name="import", state=StageState.SKIP, reason=f"not run: preflight stopped after {preflight_after}"
            )
        )
    return CellResult(id=cid, axes={}, state=CellState.PASS, seconds=seconds, stages=tuple(results))


def _run(runs: Path, run_id: str, started_ns: int, *cells: CellResult, matrix: str = "m") -> None:
    (runs / run_id).mkdir(parents=True)
    info = RunInfo(id=run_id, started_ns=started_ns, matrix_name=matrix)
    (runs / run_id / "results.json").write_text(json.dumps(Results(run=info, cells=cells).to_json()))
    (runs / run_id / "run.json").write_text(json.dumps({"schema": RUN_SCHEMA, **info.to_json()}))


def test_the_spans_come_from_several_runs_and_the_stages_that_will_run(tmp_path: Path) -> None:
    assert previous_spans(tmp_path) == {}
    whole = {"install": 10.0, "pins": 1.0, "static": 4.0, "import": 20.0}
    _run(tmp_path, "r1", 1, _cell("a", 40.0, whole), CellResult(id="n", axes={}, state=CellState.NA))
    _run(tmp_path, "r2", 2, _cell("a", 50.0, {**whole, "import": 30.0}))
    _run(tmp_path, "r3", 3, _cell("a", 16.0, {"install": 10.0, "pins": 1.0, "static": 4.0}, preflight_after="static"))
    _run(tmp_path, "other", 4, _cell("a", 999.0, whole), matrix="another")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "results.json").write_text("{")
    # The whole pipeline: the two full runs (a preflight is thinner; another matrix's run is not read).
    assert previous_spans(tmp_path, matrix_name="m") == {"a": Span(40.0 * 0.9, 50.0 * 1.1, 2)}
    # A preflight to static: every run that ran those stages, with each run's time outside stages.
    assert previous_spans(tmp_path, matrix_name="m", stages=["install", "pins", "static"]) == {
        "a": Span((15.0 + 1.0) * 0.9, (15.0 + 5.0) * 1.1, 3)
    }
    assert previous_spans(tmp_path, matrix_name="m", exclude="r2", runs=1) == {"a": Span(40.0, 40.0, 1)}
    # A folder whose run.json cannot be read is not a run to time from, whatever its results say.
    (tmp_path / "r2" / "run.json").unlink()
    assert previous_spans(tmp_path, matrix_name="m", runs=1) == {"a": Span(40.0, 40.0, 1)}
