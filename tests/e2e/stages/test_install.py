"""The install stage makes each cell's venv with the cell's own interpreter (the python axis), with real uv.

uv looks for an interpreter on PATH and among its own installs, and never downloads one here
(``UV_PYTHON_DOWNLOADS=never``). The Pythons this machine has (the one running the tests, /usr/bin's, pyenv's
versions) are put on PATH as ``python3.X``, as a box owner's would be; torch is a tiny wheel on a loopback index.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from compatlab import envs
from compatlab.cells import Cell, expand, planned
from compatlab.config.matrix import Matrix, load_matrix
from compatlab.host import host_facts
from compatlab.runner import run_cell
from compatlab.runs import store
from compatlab.runs.model import CellResult, CellState
from compatlab.runs.records.install import InstallDetails
from compatlab.stages import PIPELINE
from compatlab.venvs import cell_venv
from fixtures.labutil import uv_dir
from fixtures.wheels import build_wheel, serve, write_simple_index

INSTALL = PIPELINE[:1]


def _minor(python: str) -> str | None:
    """``3.12`` for a working interpreter of 3.10 or newer, else None."""
    try:
        done = subprocess.run(
            [python, "-I", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except OSError:
        return None
    version = done.stdout.strip()
    if done.returncode != 0 or not re.fullmatch(r"3\.\d+", version) or int(version.split(".")[1]) < 10:
        return None
    return version


def interpreters() -> dict[str, str]:
    """Minor version -> one interpreter of it, of those this machine has."""
    candidates = [
        *sorted(map(str, Path("/usr/bin").glob("python3.*"))),
        *sorted(map(str, (Path.home() / ".pyenv" / "versions").glob("*/bin/python3.*"))),
        sys.executable,
    ]
    found: dict[str, str] = {}
    for candidate in candidates:
        if candidate != sys.executable and not re.fullmatch(r"python3\.\d+", Path(candidate).name):
            continue
        minor = _minor(candidate)
        if minor is not None:
            found.setdefault(minor, candidate)
    return found


PYTHONS = interpreters()
TWO = sorted(PYTHONS, key=lambda v: int(v.split(".")[1]))[-2:]


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("index")
    write_simple_index(root, [build_wheel(root / "wheels", "torch", "2.9.1")])
    with serve(root) as base:
        yield base


@pytest.fixture(autouse=True)
def pythons_on_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    bin_dir = tmp_path / "pythons"
    bin_dir.mkdir()
    for minor, python in PYTHONS.items():
        (bin_dir / f"python{minor}").symlink_to(python)
    monkeypatch.setenv("PATH", os.pathsep.join([str(bin_dir), uv_dir(), os.environ["PATH"]]))
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    monkeypatch.setenv("UV_PYTHON_DOWNLOADS", "never")


def matrix_of(tmp_path: Path, url: str, pythons: list[str]) -> Matrix:
    path = tmp_path / "matrix.toml"
    path.write_text(
        textwrap.dedent(f"""
        [axes]
        torch = "2.9.1"
        cuda = "12.8"
        python = {pythons!r}
        [install]
        index-url = "{url}/simple"
        retries = 0
        """),
        encoding="utf-8",
    )
    return load_matrix(path)


def install(tmp_path: Path, matrix: Matrix) -> list[tuple[Cell, CellResult]]:
    out = []
    with store.claim_run(tmp_path / "run", run_id="run", plan=planned(matrix), host=host_facts) as run:
        for cell in expand(matrix):
            out.append((cell, run_cell(matrix, cell, run=run, venv_root=tmp_path / "venvs", stages=INSTALL)))
    return out


@pytest.mark.skipif(
    len(TWO) < 2,
    reason=f"this machine has one Python of 3.10 or newer ({', '.join(PYTHONS)}); two cells of a python axis need two",
)
def test_each_cell_of_a_python_axis_gets_its_own_interpreter(tmp_path: Path, url: str) -> None:
    matrix = matrix_of(tmp_path, url, TWO)
    done = install(tmp_path, matrix)
    assert [(c.id, c.python) for c, _ in done] == [(f"torch2.9.1-cuda12.8-python{v}", v) for v in TWO]
    got = []
    for cell, result in done:
        assert [(s.name, s.state) for s in result.stages] == [("install", "pass")], result.stages[0].reason
        python = cell_venv(tmp_path / "venvs", "run", cell) / "bin" / "python"
        got.append(_minor(str(python)))
        assert (python.parent.parent / "lib" / f"python{cell.python}" / "site-packages" / "torch").is_dir()
    assert got == TWO


def test_a_cell_whose_interpreter_cannot_be_found_is_an_error_naming_it(tmp_path: Path, url: str) -> None:
    matrix = matrix_of(tmp_path, url, ["3.99", *TWO[-1:]])
    (missing, result), (_, found) = install(tmp_path, matrix)
    assert (missing.python, result.state) == ("3.99", "error")
    assert result.reason == (
        "install: no Python 3.99 interpreter on this machine (the cell's python axis; uv looks on PATH and in "
        "its own installs, and downloads none here): install Python 3.99 where uv finds it, or remove 3.99 "
        "from axes.python"
    )
    assert found.state != CellState.ERROR, found.reason


def test_a_lab_bug_after_uv_installed_keeps_what_uv_did(
    tmp_path: Path, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The venv is made and torch installed; reading it back then fails (a lab bug): the cell's install stage is
    an error naming it, and the cell keeps the install record and uv's output, as a cell that passed would."""

    def broken(python: Path) -> object:
        raise RuntimeError(f"freeze of {python.name} broke")

    monkeypatch.setattr(envs, "freeze", broken)
    ((_cell, result),) = install(tmp_path, matrix_of(tmp_path, url, TWO[-1:]))
    (stage,) = result.stages
    assert (stage.state, stage.reason) == ("error", "lab error: RuntimeError('freeze of python broke')")
    assert result.install is not None
    assert "torch==2.9.1" in result.install.requirements
    details = InstallDetails.of(stage)
    assert details.argv[1:3] == ("pip", "install")
    assert details.uv_seconds is not None
