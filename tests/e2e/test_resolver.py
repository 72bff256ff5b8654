"""Resolver failures told as their cause, from real uv over tiny wheels (and one placeholder sdist) on loopback.

The torch 2.10.0 case, shrunk: torch pins cuda-bindings 12 while flashinfer asks for cuda-python >= 13, whose
every release needs cuda-bindings 13. The cuda-tile case: sglang 0.5.22 pins cuda-tile==1.6.0rc5, an sdist
whose build backend (nvidia-stub, in-tree here) downloads the real wheel from another index and fails.
"""

from __future__ import annotations

import os
import tarfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from compatlab import envs, resolver, uv_failures
from compatlab.cells import Cell, expand
from compatlab.config.matrix import Matrix, load_matrix
from fixtures.labutil import uv_dir
from fixtures.wheels import build_wheel, serve, write_simple_index

BANNER = """Didn't find wheel for cuda-tile 1.6.0rc5

*******************************************************************************
The installation of cuda-tile for version 1.6.0rc5 failed.

This is a special placeholder package which downloads a real wheel package
from https://pypi.nvidia.com/. If https://pypi.nvidia.com/ is not reachable, we
cannot download the real wheel file to install.
*******************************************************************************
"""


def placeholder_sdist(out: Path) -> Path:
    """cuda_tile-1.6.0rc5.tar.gz: static metadata in PKG-INFO, and a build backend that only fails."""
    root = out / "cuda_tile-1.6.0rc5"
    (root / "nvidia_stub").mkdir(parents=True)
    (root / "PKG-INFO").write_text("Metadata-Version: 2.2\nName: cuda-tile\nVersion: 1.6.0rc5\n")
    (root / "pyproject.toml").write_text(
        textwrap.dedent("""
        [build-system]
        requires = []
        build-backend = "nvidia_stub.buildapi"
        backend-path = ["."]
        [project]
        name = "cuda-tile"
        version = "1.6.0rc5"
        """)
    )
    (root / "nvidia_stub" / "__init__.py").write_text("")
    (root / "nvidia_stub" / "buildapi.py").write_text(
        textwrap.dedent(f"""
        def get_requires_for_build_wheel(config_settings=None):
            return []
        def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
            raise RuntimeError({BANNER!r})
        """)
    )
    sdist = out / "cuda_tile-1.6.0rc5.tar.gz"
    with tarfile.open(sdist, "w:gz") as tar:
        tar.add(root, arcname=root.name)
    return sdist


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("resolver")
    w = root / "wheels"
    write_simple_index(
        root / "public",
        [
            build_wheel(w, "torch", "2.10.0", requires=["cuda-bindings==12.9.4"]),
            build_wheel(w, "torch", "2.14.1"),
            build_wheel(w, "cuda-bindings", "12.9.4"),
            build_wheel(w, "cuda-bindings", "13.0.3"),
            build_wheel(w, "cuda-python", "13.0.3", requires=["cuda-bindings~=13.0.3"]),
            build_wheel(w, "cuda-python", "13.1.0", requires=["cuda-bindings~=13.1.0"]),
            build_wheel(w, "flashinfer-python", "0.6.1", requires=["torch", "cuda-python>=13"]),
            build_wheel(w, "flashinfer-python", "0.7.2", requires=["torch"]),
            build_wheel(w, "sgl-kernel", "0.3.21"),
            build_wheel(w, "sglang", "0.5.22", requires=["cuda-tile==1.6.0rc5"]),
            placeholder_sdist(root / "sdists"),
        ],
    )
    with serve(root) as base:
        yield base


@pytest.fixture(autouse=True)
def uv_on_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", f"{uv_dir()}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))


def cell_of(tmp_path: Path, url: str, axes: str) -> tuple[Matrix, Cell]:
    path = tmp_path / "matrix.toml"
    path.write_text(
        textwrap.dedent(axes)
        + textwrap.dedent(f"""
        [[axes.sgl-kernel]]
        version = "0.3.21"
        [[axes.cuda]]
        version = "12.8"
        [install]
        index-url = "{url}/public/simple"
        """)
    )
    matrix = load_matrix(path, use_lock=False)
    return matrix, expand(matrix)[0]


def failed_install(tmp_path: Path, matrix: Matrix, cell: Cell) -> tuple[str, str]:
    venv = tmp_path / "venv"
    assert envs.create_venv(venv, python=None).ok
    plan = envs.install_plan(matrix, cell, python=envs.venv_python(venv), spec_dir=tmp_path / "spec")
    envs.write_plan_files(plan, tmp_path / "spec")
    done = envs.run_install(plan, timeout=120)
    assert not done.ok
    return uv_failures.classify_uv_failure(done, plan)


def test_a_conflict_is_told_as_the_packages_of_uvs_derivation_never_the_labs_project(tmp_path: Path, url: str) -> None:
    matrix, cell = cell_of(
        tmp_path,
        url,
        """
        [[axes.torch]]
        version = "2.10.0"
        [[axes.flashinfer]]
        version = "0.6.1"
        """,
    )
    assert failed_install(tmp_path, matrix, cell) == (
        "fail",
        (
            "unsatisfiable: torch==2.10.0 and flashinfer-python==0.6.1 cannot be installed together: flashinfer-python "
            "0.6.1 depends on cuda-python; torch 2.10.0 depends on cuda-bindings==12.9.4; cuda-python depends on "
            "cuda-bindings>=13.0.3"
        ),
    )


# uv 0.13.9's words for the default matrix's torch 2.10.0 cell on PyPI (2026-12-03), from its install stage
# (three of its steps about older cuda-python releases left out).
REAL = """\
Using Python 3.11.7 environment at: /tmp/venvs/r/sglang0.5.23-torch2.10.0-sglangkernel0.4.10-flashinfer0.7.2-cuda12.8
error: No solution found when resolving dependencies
  cause: Because cuda-python==13.0.0 depends on cuda-bindings>=13.0.0,<13.1.dev0 and cuda-python==13.0.1 depends on \
cuda-bindings>=13.0.1,<13.1.dev0, we can conclude that cuda-python>=13.0.0,<=13.0.1 depends on cuda-bindings>=13.0.0,<13.1.dev0.
         And because cuda-python==13.1.1 depends on cuda-bindings>=13.1.1,<13.2.dev0 and cuda-python==13.3.1 depends on \
cuda-bindings>=13.3.1,<13.4.dev0, we can conclude that all of:
             cuda-python>=13.0.0,<=13.1.1
             cuda-python==13.3.1
         depend on one of:
             cuda-bindings>=13.0.0,<13.2.dev0
             cuda-bindings>=13.3.1,<13.4.dev0

         And because cuda-python==13.4.1 depends on cuda-bindings>=13.4.1,<13.5.dev0 and cuda-python>=13.4.4 depends on \
cuda-bindings>=13.4.4,<13.5.dev0, we can conclude that cuda-python>=13.0.0 depends on one of:
             cuda-bindings>=13.0.0,<13.4.dev0
             cuda-bindings>=13.4.1,<13.5.dev0

         And because torch==2.10.0 depends on cuda-bindings{platform_machine == 'x86_64' and sys_platform == 'linux'}\
==12.9.4 and sglang>=0.5.23 depends on cuda-python>=13.0, we can conclude that sglang>=0.5.23 and torch==2.10.0 are \
incompatible.
         And because compatlab-cell depends on sglang==0.5.23 and torch==2.10.0, we can conclude that your requirements \
are unsatisfiable.
"""


def test_uvs_lists_and_markers_fold_into_the_facts() -> None:
    assert resolver.condense_conflict(REAL) == (
        "sglang==0.5.23 and torch==2.10.0",
        [
            "torch 2.10.0 depends on cuda-bindings==12.9.4",
            "sglang 0.5.23 depends on cuda-python>=13.0",
            "cuda-python>=13.0.0 depends on cuda-bindings>=13.0.0,<13.4.dev0 or >=13.4.1,<13.5.dev0",
        ],
    )


def test_a_placeholder_sdist_is_named_with_the_index_it_wants(tmp_path: Path, url: str) -> None:
    matrix, cell = cell_of(
        tmp_path,
        url,
        """
        [[axes.torch]]
        version = "2.14.1"
        [[axes.flashinfer]]
        version = "0.7.2"
        [[axes.sglang]]
        version = "0.5.22"
        """,
    )
    assert failed_install(tmp_path, matrix, cell) == (
        "fail",
        (
            "cuda-tile 1.6.0rc5 (which sglang 0.5.22 requires) is a placeholder sdist: building it downloads the real "
            "wheel from https://pypi.nvidia.com, which failed here; give cuda-tile that index, or pin a release of it "
            "that has wheels"
        ),
    )
