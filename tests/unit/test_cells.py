"""Shipped stacks and the neighbour rule, from a matrix.lock with the pins PyPI's releases carry."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from compatlab.cells import expand, shipped_stacks
from compatlab.config.lock import Lock, LockedAxis, LockedRelease, dump_lock
from compatlab.config.matrix import load_matrix
from compatlab.errors import ConfigError

MATRIX = """
[[axes.torch]]
version = "2.14.1"
[[axes.torch]]
version = "2.15.0"
[axes.sglang-kernel]
values = ["0.4.9", "0.4.10"]
[axes.flashinfer]
values = ["0.7.1", "0.7.2", "0.7.4"]
[axes.sglang]
values = ["0.5.22", "0.5.23"]
[axes.cuda]
values = ["13.0", "13.2"]
"""
NEAR = """
[[rules.neighbours]]
of = "shipped"
"""
PINS = {
    ("sglang", "0.5.23"): {"torch": "==2.14.1", "sglang-kernel": "==0.4.10", "flashinfer": "==0.7.2"},
    ("sglang", "0.5.22"): {"torch": "==2.14.1", "sglang-kernel": "==0.4.9", "flashinfer": "==0.7.1"},
    ("sglang-kernel", "0.4.10"): {"torch": "==2.14.1"},
    ("sglang-kernel", "0.4.9"): {"torch": "==2.14.1"},
}
CUDA = {"2.14.1": "13.0", "2.15.0": "13.2"}
PACKAGES = {"torch": "torch", "sglang-kernel": "sglang-kernel", "flashinfer": "flashinfer-python", "sglang": "sglang"}


def write(tmp_path: Path, extra: str = "", *, pins: bool = True) -> Path:
    path = tmp_path / "matrix.toml"
    path.write_text(textwrap.dedent(MATRIX + extra))
    matrix = load_matrix(path, use_lock=False)
    axes = {}
    for axis in matrix.axes:
        if not axis.is_package:
            continue
        releases = tuple(
            LockedRelease(
                version=v.version,
                pins=PINS.get((axis.name, v.version), {}) if pins else {},
                cuda=CUDA.get(v.version) if axis.name == "torch" else None,
            )
            for v in axis.values
        )
        axes[axis.name] = LockedAxis(
            name=axis.name,
            package=PACKAGES[axis.name],
            index="https://pypi.org/simple",
            resolved="2026-12-02T02:17:00+00:00",
            select="listed",
            versions=releases,
        )
    lock = Lock(path=str(tmp_path / "matrix.lock"), matrix_digest=matrix.digest, axes=axes)
    (tmp_path / "matrix.lock").write_text(dump_lock(lock, matrix_name="matrix.toml"))
    return path


def test_the_shipped_stacks_are_the_releases_exact_pins(tmp_path: Path) -> None:
    matrix = load_matrix(write(tmp_path))
    assert [(s.release, s.label) for s in shipped_stacks(matrix)] == [
        ("sglang 0.5.22", "torch 2.14.1 · sglang-kernel 0.4.9 · flashinfer 0.7.1 · sglang 0.5.22"),
        ("sglang 0.5.23", "torch 2.14.1 · sglang-kernel 0.4.10 · flashinfer 0.7.2 · sglang 0.5.23"),
    ]
    shipped = {c.id: c.shipped for c in expand(matrix) if c.shipped}
    # The torch lock knows its CUDA: the stacks are cells of the CUDA 13.0 column only.
    assert {i: s for i, s in shipped.items() if "cuda13.0" in i} == {
        "torch2.14.1-sglangkernel0.4.9-flashinfer0.7.1-sglang0.5.22-cuda13.0": "sglang 0.5.22",
        "torch2.14.1-sglangkernel0.4.10-flashinfer0.7.2-sglang0.5.23-cuda13.0": "sglang 0.5.23",
    }


def test_the_neighbour_rule_keeps_cells_one_component_away_from_a_shipped_stack(tmp_path: Path) -> None:
    matrix = load_matrix(write(tmp_path, NEAR))
    cells = expand(matrix)
    live = sorted(c.id for c in cells if c.na is None)
    assert len(cells) == 48
    assert live == sorted(
        [
            "torch2.14.1-sglangkernel0.4.10-flashinfer0.7.2-sglang0.5.23-cuda13.0",  # 0.5.23's own stack
            "torch2.15.0-sglangkernel0.4.10-flashinfer0.7.2-sglang0.5.23-cuda13.2",  # torch moved
            "torch2.14.1-sglangkernel0.4.9-flashinfer0.7.2-sglang0.5.23-cuda13.0",  # sglang-kernel moved
            "torch2.14.1-sglangkernel0.4.10-flashinfer0.7.1-sglang0.5.23-cuda13.0",  # flashinfer moved
            "torch2.14.1-sglangkernel0.4.10-flashinfer0.7.4-sglang0.5.23-cuda13.0",
            "torch2.14.1-sglangkernel0.4.10-flashinfer0.7.2-sglang0.5.22-cuda13.0",  # sglang moved
            "torch2.14.1-sglangkernel0.4.9-flashinfer0.7.1-sglang0.5.22-cuda13.0",  # 0.5.22's own stack
            "torch2.15.0-sglangkernel0.4.9-flashinfer0.7.1-sglang0.5.22-cuda13.2",
            "torch2.14.1-sglangkernel0.4.10-flashinfer0.7.1-sglang0.5.22-cuda13.0",
            "torch2.14.1-sglangkernel0.4.9-flashinfer0.7.2-sglang0.5.22-cuda13.0",
            "torch2.14.1-sglangkernel0.4.9-flashinfer0.7.4-sglang0.5.22-cuda13.0",
            "torch2.14.1-sglangkernel0.4.9-flashinfer0.7.1-sglang0.5.23-cuda13.0",
        ]
    )
    far = next(c for c in cells if c.id == "torch2.14.1-sglangkernel0.4.9-flashinfer0.7.4-sglang0.5.23-cuda13.0")
    assert far.na == (
        "more than one axis away from every shipped stack (sglang 0.5.22: torch 2.14.1 · sglang-kernel "
        "0.4.9 · flashinfer 0.7.1 · sglang 0.5.22; sglang 0.5.23: torch 2.14.1 · sglang-kernel 0.4.10 · "
        "flashinfer 0.7.2 · sglang 0.5.23)"
    )
    assert len(expand(load_matrix(write(tmp_path, NEAR + 'distance = 0\nreason = "only what was shipped"\n')))) == 48
    only = [c for c in expand(load_matrix(tmp_path / "matrix.toml")) if c.na is None]
    assert len(only) == 2


def test_a_neighbour_rule_without_a_shipped_stack_is_refused(tmp_path: Path) -> None:
    matrix = load_matrix(write(tmp_path, NEAR, pins=False))
    with pytest.raises(ConfigError) as info:
        expand(matrix)
    assert str(info.value) == (
        f"{tmp_path}/matrix.toml: rules.neighbours: {tmp_path}/matrix.lock names no shipped stack of this matrix (a "
        "release whose exact pins give every package axis a version the matrix has, as sglang's do); add an sglang "
        "axis, or the versions its releases pin, or remove the rule"
    )


def test_neighbour_rule_problems(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_matrix(write(tmp_path, '[[rules.neighbours]]\nof = "latest"\ndistance = -1\nnear = 1\n'))
    assert info.value.problems == [
        "rules.neighbours[0].near: unknown key; allowed keys: distance, of, reason",
        "rules.neighbours[0].of: expected \"shipped\" (the stacks the lock's releases pin), got 'latest'",
        "rules.neighbours[0].distance: expected a non-negative integer, got -1",
    ]
