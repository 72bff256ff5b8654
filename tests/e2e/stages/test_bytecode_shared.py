"""The bytecode of what every matrix cell imports from outside its venv (the standard library, the lab's
in-cell code) is compiled by the first cell and read by the others (stages/bytecode.py), by real interpreters."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from compatlab.cells import expand
from compatlab.config.matrix import load_matrix
from compatlab.proc import incell_path
from compatlab.stages import CellContext
from compatlab.stages.base import cell_env
from compatlab.stages.bytecode import IN_VENV, SHARED, bytecode_env
from fixtures.matrices import ONE_CELL

TAG = sys.implementation.cache_tag
STDLIB = Path(sysconfig.get_paths()["stdlib"])


def _cell(tmp_path: Path, name: str) -> CellContext:
    venvs = tmp_path / "venvs"
    venv = venvs / "r1" / name
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    toml = tmp_path / "matrix.toml"
    toml.write_text(ONE_CELL.format(torch="https://download.example", url="https://pypi.example"), encoding="utf-8")
    matrix = load_matrix(toml, use_lock=False)
    return CellContext(
        matrix=matrix,
        cell=expand(matrix)[0],
        venv=venv,
        python=venv / "bin" / "python",
        work_dir=tmp_path / "work" / name,
        caches=venvs,
    )


def _import(ctx: CellContext) -> None:
    env = bytecode_env(ctx, cell_env(ctx.venv))
    code = "import decimal, email.mime.text, json, compatlab.incell.files"
    env["PYTHONPATH"] = str(incell_path())
    subprocess.run([str(ctx.python), "-c", code], env=env, check=True, timeout=120)


def _own(ctx: CellContext) -> list[str]:
    """The bytecode files in the cell's own folder, not through its links."""
    folder = ctx.venv / IN_VENV
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*.pyc") if not _through_link(p, folder))


def _through_link(path: Path, top: Path) -> bool:
    return any((top / parent).is_symlink() for parent in path.relative_to(top).parents if str(parent) != ".")


@pytest.mark.skipif(not (STDLIB / "os.py").is_file(), reason="this interpreter's standard library is not in a folder")
def test_the_second_cell_reads_the_first_cells_standard_library_bytecode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COMPATLAB_CACHE", str(tmp_path / "cache"))
    first, second = _cell(tmp_path, "a"), _cell(tmp_path, "b")
    _import(first)
    shared = tmp_path / "venvs" / SHARED
    json_pyc = shared / STDLIB.relative_to(STDLIB.anchor) / "json" / f"__init__.{TAG}.pyc"
    assert json_pyc.is_file()
    incell = list(shared.rglob(f"files.{TAG}.pyc"))
    assert len(incell) == 1
    assert "incell-" in str(incell[0])
    assert _own(first) == []  # nothing of it in the cell's own folder
    written = json_pyc.stat().st_mtime_ns
    _import(second)
    assert json_pyc.stat().st_mtime_ns == written  # read, not compiled again
    assert _own(second) == []
    assert (second.venv / IN_VENV / STDLIB.relative_to(STDLIB.anchor)).is_symlink()


def test_a_venv_whose_interpreter_is_not_found_compiles_into_its_own_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COMPATLAB_CACHE", str(tmp_path / "cache"))
    ctx = _cell(tmp_path, "a")
    cfg = ctx.venv / "pyvenv.cfg"
    cfg.write_text("\n".join(line for line in cfg.read_text().splitlines() if not line.startswith("home")) + "\n")
    env = bytecode_env(ctx, cell_env(ctx.venv))
    subprocess.run([str(ctx.python), "-c", "import json"], env=env, check=True, timeout=120)
    own = _own(ctx)
    assert any(p.endswith(f"json/__init__.{TAG}.pyc") for p in own), own
