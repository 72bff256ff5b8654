"""What a fork server tells at its end about the CPU it used (forkserver.CpuUsed), and how the loader sums it."""

from __future__ import annotations

from typing import Any

import pytest

from compatlab.incell.forkserver import CpuUsed
from compatlab.incell.imports.driver import Driver
from compatlab.incell.imports.loader import Loader


def test_four_numbers_are_what_the_server_used() -> None:
    told = {"user": 3, "system": 1.5, "children_user": 40.25, "children_system": 17.0, "forks": 9, "fork_cpu": 0.5}
    assert CpuUsed.of(told) == CpuUsed(
        user=3.0, system=1.5, children_user=40.25, children_system=17.0, forks=9, fork_cpu=0.5
    )


def test_a_server_that_did_not_count_its_forks_told_none() -> None:
    told = {"user": 3, "system": 1.5, "children_user": 40.25, "children_system": 17.0, "forks": "9"}
    assert CpuUsed.of(told) == CpuUsed(user=3.0, system=1.5, children_user=40.25, children_system=17.0)


@pytest.mark.parametrize(
    "told",
    [
        None,
        [1, 2, 3, 4],
        {"user": 1.0, "system": 1.0, "children_user": 1.0},
        {"user": 1.0, "system": "1", "children_user": 1.0, "children_system": 1.0},
        {"user": True, "system": 1.0, "children_user": 1.0, "children_system": 1.0},
        {"user": -1.0, "system": 1.0, "children_user": 1.0, "children_system": 1.0},
    ],
)
def test_anything_else_is_nothing_told(told: Any) -> None:
    assert CpuUsed.of(told) is None


class _Told:
    def __init__(self, cpu: CpuUsed | None) -> None:
        self.cpu = cpu


def test_the_loader_sums_each_kind_of_server_that_told_and_counts_them() -> None:
    loader = Loader(Driver.__new__(Driver), [], 60.0, fork=True)  # a driver never asked here: not built
    first = CpuUsed(user=1.0, system=2.0, children_user=10.0, children_system=5.0, forks=3, fork_cpu=0.25)
    second = CpuUsed(user=0.5, system=0.25, children_user=1.0, children_system=1.0, forks=2, fork_cpu=0.5)
    loader.retired = [_Told(first)]  # type: ignore[list-item]
    loader.adopting = {"": _Told(second), "other": None}  # type: ignore[dict-item]
    loader.servers = {"": _Told(None)}  # type: ignore[dict-item]  # died: told nothing
    assert loader.cpu() == {
        "adopting": {
            "servers": 2,
            "self_user": 1.5,
            "self_system": 2.25,
            "children_user": 11.0,
            "children_system": 6.0,
            "forks": 5,
            "fork_cpu": 0.75,
        }
    }
