"""A run id is a name, never a path (issue 33): `..`, an absolute path or 300 characters is one line and exit
2 before anything is written, from nox's COMPATLAB_RUN_ID and from `compatlab cell --run-id` alike."""

from __future__ import annotations

from pathlib import Path

import pytest

from compatlab.cli import main
from fixtures.labutil import nox
from fixtures.matrices import EXPECTED_ONLY

CELL = "torch2.9.1+cu130-sglkernel0.3.21-flashinfer0.6.4-cuda13.0"


@pytest.mark.parametrize("run_id", ["../escape", "/tmp/elsewhere", "a" * 300, "."])
def test_a_run_id_that_is_a_path_is_refused_before_anything_is_written(tmp_path: Path, run_id: str) -> None:
    work = tmp_path / "work"
    work.mkdir()
    done = nox(work, EXPECTED_ONLY.format(url="http://127.0.0.1:9"), "-s", "matrix", run_id=run_id)
    assert done.returncode == 2, done.stdout + done.stderr
    [line] = done.stderr.splitlines()
    assert line.startswith("error: COMPATLAB_RUN_ID: ")
    assert sorted(p.name for p in work.iterdir()) == ["matrix.toml"]  # no reports, no venvs
    assert not (tmp_path / "escape").exists()


def test_compatlab_cell_refuses_a_run_id_that_is_a_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "matrix.toml").write_text(EXPECTED_ONLY.format(url="http://127.0.0.1:9"), encoding="utf-8")
    argv = ["cell", CELL, "--matrix", "matrix.toml", "--run-dir", "runs/r1", "--venvs", "venvs"]
    assert main([*argv, "--run-id", "../../up"]) == 2
    assert capsys.readouterr().err.splitlines()[-1].startswith("error: run id: '../../up' is not a name: ")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["matrix.toml"]
