"""Where a cell's Python processes keep their bytecode (stages/bytecode.py): outside the environment, one
folder per stack and environment, none where the environment has its own."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from compatlab.cells import expand
from compatlab.config.matrix import load_matrix
from compatlab.incell.proc import module_command
from compatlab.stages import CellContext
from compatlab.stages.bytecode import IN_VENV, bytecode_env, bytecode_folder, has_own_bytecode
from fixtures.matrices import ONE_CELL


def _site(root: Path, packages: int, compiled: int, tag: str = "cpython-312") -> Path:
    site = root / "lib" / "python3.12" / "site-packages"
    for i in range(packages):
        pkg = site / f"pkg{i:02d}"
        pkg.mkdir(parents=True)
        (pkg / "__init__.py").write_text("", encoding="utf-8")
        if i < compiled:
            (pkg / "__pycache__").mkdir()
            (pkg / "__pycache__" / f"__init__.{tag}.pyc").write_bytes(b"")
    (site / "dist-0.1.dist-info").mkdir(parents=True, exist_ok=True)
    return site


def _context(tmp_path: Path, site: Path, *, caches: Path | None = None) -> CellContext:
    toml = tmp_path / "matrix.toml"
    toml.write_text(ONE_CELL.format(torch="https://download.example", url="https://pypi.example"), encoding="utf-8")
    matrix = load_matrix(toml, use_lock=False)
    venv = site.parents[2]
    return CellContext(
        matrix=matrix,
        cell=expand(matrix)[0],
        venv=venv,
        python=venv / "bin" / "python",
        work_dir=tmp_path / "work",
        site_packages=site,
        caches=caches,
    )


@pytest.mark.parametrize(
    ("packages", "compiled", "tag", "own"),
    [
        (10, 10, "cpython-312", True),  # pip compiled it at install
        (10, 5, "cpython-312", True),  # half: most modules read their own
        (10, 4, "cpython-312", False),
        (10, 0, "cpython-312", False),  # uv installs none
        (10, 10, "cpython-311", False),  # another Python's bytecode is no help
        (0, 0, "cpython-312", None),  # nothing to tell by
    ],
)
def test_an_environment_has_its_own_bytecode_where_most_packages_hold_this_pythons(
    tmp_path: Path, packages: int, compiled: int, tag: str, own: bool | None
) -> None:
    assert has_own_bytecode(_site(tmp_path, packages, compiled, tag)) is own


def test_a_matrix_cells_bytecode_is_in_its_venv_and_an_existing_ones_in_the_cache_by_stack(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COMPATLAB_CACHE", str(tmp_path / "cache"))
    site = _site(tmp_path / "env", 3, 0)
    matrix_cell = _context(tmp_path, site, caches=tmp_path / "venvs")
    assert bytecode_folder(matrix_cell) == matrix_cell.venv / IN_VENV

    existing = _context(tmp_path, site)
    folder = bytecode_folder(existing)
    assert folder is not None
    assert folder.parent == tmp_path / "cache" / "bytecode"
    assert bytecode_folder(existing) == folder  # kept between checks
    # Another stack in the same place, or the same stack elsewhere: another folder.
    assert bytecode_folder(dataclasses.replace(existing, freeze=("torch==2.9.1",))) not in (folder, None)
    elsewhere = _context(tmp_path, _site(tmp_path / "env2", 3, 0))
    assert bytecode_folder(elsewhere) not in (folder, None)
    # An environment with its own bytecode is read as it is.
    assert bytecode_folder(_context(tmp_path, _site(tmp_path / "pip-env", 4, 4))) is None


def test_a_cell_process_writes_bytecode_to_its_folder_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMPATLAB_CACHE", str(tmp_path / "cache"))
    inherited = {"PATH": "/usr/bin", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPYCACHEPREFIX": "/elsewhere"}
    ctx = _context(tmp_path, _site(tmp_path / "env", 3, 0))
    env = bytecode_env(ctx, inherited)
    assert "PYTHONDONTWRITEBYTECODE" not in env
    assert env["PYTHONPYCACHEPREFIX"] == str(bytecode_folder(ctx))
    assert Path(env["PYTHONPYCACHEPREFIX"]).is_dir()
    assert inherited["PYTHONPYCACHEPREFIX"] == "/elsewhere"  # the caller's copy is left alone

    own = bytecode_env(_context(tmp_path, _site(tmp_path / "pip-env", 2, 2)), inherited)
    assert (own["PYTHONDONTWRITEBYTECODE"], "PYTHONPYCACHEPREFIX" in own) == ("1", False)

    # A cache that is a file: no folder, no bytecode written, the same verdicts.
    (tmp_path / "blocked").write_text("", encoding="utf-8")
    monkeypatch.setenv("COMPATLAB_CACHE", str(tmp_path / "blocked"))
    blocked = bytecode_env(_context(tmp_path, _site(tmp_path / "env3", 3, 0)), inherited)
    assert (blocked["PYTHONDONTWRITEBYTECODE"], "PYTHONPYCACHEPREFIX" in blocked) == ("1", False)


def test_an_incell_command_writes_bytecode_only_where_it_is_given_a_folder() -> None:
    assert module_command("py", "probe", root="/r").argv[:5] == ["py", "-E", "-s", "-B", "-u"]
    given = module_command("py", "probe", root="/r", bytecode="/cache/bc").argv
    assert given[:6] == ["py", "-E", "-s", "-X", "pycache_prefix=/cache/bc", "-u"]


def test_a_venv_over_compiled_system_packages_whose_own_has_none_gets_the_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The H200 box's cell: a venv with --system-site-packages over a pip-made torch (bytecode beside it), its
    own site-packages the SGLang stack uv installed (none). The stage named the system's site-packages, which
    has its own, and the servers compiled SGLang from source at every start."""
    monkeypatch.setenv("COMPATLAB_CACHE", str(tmp_path / "cache"))
    system = _site(tmp_path / "system", 6, 6)
    cell = _site(tmp_path / "cell", 6, 0)
    ctx = dataclasses.replace(
        _context(tmp_path, system), venv=cell.parents[2], python=cell.parents[2] / "bin" / "python"
    )
    assert bytecode_folder(ctx) is not None
    compiled = _site(tmp_path / "compiled-cell", 6, 6)
    both = dataclasses.replace(ctx, venv=compiled.parents[2])
    assert bytecode_folder(both) is None


def test_an_empty_site_packages_beside_a_compiled_one_tells_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A system Python (``check --python /usr/bin/python3``) whose packages pip or the distribution compiled,
    beside an empty site-packages folder of its prefix: read as it is, not compiled again into a folder."""
    monkeypatch.setenv("COMPATLAB_CACHE", str(tmp_path / "cache"))
    system = _site(tmp_path / "usr", 6, 6)
    empty = tmp_path / "prefix" / "lib" / "python3.12" / "site-packages"
    empty.mkdir(parents=True)
    ctx = dataclasses.replace(_context(tmp_path, system), venv=tmp_path / "prefix")
    assert bytecode_folder(ctx) is None
