"""What the import stage loads, and in which order, read from real (tiny) dist-info folders on sys.path."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from compatlab.incell.imports.plan import Plan, Survey, by_requirements
from compatlab.incell.loading.installed import LoadTarget


def _dist(site: Path, name: str, files: dict[str, bytes], requires: tuple[str, ...] = ()) -> None:
    """A distribution *name* 1.0 installed in *site*: its files, and a RECORD that lists them."""
    info = site / f"{name.replace('-', '_').replace('.', '_')}-1.0.dist-info"
    info.mkdir(parents=True)
    lines = [f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n", *(f"Requires-Dist: {r}\n" for r in requires)]
    (info / "METADATA").write_text("".join(lines), encoding="utf-8")
    for rel, data in files.items():
        if not rel.startswith(".."):
            (site / rel).parent.mkdir(parents=True, exist_ok=True)
            (site / rel).write_bytes(data)
    record = [*files, f"{info.name}/METADATA", f"{info.name}/RECORD"]
    (info / "RECORD").write_text("".join(f"{r},,\n" for r in record), encoding="utf-8")


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_a_declared_distribution_is_found_or_said_missing(site: Path) -> None:
    _dist(site, "alpha", {"alpha/__init__.py": b"", "alpha/libhelper.so": b""})
    survey = Survey.of({"alpha": "1.0", "nowhere-pkg": "2.0"})
    assert list(survey.installed) == ["alpha"]
    assert survey.missing == ["nowhere-pkg 2.0 is declared but not installed in the cell"]
    assert survey.versions == {"alpha": "1.0"}
    assert survey.elf_files == [str(site / "alpha" / "libhelper.so")]


def test_the_plan_says_what_it_does_not_load_and_why(site: Path) -> None:
    other = "alpha/other.cpython-39-x86_64-linux-gnu.so"  # another Python's, unreadable but an ELF file
    _dist(site, "alpha", {"alpha/__init__.py": b"", other: b"\x7fELF" + bytes(60), "../../outside/evil.so": b""})
    plan = Plan.of(Survey.of({"alpha": "1.0"}).installed)
    assert plan.targets == [LoadTarget(dist="alpha", label="alpha", name="alpha")]
    assert plan.order == [0]
    assert plan.paths == {}
    assert plan.owned == {"alpha": {os.path.realpath(site / other): other}}
    assert plan.warnings == [
        f"{other}: built for another Python; {sys.implementation.cache_tag} never imports it, so it was not loaded",
        "alpha: its RECORD names ../../outside/evil.so, outside the environment: never read nor loaded",
    ]


def test_a_distribution_loads_after_what_it_requires_extras_left_out(site: Path) -> None:
    _dist(site, "alpha", {"alpha/__init__.py": b""}, ("Beta_Pkg>=1", 'gamma; extra == "test"'))
    _dist(site, "beta.pkg", {"beta/__init__.py": b""})
    _dist(site, "gamma", {"gamma/__init__.py": b""}, ("ALPHA",))
    surveyed = Survey.of({"gamma": "1.0", "alpha": "1.0", "beta.pkg": "1.0"}).installed
    assert by_requirements(surveyed) == ["beta.pkg", "alpha", "gamma"]
    plan = Plan.of(surveyed)
    assert [t.label for t in plan.targets] == ["gamma", "alpha", "beta"]  # the declared order, kept
    assert [plan.targets[i].label for i in plan.order] == ["beta", "alpha", "gamma"]


def test_a_circle_of_requirements_is_broken_where_it_is_met(site: Path) -> None:
    _dist(site, "alpha", {"alpha/__init__.py": b""}, ("beta",))
    _dist(site, "beta", {"beta/__init__.py": b""}, ("alpha", "not-declared"))
    assert by_requirements(Survey.of({"beta": "1.0", "alpha": "1.0"}).installed) == ["beta", "alpha"]
