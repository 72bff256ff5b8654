"""Forced cells and the sglang axis, with real uv over tiny wheels on loopback.

sglang 0.5.23 and sglang-kernel 0.4.10 pin torch==2.14.1, as on PyPI; torch comes from its own index (as
PyTorch's). The cell with torch 2.15.0 cannot be installed unforced (an answer: fail); forced, each axis
pin is also a uv override and the cell gets exactly its axis versions. The lock (read from the same
indexes by `compatlab lock`'s resolver) names the pins such a cell breaks, and the one cell that is
sglang 0.5.23's own stack.
"""

from __future__ import annotations

import os
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from compatlab import envs, uv_failures
from compatlab.cells import Cell, expand
from compatlab.config.matrix import Matrix, load_matrix
from compatlab.index.lock import resolve, write_lock
from compatlab.runs.model import StageResult, StageState
from compatlab.stages.base import CellContext
from compatlab.stages.pins import run_pins_stage
from compatlab.stages.runtime import blame_broken_pins
from fixtures.labutil import uv_dir
from fixtures.wheels import build_wheel, serve, write_simple_index

NEW = "torch2.15.0-sglangkernel0.4.10-flashinfer0.7.2-sglang0.5.23-cuda13.0"
SHIPPED = "torch2.14.1-sglangkernel0.4.10-flashinfer0.7.2-sglang0.5.23-cuda13.0"


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("force")
    w = root / "wheels"
    write_simple_index(root / "torch", [build_wheel(w, "torch", v) for v in ("2.14.1", "2.15.0")])
    write_simple_index(
        root / "public",
        [
            build_wheel(
                w,
                "sglang",
                "0.5.23",
                requires=["torch==2.14.1", "sglang-kernel==0.4.10", "flashinfer_python[cu13]==0.7.2"],
            ),
            build_wheel(w, "sglang-kernel", "0.4.10", requires=["torch==2.14.1"]),
            build_wheel(w, "flashinfer-python", "0.7.2", requires=["torch"]),
        ],
    )
    with serve(root) as base:
        yield base


@pytest.fixture(autouse=True)
def uv_on_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", f"{uv_dir()}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))


def matrix_of(
    tmp_path: Path, url: str, *, extra: str = "", sglang: bool = True, lock: bool = True, install: str = ""
) -> Matrix:
    path = tmp_path / "matrix.toml"
    path.write_text(
        textwrap.dedent(f"""
        [axes.torch]
        index = "{url}/torch/simple"
        values = ["2.14.1", "2.15.0"]
        [[axes.sglang-kernel]]
        version = "0.4.10"
        [[axes.flashinfer]]
        version = "0.7.2"
        """)
        + ('[[axes.sglang]]\nversion = "0.5.23"\n' if sglang else "")
        + textwrap.dedent(f"""
        [[axes.cuda]]
        version = "13.0"
        [install]
        index-url = "{url}/public/simple"
        """)
        + install
        + textwrap.dedent(extra)
    )
    if lock:
        locked, notes = resolve(load_matrix(path, use_lock=False), timeout=10)
        assert notes == []
        write_lock(locked, matrix_name="matrix.toml")
    return load_matrix(path)


def cell(matrix: Matrix, prefix: str) -> Cell:
    return next(c for c in expand(matrix) if c.id.startswith(prefix))


def install(tmp_path: Path, matrix: Matrix, target: Cell) -> tuple[envs.InstallPlan, bool, str, dict[str, str]]:
    venv = tmp_path / target.id
    assert envs.create_venv(venv, python=None).ok
    spec = tmp_path / f"{target.id}-spec"
    plan = envs.install_plan(matrix, target, python=envs.venv_python(venv), spec_dir=spec)
    envs.write_plan_files(plan, spec)
    done = envs.run_install(plan, timeout=120)
    frozen = envs.parse_freeze(envs.freeze(envs.venv_python(venv)).stdout.splitlines())
    return plan, done.ok, done.stderr, frozen


def test_unforced_the_pin_conflict_is_unsatisfiable_and_the_lock_names_it(tmp_path: Path, url: str) -> None:
    matrix = matrix_of(tmp_path, url, install="force = false\n")
    new = cell(matrix, "torch2.15.0")
    assert (new.force, new.shipped) == (False, "")
    assert new.conflicts == ("sglang-kernel 0.4.10 pins torch==2.14.1", "sglang 0.5.23 pins torch==2.14.1")
    plan, ok, _, _ = install(tmp_path, matrix, new)
    assert not ok
    assert plan.overrides == []
    done = envs.run_install(plan, timeout=120)
    assert uv_failures.classify_uv_failure(done, plan)[0] == "fail"
    shipped = cell(matrix, "torch2.14.1")
    assert (shipped.id, shipped.shipped, shipped.conflicts) == (SHIPPED, "sglang 0.5.23", ())


def test_an_sglang_cell_is_forced_its_axis_pins_win_and_torch_still_comes_from_its_own_index(
    tmp_path: Path, url: str
) -> None:
    matrix = matrix_of(tmp_path, url)
    new = cell(matrix, "torch2.15.0")
    assert (new.id, new.force) == (NEW, True)
    plan, ok, stderr, frozen = install(tmp_path, matrix, new)
    assert ok, stderr
    assert plan.overrides == ["torch==2.15.0", "sglang-kernel==0.4.10", "flashinfer-python==0.7.2", "sglang==0.5.23"]
    # uv drops a package's own index once an override names it: torch is installed from it first.
    assert plan.pre_argv[1:5] == ["pip", "install", "--no-deps", "--python"]
    assert plan.record().to_json()["conflicts"] == [
        "sglang-kernel 0.4.10 pins torch==2.14.1",
        "sglang 0.5.23 pins torch==2.14.1",
    ]
    assert plan.record().to_json()["forced"] is True
    assert {k: frozen[k] for k in ("torch", "sglang", "sglang-kernel", "flashinfer-python")} == {
        "torch": "2.15.0",
        "sglang": "0.5.23",
        "sglang-kernel": "0.4.10",
        "flashinfer-python": "0.7.2",
    }


def test_a_force_rule_forces_only_its_cells(tmp_path: Path, url: str) -> None:
    matrix = matrix_of(
        tmp_path,
        url,
        sglang=False,
        lock=False,
        extra='[[rules.force]]\ntorch = "2.15.0"\nreason = "the --no-deps move"\n',
    )
    new, old = cell(matrix, "torch2.15.0"), cell(matrix, "torch2.14.1")
    assert (new.force, old.force, new.conflicts) == (True, False, None)
    _, ok, stderr, frozen = install(tmp_path, matrix, new)
    assert ok, stderr
    assert (frozen["torch"], frozen["sglang-kernel"]) == ("2.15.0", "0.4.10")


def test_a_forced_cell_lists_the_pins_its_installed_set_breaks_and_a_failing_module_names_its_own(
    tmp_path: Path, url: str
) -> None:
    matrix = matrix_of(tmp_path, url)
    new = cell(matrix, "torch2.15.0")
    _, ok, stderr, _ = install(tmp_path, matrix, new)
    assert ok, stderr
    venv = tmp_path / new.id
    ctx = CellContext(
        matrix=matrix,
        cell=new,
        venv=venv,
        python=envs.venv_python(venv),
        work_dir=tmp_path,
        site_packages=envs.site_packages(venv),
    )
    pins = run_pins_stage(ctx)
    broken = [
        "sglang 0.5.23 requires torch==2.14.1; torch 2.15.0 is installed",
        "sglang-kernel 0.4.10 requires torch==2.14.1; torch 2.15.0 is installed",
    ]
    assert (pins.state, pins.reason) == ("warn", broken[0] + " (and 1 more)")
    assert [b["text"] for b in pins.details["broken_requirements"]] == broken
    # The import stage's module of sglang-kernel fails: the pin it broke is named as the cause.
    why = "sgl_kernel/common_ops.abi3.so: undefined symbol c10::cuda::foo(unsigned int)"
    failed = StageResult(
        name="import",
        state=StageState.FAIL,
        reason=why + " (and 1 more)",
        details={
            "modules": [
                {"module": "sgl_kernel/common_ops.abi3.so", "dist": "sglang-kernel", "ok": False, "reason": why},
                {"module": "flashinfer", "dist": "flashinfer-python", "ok": True},
            ]
        },
    )
    assert blame_broken_pins(failed, pins).reason == (
        f"{why}; sglang-kernel 0.4.10 requires torch==2.14.1; torch 2.15.0 is installed (and 1 more)"
    )
