"""The runner: each run owns its cells' venvs; one loop runs every stage, install first."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from compatlab.cells import expand, planned
from compatlab.config.matrix import parse_matrix
from compatlab.host import host_facts
from compatlab.runner import run_cell
from compatlab.runs import store
from compatlab.runs.model import StageResult, StageState
from compatlab.stages import PIPELINE, CellContext, Stage
from compatlab.venvs import cell_venv, own_venv

MATRIX = {
    "axes": {"torch": ["2.9.1"], "sgl-kernel": ["0.3.21"], "flashinfer": ["0.6.4"], "cuda": ["12.8"]},
    "install": {"retries": 0},
}


def test_two_runs_never_share_a_venv(tmp_path: Path) -> None:
    cell = expand(parse_matrix(MATRIX))[0]
    assert cell_venv(tmp_path, "run-a", cell) != cell_venv(tmp_path, "run-b", cell)
    assert cell_venv(tmp_path, "run-a", cell) == tmp_path / "run-a" / cell.id


def test_a_venv_held_by_a_live_run_is_kept_and_a_released_one_removed(tmp_path: Path) -> None:
    cell = expand(parse_matrix(MATRIX))[0]
    old = cell_venv(tmp_path, "run-a", cell)
    (old / "bin").mkdir(parents=True)
    lock = old.with_name(old.name + ".lock")
    # Another process (a concurrent run) holds run-a's venv of this cell.
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
                "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)"
            ),
            str(lock),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == "held\n"
        with own_venv(tmp_path, "run-b", cell) as venv:
            assert venv == cell_venv(tmp_path, "run-b", cell)
        assert old.is_dir()
    finally:
        holder.kill()
        holder.communicate()
    time.sleep(0.1)
    with own_venv(tmp_path, "run-c", cell):
        pass
    assert not old.exists()


def test_install_is_the_first_stage_and_a_red_install_blocks_the_rest_in_one_spelling(tmp_path: Path) -> None:
    assert [s.name for s in PIPELINE][:2] == ["install", "pins"]
    matrix = parse_matrix(MATRIX)
    cell = expand(matrix)[0]

    def broken_install(ctx: CellContext) -> StageResult:
        return StageResult(name="install", state=StageState.FAIL, reason="no matching distribution")

    def never(ctx: CellContext) -> StageResult:
        raise AssertionError("a blocked stage ran")

    stages = (
        Stage(name="install", run=broken_install),
        Stage(name="pins", run=never, needs=("install",)),
        Stage(name="static", run=never, needs=("install", "pins")),
    )
    with store.claim_run(tmp_path / "run", run_id="run", plan=planned(matrix), host=host_facts) as run:
        result = run_cell(matrix, cell, run=run, venv_root=tmp_path / "venvs", stages=stages)
    assert [(s.name, s.state, s.reason) for s in result.stages] == [
        ("install", "fail", "no matching distribution"),
        ("pins", "skip", "blocked: install failed"),
        ("static", "skip", "blocked: install failed, pins was skipped"),
    ]
    assert (result.state, result.reason) == ("fail", "install: no matching distribution")
