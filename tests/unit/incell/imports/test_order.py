"""The order learned on an environment: kept in a file of its own, read back only for the same environment."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from compatlab.incell.imports.order import LearnedOrder
from compatlab.incell.imports.plan import Plan, Survey, by_requirements
from compatlab.incell.loading.installed import Installed


def _dist(site: Path, name: str, version: str = "1.0") -> None:
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n", encoding="utf-8")
    (site / name).mkdir()
    (site / name / "__init__.py").write_text("", encoding="utf-8")
    record = [f"{name}/__init__.py", f"{info.name}/METADATA", f"{info.name}/RECORD"]
    (info / "RECORD").write_text("".join(f"{r},,\n" for r in record), encoding="utf-8")


@pytest.fixture
def surveyed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Installed]:
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    for name in ("alpha", "beta", "gamma"):
        _dist(site, name)
    return Survey.of({"alpha": "1.0", "beta": "1.0", "gamma": "1.0"}).installed


def test_what_is_learned_orders_the_next_run_and_is_kept_once(tmp_path: Path, surveyed: dict[str, Installed]) -> None:
    cache = tmp_path / "cache"
    first = LearnedOrder.at(cache, surveyed)
    assert (first.before, first.problem) == ({}, "")
    # Nothing requires anything: alphabetical. alpha's adoption refused gamma's loads: gamma goes first next time.
    assert by_requirements(surveyed, first.before) == ["alpha", "beta", "gamma"]
    assert first.keep({"alpha": {"gamma", "alpha"}}) == 1  # its own distribution is no pair
    second = LearnedOrder.at(cache, surveyed)
    assert second.before == {"alpha": ["gamma"]}
    assert second.pairs == 1
    assert by_requirements(surveyed, second.before) == ["gamma", "alpha", "beta"]
    plan = Plan.of(surveyed, second.before)
    assert [plan.targets[i].label for i in plan.order] == ["gamma", "alpha", "beta"]
    # The same pair again writes nothing; a new one is added to what was kept.
    assert second.keep({"alpha": {"gamma"}}) == 0
    assert second.keep({"beta": {"alpha"}}) == 1
    assert LearnedOrder.at(cache, surveyed).before == {"alpha": ["gamma"], "beta": ["alpha"]}
    assert list(cache.iterdir()) == [second.path]  # no temporary file left


def test_another_environment_reads_nothing_of_it(tmp_path: Path, surveyed: dict[str, Installed]) -> None:
    cache = tmp_path / "cache"
    LearnedOrder.at(cache, surveyed).keep({"alpha": {"gamma"}})
    fewer = {k: v for k, v in surveyed.items() if k != "beta"}  # another set of distributions: another file
    other = LearnedOrder.at(cache, fewer)
    assert (other.before, other.problem) == ({}, "")
    assert other.path != LearnedOrder.at(cache, surveyed).path


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("{not json", "could not be read"),
        ('{"schema": 1, "key": "someone else", "before": {}}', "is not one for this environment"),
        ('{"schema": 1, "key": "KEY", "before": {"alpha": "gamma"}}', "is not one for this environment"),
        ('{"schema": 99, "key": "KEY", "before": {}}', "is not one for this environment"),
    ],
)
def test_a_file_it_did_not_write_for_this_environment_orders_nothing_and_says_so(
    tmp_path: Path, surveyed: dict[str, Installed], text: str, problem: str
) -> None:
    cache = tmp_path / "cache"
    order = LearnedOrder.at(cache, surveyed)
    assert order.path is not None
    order.path.parent.mkdir(parents=True)
    order.path.write_text(text.replace("KEY", order.key), encoding="utf-8")
    read = LearnedOrder.at(cache, surveyed)
    assert read.before == {}
    assert problem in read.problem
    assert str(order.path) in read.problem


def test_a_file_for_this_environment_keeps_only_distributions_surveyed(
    tmp_path: Path, surveyed: dict[str, Installed]
) -> None:
    cache = tmp_path / "cache"
    order = LearnedOrder.at(cache, surveyed)
    assert order.path is not None
    order.path.parent.mkdir(parents=True)
    data = {"schema": 1, "key": order.key, "before": {"alpha": ["gamma", "gone"], "gone": ["beta"]}}
    order.path.write_text(json.dumps(data), encoding="utf-8")
    assert LearnedOrder.at(cache, surveyed).before == {"alpha": ["gamma"]}


def test_a_cache_it_cannot_write_keeps_nothing_and_says_why(tmp_path: Path, surveyed: dict[str, Installed]) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("", encoding="utf-8")  # a file where the folder would be
    order = LearnedOrder.at(blocked, surveyed)
    assert "could not be read" in order.problem
    assert order.keep({"alpha": {"gamma"}}) == 1
    assert order.before == {}
    assert "could not be kept" in order.problem
    assert "could not be read" in order.problem  # what reading it said is kept too
    assert LearnedOrder.at(None, surveyed).keep({"alpha": {"gamma"}}) == 1  # nowhere to keep it: no error
