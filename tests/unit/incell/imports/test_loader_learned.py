"""What the loader learns from a refusal: the pair (adopting distribution, refused one), never a guess."""

from __future__ import annotations

import types
from typing import Any

import pytest

from compatlab.incell import forkserver
from compatlab.incell.imports.loader import Loader
from compatlab.incell.loading.installed import LoadTarget


class _Refusing:
    """A fork server that refuses every load, naming the adoptions *by* (the protocol's ``"by"``)."""

    closed = ""

    def __init__(self, by: tuple[str, ...]) -> None:
        self.by = by

    def load(self, **_request: object) -> None:
        raise forkserver.Refused("imported here already", self.by)


@pytest.mark.parametrize(
    ("by", "learned"),
    [
        (("user",), {"user-dist": {"dep-dist"}}),
        (("nvidia",), {}),  # a namespace two distributions install into: whose adoption it was is not known
        (("dep",), {}),  # its own distribution's: no pair
        (("elsewhere",), {}),  # no planned package of that name
    ],
)
def test_a_refusal_teaches_the_pair_only_where_the_adopting_distribution_is_known(
    monkeypatch: pytest.MonkeyPatch, by: tuple[str, ...], learned: dict[str, set[str]]
) -> None:
    driver: Any = types.SimpleNamespace(env=dict)  # the environment the loads would run in: none needed here
    loader = Loader(driver, [], 60, fork=True)
    loader.own.update(
        {"user-dist": ["user"], "dep-dist": ["dep", "dep._m"], "nvidia-a": ["nvidia"], "nvidia-b": ["nvidia"]}
    )
    monkeypatch.setattr(loader, "_server", lambda _env, adopting=False: _Refusing(by))
    target = LoadTarget(dist="dep-dist", label="dep", name="dep")
    assert loader.ask_adopting(target) is None
    assert loader.refused == 1
    assert loader.learned == learned
