"""The install stage's outcome (stages/base.py's ``Installed``): the stages after it read what it made from their
own, frozen context; the runner's loop carries it there, and into the cell's result."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from compatlab import runner
from compatlab.cells import expand
from compatlab.config.matrix import load_matrix
from compatlab.runs.model import InstallRecord, StageResult, StageState
from compatlab.stages import CellContext, Installed, Stage
from fixtures.matrices import ONE_CELL

RECORD = InstallRecord(argv=("uv", "pip", "install", "torch==2.9.1"), requirements=("torch==2.9.1",))


def _context(tmp_path: Path) -> CellContext:
    toml = tmp_path / "matrix.toml"
    toml.write_text(ONE_CELL.format(torch="https://download.example", url="https://pypi.example"), encoding="utf-8")
    matrix = load_matrix(toml, use_lock=False)
    return CellContext(
        matrix=matrix, cell=expand(matrix)[0], venv=tmp_path, python=tmp_path / "python", work_dir=tmp_path
    )


def test_a_context_is_frozen(tmp_path: Path) -> None:
    ctx = _context(tmp_path)
    with pytest.raises(dataclasses.FrozenInstanceError):
        ctx.install = RECORD  # type: ignore[misc]


def test_what_an_install_made_is_the_context_after_it(tmp_path: Path) -> None:
    ctx = _context(tmp_path)
    made = Installed(
        result=StageResult(name="install", state=StageState.PASS),
        install=RECORD,
        site_packages=tmp_path / "lib" / "python3.12" / "site-packages",
        freeze=("torch==2.9.1",),
    )
    after = made.after(ctx)
    assert (after.install, after.site, after.freeze) == (RECORD, made.site_packages, ("torch==2.9.1",))
    assert dataclasses.replace(after, install=None, site_packages=None, freeze=()) == ctx
    assert (ctx.install, ctx.site_packages, ctx.freeze) == (None, None, ())


def test_the_loop_gives_the_later_stages_what_the_install_made_and_the_result_keeps_it(tmp_path: Path) -> None:
    site = tmp_path / "site-packages"
    seen: list[tuple[InstallRecord | None, Path, tuple[str, ...], tuple[str, ...]]] = []

    def install(_ctx: CellContext) -> Installed:
        done = StageResult(name="install", state=StageState.PASS)
        return Installed(result=done, install=RECORD, site_packages=site, freeze=("torch==2.9.1",))

    def pins(ctx: CellContext) -> StageResult:
        seen.append((ctx.install, ctx.site, ctx.freeze, tuple(s.name for s in ctx.previous)))
        return StageResult(name="pins", state=StageState.PASS)

    stages = (Stage(name="install", run=install), Stage(name="pins", run=pins, needs=("install",)))
    ctx = _context(tmp_path)
    after = runner.run_pipeline(ctx, stages)
    assert seen == [(RECORD, site, ("torch==2.9.1",), ("install",))]
    assert [(s.name, s.state) for s in after.previous] == [("install", StageState.PASS), ("pins", StageState.PASS)]
    assert ctx.previous == ()  # the context it was given is as it was
    result = runner.conclude(after, expected=None, started="2026-01-01T00:00:00+00:00", seconds=1.0)
    assert (result.install, result.freeze) == (RECORD, ("torch==2.9.1",))


def test_a_failed_install_leaves_no_site_packages_and_blocks_the_stages_after_it(tmp_path: Path) -> None:
    def install(_ctx: CellContext) -> Installed:
        failed = StageResult(name="install", state=StageState.FAIL, reason="unsatisfiable: torch==9")
        return Installed(result=failed, install=RECORD)

    def never(_ctx: CellContext) -> StageResult:
        raise AssertionError("a blocked stage ran")

    stages = (Stage(name="install", run=install), Stage(name="pins", run=never, needs=("install",)))
    after = runner.run_pipeline(_context(tmp_path), stages)
    assert [(s.name, s.state, s.reason) for s in after.previous] == [
        ("install", StageState.FAIL, "unsatisfiable: torch==9"),
        ("pins", StageState.SKIP, "blocked: install failed"),
    ]
    assert (after.install, after.site_packages, after.freeze) == (RECORD, None, ())
    said = f"{after.cell.id}: no site-packages yet (the install stage has not passed)"
    with pytest.raises(LookupError, match=f"^{re.escape(said)}$"):
        _ = after.site
