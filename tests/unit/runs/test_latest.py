"""reports/latest is the whole matrix: a run of some cells replaces those and keeps the others."""

from __future__ import annotations

from pathlib import Path

import pytest

from compatlab.cells import planned
from compatlab.config.matrix import Matrix, parse_matrix
from compatlab.render import render_run
from compatlab.runs import latest as latest_folder
from compatlab.runs import store
from compatlab.runs.model import CellResult, CellState, StageResult, StageState

MATRIX = {
    "name": "box",
    "axes": {
        "torch": [{"version": "2.9.1", "cuda": "12.8"}],
        "sgl-kernel": [{"version": "0.3.21"}],
        "flashinfer": [{"version": "0.6.4"}, {"version": "0.7.4"}],
        "cuda": [{"version": "12.8"}, {"version": "13.0"}],
    },
}
OLD = "torch2.9.1-sglkernel0.3.21-flashinfer0.6.4-cuda12.8"
NEW = "torch2.9.1-sglkernel0.3.21-flashinfer0.7.4-cuda12.8"


@pytest.fixture
def matrix(tmp_path: Path) -> Matrix:
    return parse_matrix(MATRIX, str(tmp_path / "matrix.toml"))


def _cell(cid: str, state: str, seconds: float) -> CellResult:
    return CellResult(
        id=cid,
        axes={},
        state=CellState(state),
        seconds=seconds,
        stages=(StageResult(name="static", state=StageState.FAIL if state == "fail" else StageState.PASS, reason="x"),),
    )


def _run(tmp_path: Path, matrix: Matrix, run_id: str, *cells: CellResult) -> None:
    with store.claim_run(
        tmp_path / "runs" / run_id, run_id=run_id, plan=planned(matrix), host={"hostname": "box"}
    ) as run:
        for cell in cells:
            run.write_cell(cell)
        run.aggregate(planned(matrix), latest=tmp_path / "latest")


def test_a_run_of_one_cell_keeps_the_other_cells_marked_with_their_run(tmp_path: Path, matrix: Matrix) -> None:
    _run(tmp_path, matrix, "r1", _cell(OLD, "pass", 10.0), _cell(NEW, "pass", 20.0))
    _run(tmp_path, matrix, "r2", _cell(NEW, "fail", 21.0))
    latest = store.load_results(tmp_path / "latest" / "results.json")
    assert latest.run.id == "r2"
    assert [(c.id, c.state, c.run) for c in latest.cells if c.state != CellState.NA] == [
        (OLD, "pass", "r1"),
        (NEW, "fail", ""),
    ]
    assert sum(c.state == CellState.NA for c in latest.cells) == 2
    # A third run of the other cell: the kept cell still names the run it came from.
    _run(tmp_path, matrix, "r3", _cell(OLD, "pass", 9.0))
    latest = store.load_results(tmp_path / "latest" / "results.json")
    assert [(c.id, c.state, c.run) for c in latest.cells if c.state != CellState.NA] == [
        (OLD, "pass", ""),
        (NEW, "fail", "r2"),
    ]
    # The run's own results.json holds only what it ran.
    own = store.load_results(tmp_path / "runs" / "r3" / "results.json")
    assert [c.id for c in own.cells if c.state != CellState.NA] == [OLD]
    written = render_run(tmp_path / "runs" / "r3" / "results.json", tmp_path / "latest", history_dir=None)
    assert written[0] == tmp_path / "latest" / "index.html"
    html = (tmp_path / "latest" / "index.html").read_text(encoding="utf-8")
    assert (
        '<span class="tag older" title="the newest run did not run this cell: this is its result of run r2">'
        "run r2</span>"
    ) in html
    assert "1 from older runs</li>" in html
    md = (tmp_path / "latest" / "compat.md").read_text(encoding="utf-8")
    assert "*(from run r2)*" in md
    assert "1 from older runs (marked *from run …*)" in md


def test_another_matrix_never_replaces_the_grid_of_the_first(
    tmp_path: Path, matrix: Matrix, caplog: pytest.LogCaptureFixture
) -> None:
    _run(tmp_path, matrix, "r1", _cell(OLD, "pass", 10.0), _cell(NEW, "pass", 20.0))
    other = parse_matrix({**MATRIX, "name": "other"}, str(tmp_path / "other.toml"))
    _run(tmp_path, other, "r2", _cell(NEW, "fail", 20.0))
    latest = store.load_results(tmp_path / "latest" / "results.json")
    assert (latest.run.id, [c.id for c in latest.cells if c.state != CellState.NA]) == ("r1", [OLD, NEW])
    assert (
        f"{tmp_path / 'latest'} shows the grid of matrix 'box', not of 'other': left as it is; give each matrix "
        "its own reports folder (COMPATLAB_REPORTS, or --out)"
    ) in caplog.text
    # Nothing lost: the other matrix's run keeps its own results.
    own = store.load_results(tmp_path / "runs" / "r2" / "results.json")
    assert [(c.id, c.state) for c in own.cells if c.state != CellState.NA] == [(NEW, "fail")]


def _preflight(cid: str) -> CellResult:
    return CellResult(
        id=cid,
        axes={},
        state=CellState.PARTIAL,
        stages=(
            StageResult(name="static", state=StageState.PASS),
            StageResult(name="import", state=StageState.SKIP, reason="not run: preflight stopped after static"),
        ),
    )


def test_a_preflight_never_replaces_a_fuller_verdict(tmp_path: Path, matrix: Matrix) -> None:
    _run(tmp_path, matrix, "r1", _cell(OLD, "fail", 10.0))
    _run(tmp_path, matrix, "r2", _preflight(OLD), _preflight(NEW))
    latest = store.load_results(tmp_path / "latest" / "results.json")
    assert [(c.id, c.state, c.run) for c in latest.cells if c.state != CellState.NA] == [
        (OLD, "fail", "r1"),  # the full verdict stays
        (NEW, "partial", ""),  # a cell with nothing fuller shows the preflight's
    ]
    # A full run of it replaces it again.
    _run(tmp_path, matrix, "r3", _cell(OLD, "pass", 10.0))
    latest = store.load_results(tmp_path / "latest" / "results.json")
    assert next((c.id, c.state, c.run) for c in latest.cells if c.state != CellState.NA) == (OLD, "pass", "")


def test_a_latest_folder_locked_too_long_is_left_as_it_is_naming_who_holds_it(
    tmp_path: Path, matrix: Matrix, monkeypatch: pytest.MonkeyPatch
) -> None:
    import fcntl
    import os

    _run(tmp_path, matrix, "r1", _cell(OLD, "pass", 10.0))
    assert not (tmp_path / "latest" / ".writer").exists()  # said only while the lock is held
    monkeypatch.setattr(latest_folder, "LATEST_WAIT", 0.5)
    holder = os.open(tmp_path / "latest", os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX)  # another writer, stuck
        (tmp_path / "latest" / ".writer").write_text("pid 4242 on box (run r0)\n", encoding="utf-8")
        results = store.load_results(tmp_path / "runs" / "r1" / "results.json")
        with pytest.raises(store.StaleRun, match=r"is being written by pid 4242 on box \(run r0\) and stayed locked"):
            store.write_latest(tmp_path / "latest", results)
    finally:
        os.close(holder)
