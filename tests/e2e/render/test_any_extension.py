"""Any torch extension: a matrix of torch × torchvision × xformers (no SGLang, no kernels of its) validates,
expands, runs through the runner's one loop, and renders a grid and the answers.

The stages stand in for the real ones with the verdicts such a stack gets: torchvision pins torch exactly
(0.24.1: torch==2.9.1, 0.23.0: torch==2.8.0), and an xformers built against torch 2.9 misses a symbol of 2.8.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from compatlab import envs
from compatlab.cells import expand, planned
from compatlab.config.axes import AXIS_KINDS, NON_PACKAGE_AXES
from compatlab.config.matrix import Matrix, Report, load_matrix
from compatlab.host import host_facts
from compatlab.render import render_run
from compatlab.render._grid import AXIS_TITLES, load
from compatlab.render.answers import answers
from compatlab.runner import run_cell
from compatlab.runs import store
from compatlab.runs.info import REPORT_DEFAULTS
from compatlab.runs.model import StageResult, StageState
from compatlab.stages import CellContext, Installed, Stage

ROOT = Path(__file__).resolve().parents[3]
TORCHVISION = {"0.23.0": "2.8.0", "0.24.1": "2.9.1"}  # torchvision pins torch exactly
SYMBOL = "xformers/_C.so: undefined symbol c10::cuda::c10_cuda_check_implementation(int, char const*, bool)"

MATRIX = """
[axes]
torch = ["2.8.0", "2.9.1"]
torchvision = ["0.23.0", "0.24.1"]
xformers = ["0.0.32", "0.0.33"]
cuda = "12.8"
"""


def install(ctx: CellContext) -> Installed:
    plan = envs.install_plan(ctx.matrix, ctx.cell, python=Path(".venvs/c/bin/python"), spec_dir=Path("spec"))
    axes = ctx.cell.axes
    if TORCHVISION[axes["torchvision"]] != axes["torch"]:
        pin = f"torch=={TORCHVISION[axes['torchvision']]}"
        failed = StageResult(
            name="install", state=StageState.FAIL, reason=f"unsatisfiable: torchvision {axes['torchvision']} pins {pin}"
        )
        return Installed(result=failed, install=plan.record())
    return Installed(result=StageResult(name="install", state=StageState.PASS), install=plan.record())


def imports(ctx: CellContext) -> StageResult:
    if ctx.cell.axes.get("xformers") == "0.0.33" and ctx.cell.axes["torch"] == "2.8.0":
        return StageResult(name="import", state=StageState.FAIL, reason=SYMBOL)
    return StageResult(name="import", state=StageState.PASS)


def no_gpu(ctx: CellContext) -> StageResult:
    return StageResult(name="cuda", state=StageState.SKIP, reason="no GPU on this machine", required=True)


STAGES = (
    Stage(name="install", run=install),
    Stage(name="import", run=imports, needs=("install",)),
    Stage(name="cuda", run=no_gpu, needs=("install",)),
)


def matrix_of(tmp_path: Path, text: str) -> Matrix:
    path = tmp_path / "matrix.toml"
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return load_matrix(path)


def run_matrix(tmp_path: Path, matrix: Matrix) -> Path:
    with store.claim_run(tmp_path / "run", run_id="run", plan=planned(matrix), host=host_facts) as run:
        for cell in expand(matrix):
            run_cell(matrix, cell, run=run, venv_root=tmp_path / "venvs", stages=STAGES)
        run.aggregate(planned(matrix), latest=None)
    return run.results_path


def test_a_torch_torchvision_xformers_matrix_renders_a_grid_and_the_answers(tmp_path: Path) -> None:
    matrix = matrix_of(tmp_path, MATRIX)
    assert matrix.report == Report(rows=("torch",), columns=("torchvision", "xformers"), tables=("cuda",))
    cells = expand(matrix)
    assert [c.id for c in cells if not c.force] == [
        "torch2.8.0-torchvision0.23.0-xformers0.0.32-cuda12.8",
        "torch2.8.0-torchvision0.23.0-xformers0.0.33-cuda12.8",
        "torch2.8.0-torchvision0.24.1-xformers0.0.32-cuda12.8",
        "torch2.8.0-torchvision0.24.1-xformers0.0.33-cuda12.8",
        "torch2.9.1-torchvision0.23.0-xformers0.0.32-cuda12.8",
        "torch2.9.1-torchvision0.23.0-xformers0.0.33-cuda12.8",
        "torch2.9.1-torchvision0.24.1-xformers0.0.32-cuda12.8",
        "torch2.9.1-torchvision0.24.1-xformers0.0.33-cuda12.8",
    ]
    results = run_matrix(tmp_path, matrix)
    found = answers(load(results))
    assert found.newest is not None
    assert found.newest.id == "torch2.9.1-torchvision0.24.1-xformers0.0.33-cuda12.8"
    assert found.command == "uv pip install torch==2.9.1 torchvision==0.24.1 xformers==0.0.33"
    assert [n.sentence for n in found.neighbours] == [
        f"xformers 0.0.33 fails at import ({SYMBOL}) with torch 2.8.0 · torchvision 0.23.0; xformers 0.0.32 passes "
        "what ran here (partial: no GPU stage ran)",
        "torch 2.8.0 fails at install (unsatisfiable: torchvision 0.24.1 pins torch==2.9.1) with torchvision 0.24.1 · "
        "xformers 0.0.32; torch 2.9.1 passes what ran here (partial: no GPU stage ran)",
        "torch 2.8.0 fails at install (unsatisfiable: torchvision 0.24.1 pins torch==2.9.1) with torchvision 0.24.1 · "
        "xformers 0.0.33; torch 2.9.1 passes what ran here (partial: no GPU stage ran)",
        "torchvision 0.23.0 fails at install (unsatisfiable: torchvision 0.23.0 pins torch==2.8.0) with torch 2.9.1 · "
        "xformers 0.0.32; torchvision 0.24.1 passes what ran here (partial: no GPU stage ran)",
        "torchvision 0.23.0 fails at install (unsatisfiable: torchvision 0.23.0 pins torch==2.8.0) with torch 2.9.1 · "
        "xformers 0.0.33; torchvision 0.24.1 passes what ran here (partial: no GPU stage ran)",
    ]
    render_run(results, tmp_path / "out", history_dir=None)
    md = (tmp_path / "out" / "compat.md").read_text(encoding="utf-8")
    grid = md.split("## CUDA 12.8\n\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert grid[0] == (
        "| torch | torchvision 0.23.0 · xformers 0.0.32 | torchvision 0.23.0 · xformers 0.0.33 | "
        "torchvision 0.24.1 · xformers 0.0.32 | torchvision 0.24.1 · xformers 0.0.33 |"
    )
    assert [row.split(" | ")[0] for row in grid[2:]] == ["| **2.8.0**", "| **2.9.1**"]
    data = json.loads((tmp_path / "out" / "answers.json").read_text(encoding="utf-8"))
    assert data["newest"]["axes"] == {"torch": "2.9.1", "torchvision": "0.24.1", "xformers": "0.0.33", "cuda": "12.8"}


def test_torch_and_torchvision_alone_are_a_matrix(tmp_path: Path) -> None:
    matrix = matrix_of(tmp_path, MATRIX.replace('xformers = ["0.0.32", "0.0.33"]\n', ""))
    assert [c.id for c in expand(matrix)] == [
        "torch2.8.0-torchvision0.23.0-cuda12.8",
        "torch2.8.0-torchvision0.24.1-cuda12.8",
        "torch2.9.1-torchvision0.23.0-cuda12.8",
        "torch2.9.1-torchvision0.24.1-cuda12.8",
    ]
    results = run_matrix(tmp_path, matrix)
    found = answers(load(results))
    assert found.newest is not None
    assert found.newest.id == "torch2.9.1-torchvision0.24.1-cuda12.8"
    render_run(results, tmp_path / "out", history_dir=None)
    html = (tmp_path / "out" / "index.html").read_text(encoding="utf-8")
    assert "torchvision 0.24.1" in html
    assert ("sgl-kernel" in html, "flashinfer" in html) == (False, False)


def test_the_example_of_a_non_sglang_stack_validates() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "compatlab", "validate", "--matrix", str(ROOT / "examples" / "torchvision.toml")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=ROOT,
    )
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    matrix = load_matrix(ROOT / "examples" / "torchvision.toml")
    assert [a.name for a in matrix.axes] == ["torch", "torchvision", "cuda"]


def test_render_names_the_kinds_as_the_table_does() -> None:
    # render/ reads runs/ only: its titles and default layout repeat the table's, and must agree with it.
    assert set(AXIS_TITLES) == NON_PACKAGE_AXES
    default = Report()
    assert {"rows": default.rows, "columns": default.columns, "tables": default.tables} == REPORT_DEFAULTS
    assert all(AXIS_KINDS[a].required for a in (*default.rows, *default.tables))
