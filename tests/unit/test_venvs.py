"""An earlier run's venv of a cell leaves the cell's critical path: set aside at once, removed beside the stages."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from compatlab.cells import expand
from compatlab.cli.matrix import end_line
from compatlab.config.matrix import parse_matrix
from compatlab.runs.model import CellResult, CellState, StageResult, StageState
from compatlab.venvs import TRASH, cell_venv, own_venv

MATRIX = {"axes": {"torch": ["2.9.1"], "sgl-kernel": ["0.3.21"], "flashinfer": ["0.6.4"], "cuda": ["12.8"]}}


def test_the_old_venv_is_removed_while_the_cell_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cell = expand(parse_matrix(MATRIX))[0]
    old = cell_venv(tmp_path, "run-a", cell)
    (old / "lib" / "site-packages" / "torch").mkdir(parents=True)
    (old / "lib" / "site-packages" / "torch" / "libtorch.so").write_bytes(b"\0" * 1024)
    real_rmtree = shutil.rmtree

    def slow_rmtree(path: Any, *args: Any, **kwargs: Any) -> None:
        time.sleep(1.0)  # a torch venv of hard links: 9-27 s
        real_rmtree(path, *args, **kwargs)

    monkeypatch.setattr(shutil, "rmtree", slow_rmtree)
    t0 = time.monotonic()
    with own_venv(tmp_path, "run-b", cell) as venv:
        entered = time.monotonic() - t0
        assert venv == cell_venv(tmp_path, "run-b", cell)
        assert not old.exists()  # set aside
        assert len(list((tmp_path / TRASH).iterdir())) == 1
    assert entered < 0.5
    assert time.monotonic() - t0 >= 1.0  # the cell waited for the removal at its end
    assert list((tmp_path / TRASH).iterdir()) == []


def test_the_end_line_says_what_the_cell_spent_outside_its_stages() -> None:
    result = CellResult(
        id="c",
        axes={},
        state=CellState.PARTIAL,
        seconds=60.04,
        reason="cuda: no NVIDIA driver",
        stages=(
            StageResult(name="install", state=StageState.PASS, seconds=30.0),
            StageResult(name="import", state=StageState.PASS, seconds=17.5),
        ),
    )
    assert end_line(result) == "[compatlab] end   c: PARTIAL in 60.0 s (12.5 s outside stages) — cuda: no NVIDIA driver"
