"""Run order has one definition (runs/info.py: RunInfo.order, the start in nanoseconds, then the id): two runs
that started in the same second are ordered alike by ``latest/`` and by the page's "since the previous run"."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from compatlab.render import render_run
from compatlab.render.history import load_runs, previous_run
from compatlab.runs import store
from compatlab.runs.model import CellResult, CellState, Results, RunInfo, StageResult, StageState

SECOND = "2026-03-01T02:00:00+00:00"
NS = 1_772_330_400_000_000_000  # that second, in nanoseconds
CELL = "torch2.9.1-cuda12.8"


def _run(runs: Path, run_id: str, started_ns: int, state: StageState) -> Path:
    cell = CellResult(
        id=CELL,
        axes={"torch": "2.9.1", "cuda": "12.8"},
        state=CellState.PASS if state == StageState.PASS else CellState.FAIL,
        stages=(StageResult(name="static", state=state, reason="" if state == StageState.PASS else "f(int)"),),
        reason="" if state == StageState.PASS else "static: f(int)",
        culprit="" if state == StageState.PASS else "static",
    )
    info = RunInfo(id=run_id, started=SECOND, started_ns=started_ns, finished=SECOND, complete=True, matrix_name="box")
    path = runs / run_id / "results.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(Results(run=info, cells=(cell,)).to_json()), encoding="utf-8")
    return path


def test_two_runs_of_one_second_are_ordered_alike_by_latest_and_by_the_page(tmp_path: Path) -> None:
    runs, latest = tmp_path / "runs", tmp_path / "latest"
    # "z-first" sorts after "a-second" by id, and started 0.8 s before it.
    first = _run(runs, "20260301T020000Z-z-first", NS + 100_000_000, StageState.PASS)
    second = _run(runs, "20260301T020000Z-a-second", NS + 900_000_000, StageState.FAIL)
    assert [r.run.id for r in load_runs(runs)] == ["20260301T020000Z-z-first", "20260301T020000Z-a-second"]

    written = render_run(second, latest, history_dir=runs)
    assert [p.name for p in written] == ["index.html", "compat.md", "answers.json", "results.json", "changes.md"]
    with pytest.raises(store.StaleRun, match="20260301T020000Z-a-second"):  # latest/ keeps the newer run
        render_run(first, latest, history_dir=runs)
    shown = store.load_results(latest / "results.json")
    assert shown.run.id == "20260301T020000Z-a-second"

    # ... and its page compares it with the run of the same second that started before it.
    history = load_runs(runs)
    previous = previous_run(history, shown)
    assert previous is not None
    assert previous.run.id == "20260301T020000Z-z-first"
    page = (latest / "index.html").read_text(encoding="utf-8")
    assert f"since run <code>20260301T020000Z-z-first</code> ({SECOND})" in page
    changes = (latest / "changes.md").read_text(encoding="utf-8")
    assert changes.startswith("## compatlab: run `20260301T020000Z-a-second` compared with `20260301T020000Z-z-first`")
