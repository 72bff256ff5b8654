"""Selectors, matrix.lock's model and file, and a matrix read with its lock: missing, stale, in use."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from compatlab.config.check import Checker
from compatlab.config.lock import (
    Lock,
    LockedAxis,
    LockedRelease,
    Selector,
    cuda_of,
    dump_lock,
    load_lock,
    news,
    parse_selector,
    pins_on,
)
from compatlab.config.matrix import load_matrix
from compatlab.errors import ConfigError

RELEASES = [
    ("2.12.0", False),
    ("2.12.1", False),
    ("2.13.0", False),
    ("2.14.0", False),
    ("2.14.1", False),
    ("2.14.2", True),
    ("2.15.0rc1", False),
    ("2.15.0.dev20261201", False),
    ("2.15.0", False),
]


@pytest.mark.parametrize(
    ("selector", "chosen"),
    [
        (Selector(latest=3), ["2.14.0", "2.14.1", "2.15.0"]),
        (Selector(latest=2, per="minor"), ["2.14.1", "2.15.0"]),
        (Selector(latest=1, per="major"), ["2.15.0"]),
        (Selector(since="2.14"), ["2.14.0", "2.14.1", "2.15.0"]),
        (Selector(since="2.13", per="minor"), ["2.13.0", "2.14.1", "2.15.0"]),
        (Selector(latest=2, per="minor", yanked=True), ["2.14.2", "2.15.0"]),
        (Selector(latest=2, pre=True), ["2.15.0rc1", "2.15.0"]),
    ],
)
def test_selectors_leave_out_yanked_and_pre_releases_unless_asked(selector: Selector, chosen: list[str]) -> None:
    assert selector.choose(RELEASES) == chosen


def test_selector_descriptions() -> None:
    assert Selector(latest=2, per="minor", since="2.13").describe() == "latest 2 per minor, since 2.13"
    assert Selector(since="2.13", pre=True, yanked=True).describe() == "since 2.13, pre-releases too, yanked too"


def test_selector_problems_all_at_once() -> None:
    ck = Checker()
    parse_selector(ck, {"latest": 0, "per": "month", "since": "two", "pre": "yes", "newest": 1}, "axes.torch.select")
    parse_selector(ck, {"per": "minor"}, "axes.sglang.select")
    parse_selector(ck, 3, "axes.cuda.select")
    assert ck.problems == [
        "axes.torch.select.newest: unknown key; allowed keys: latest, per, pre, since, yanked",
        "axes.torch.select.latest: expected a positive integer, got 0",
        "axes.torch.select.per: expected one of 'release', 'minor', 'major', got 'month'",
        "axes.torch.select.since: 'two' is not a valid PEP 440 version",
        "axes.torch.select.pre: expected true or false, got 'yes'",
        'axes.sglang.select: selects every release of the index; give latest = N or since = "X.Y"',
        "axes.cuda.select: expected a table like { latest = 2 }, got 3",
    ]


def test_pins_on_other_axes_and_the_cuda_a_wheel_pins() -> None:
    requires = [
        "torch==2.14.1",
        "flashinfer_python[cu13]==0.7.2",
        "sglang-kernel==0.4.10; sys_platform == 'darwin'",
        "numpy",
        "sglang-kernel>=0.4.9; platform_machine == 'x86_64'",
        "pytest; extra == 'test'",
    ]
    assert pins_on(
        requires, {"torch": "torch", "flashinfer-python": "flashinfer", "sglang-kernel": "sglang-kernel"}
    ) == {"torch": "==2.14.1", "flashinfer": "==0.7.2", "sglang-kernel": ">=0.4.9"}
    assert cuda_of(['cuda-toolkit[cudart]==13.2.2; platform_system == "Linux"']) == "13.2"
    assert cuda_of(["nvidia-cuda-runtime-cu12==12.8.90", "filelock"]) == "12.8"
    assert cuda_of(["cuda-bindings<14,>=13.0.3"]) is None


def _lock(
    path: Path, digest: str, versions: tuple[str, ...] = ("2.14.1", "2.15.0"), seen: tuple[str, ...] = ()
) -> Lock:
    releases = tuple(LockedRelease(version=v, cuda="13.2" if v == "2.15.0" else "13.0") for v in versions)
    axis = LockedAxis(
        name="torch",
        package="torch",
        index="https://pypi.org/simple",
        resolved="2026-12-01T02:17:00+00:00",
        select="latest 2 per minor",
        versions=releases,
        seen=seen or versions,
    )
    return Lock(path=str(path), matrix_digest=digest, axes={"torch": axis})


def test_a_lock_is_written_and_read_back(tmp_path: Path) -> None:
    lock = _lock(tmp_path / "matrix.lock", "ab" * 32)
    text = dump_lock(lock, matrix_name="matrix.toml")
    assert text.startswith("# matrix.lock: what the axes of matrix.toml resolved to on their indexes.\n")
    (tmp_path / "matrix.lock").write_text(text)
    assert load_lock(tmp_path / "matrix.lock") == lock
    assert load_lock(tmp_path / "none.lock") is None


def test_a_broken_lock_says_to_write_it_anew(tmp_path: Path) -> None:
    (tmp_path / "matrix.lock").write_text(
        'schema = 2\nmatrix-sha256 = "x"\n[axes.torch]\npackage = "torch"\n'
        'index = "i"\nresolved = "r"\nselect = "s"\nversions = [{ version = "two" }]\n'
    )
    with pytest.raises(ConfigError) as info:
        load_lock(tmp_path / "matrix.lock")
    assert info.value.problems == [
        "schema: this lab reads lock schema 1, got 2",
        "axes.torch.versions[0].version: 'two' is not a valid PEP 440 version",
        "write it anew with `compatlab lock` (or `nox -s lock`)",
    ]


def test_news_are_the_releases_new_since_the_previous_lock(tmp_path: Path) -> None:
    old = _lock(tmp_path / "matrix.lock", "d", versions=("2.14.1", "2.15.0"), seen=("2.14.0", "2.14.1", "2.15.0"))
    new = _lock(
        tmp_path / "matrix.lock",
        "d",
        versions=("2.15.0", "2.16.0"),
        seen=("2.14.0", "2.14.1", "2.14.2", "2.15.0", "2.16.0"),
    )
    assert news(old, new) == [
        "torch 2.14.2 is out on https://pypi.org/simple (not chosen: latest 2 per minor; new since the lock of 2026-12-01T02:17:00+00:00)",
        "torch 2.16.0 is out on https://pypi.org/simple (chosen; new since the lock of 2026-12-01T02:17:00+00:00)",
    ]
    assert news(None, new) == []
    assert news(new, new) == []


MATRIX = """
[axes.torch]
select = { latest = 2, per = "minor" }
[[axes.sgl-kernel]]
version = "0.3.21"
[[axes.flashinfer]]
version = "0.7.4"
[[axes.cuda]]
version = "13.0"
[[rules.expect]]
torch = "2.13.0"
expect = "fail"
reason = "an old torch"
"""


def test_a_selecting_axis_without_a_lock_is_one_clear_problem(tmp_path: Path) -> None:
    (tmp_path / "matrix.toml").write_text(textwrap.dedent(MATRIX))
    with pytest.raises(ConfigError) as info:
        load_matrix(tmp_path / "matrix.toml")
    lock = tmp_path / "matrix.lock"
    assert str(info.value) == (
        f"{tmp_path}/matrix.toml: axes.torch: selects its versions (latest 2 per minor) from its "
        f"index, and there is no {lock}; run `compatlab lock` (or `nox -s lock`) to resolve them"
    )
    unlocked = load_matrix(tmp_path / "matrix.toml", use_lock=False)
    assert unlocked.axis("torch").values == ()


def test_the_lock_gives_the_versions_and_their_cuda_and_a_stale_lock_is_said(tmp_path: Path) -> None:
    (tmp_path / "matrix.toml").write_text(textwrap.dedent(MATRIX))
    digest = load_matrix(tmp_path / "matrix.toml", use_lock=False).digest
    (tmp_path / "matrix.lock").write_text(dump_lock(_lock(tmp_path / "matrix.lock", digest), matrix_name="matrix.toml"))
    matrix = load_matrix(tmp_path / "matrix.toml")
    assert [(v.version, v.package, v.cuda) for v in matrix.axis("torch").values] == [
        ("2.14.1", "torch", "13.0"),
        ("2.15.0", "torch", "13.2"),
    ]
    assert matrix.notes == (
        "rules.expect[0].torch: torch 2.13.0 is not among the versions selected now (2.14.1, 2.15.0); this rule matches no cell",
        "axes.torch: torch 2.15.0 is a CUDA 13.2 build and no column of axis 'cuda' (13.0) matches: its cells are n/a; add a cuda value '13.2' to test it",
    )
    (tmp_path / "matrix.toml").write_text(textwrap.dedent(MATRIX).replace('version = "0.7.4"', 'version = "0.7.2"'))
    stale = load_matrix(tmp_path / "matrix.toml")
    assert stale.notes[0] == (
        f"{tmp_path}/matrix.lock is older than {tmp_path}/matrix.toml: its axes changed since the "
        "lock was resolved (2026-12-01T02:17:00+00:00); run `compatlab lock` (or `nox -s lock`) to "
        "resolve them again"
    )


def test_pep440_equal_versions_in_a_lock_are_one_value(tmp_path: Path) -> None:
    # 2.14.1 and 2.14.1.0 are one release by PEP 440: one cell, not two.
    (tmp_path / "matrix.toml").write_text(textwrap.dedent(MATRIX))
    digest = load_matrix(tmp_path / "matrix.toml", use_lock=False).digest
    lock = _lock(tmp_path / "matrix.lock", digest, versions=("2.14.1", "2.14.1.0", "2.15.0"))
    (tmp_path / "matrix.lock").write_text(dump_lock(lock, matrix_name="matrix.toml"))
    matrix = load_matrix(tmp_path / "matrix.toml")
    assert [v.version for v in matrix.axis("torch").values] == ["2.14.1", "2.15.0"]
