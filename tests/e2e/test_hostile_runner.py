"""The runner's stage deadline: a stage that never ends (a parser loop, an open() of a FIFO, a subprocess that
hangs) becomes an ``error`` stage at its deadline, its subprocess killed, and the cell goes on."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from compatlab import runner
from compatlab.cells import expand, planned
from compatlab.config.matrix import parse_matrix
from compatlab.host import host_facts
from compatlab.proc import run
from compatlab.runs import store
from compatlab.runs.model import CellState, StageResult, StageState
from compatlab.stages import CellContext, Stage
from fixtures.hostile import hard_deadline

MATRIX = {
    "axes": {"torch": ["2.9.1"], "sgl-kernel": ["0.3.21"], "flashinfer": ["0.6.4"], "cuda": ["12.8"]},
    "install": {"retries": 0},
}


def test_a_stage_past_its_deadline_is_an_error_and_the_cell_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runner, "STAGE_SECONDS", {"spin": 0.5, "fifo": 0.5, "sleep": 0.5}, raising=False)
    fifo = tmp_path / "libfifo.so"
    os.mkfifo(fifo)
    matrix = parse_matrix(MATRIX)
    cell = expand(matrix)[0]

    def spin(ctx: CellContext) -> StageResult:
        while True:
            try:
                time.sleep(0.01)
            except Exception:  # noqa: BLE001, S112 - a stage's own broad handler must not swallow the deadline
                continue

    def blocked_open(ctx: CellContext) -> StageResult:
        with fifo.open("rb"):  # no writer ever comes
            return StageResult(name="fifo", state=StageState.PASS)

    def hung_child(ctx: CellContext) -> StageResult:
        run(["sleep", "60"], timeout=600)
        return StageResult(name="sleep", state=StageState.PASS)

    def fine(ctx: CellContext) -> StageResult:
        return StageResult(name="after", state=StageState.PASS)

    stages = (
        Stage(name="spin", run=spin),
        Stage(name="fifo", run=blocked_open),
        Stage(name="sleep", run=hung_child),
        Stage(name="after", run=fine),
    )
    start = time.monotonic()
    with (
        hard_deadline(20, "stages that never end"),
        store.claim_run(tmp_path / "run", run_id="run", plan=planned(matrix), host=host_facts) as folder,
    ):
        result = runner.run_cell(matrix, cell, run=folder, venv_root=tmp_path / "venvs", stages=stages)
    assert time.monotonic() - start < 10
    assert [(s.name, s.state, s.reason) for s in result.stages] == [
        ("spin", "error", "the spin stage ran past its 0.5 s deadline"),
        ("fifo", "error", "the fifo stage ran past its 0.5 s deadline"),
        ("sleep", "error", "the sleep stage ran past its 0.5 s deadline"),
        ("after", "pass", ""),
    ]
    assert result.state == CellState.ERROR
