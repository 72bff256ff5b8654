"""compatlab.stages.static.fatbin: the compatibility rules (fatbins nvcc builds: tests/e2e, test_fatbin_nvcc.py)."""

from __future__ import annotations

import pytest

from compatlab.stages.static.fatbin import GpuCode, coverage, parse_arch, parse_fatbin, runs_on


@pytest.mark.parametrize(
    ("code", "device", "expected"),
    [
        ("sm_90", 90, True),
        ("sm_80", 86, True),  # same major, newer minor
        ("sm_86", 80, False),
        ("sm_90", 100, False),  # a cubin never runs on another major
        ("sm_90", 120, False),
        ("sm_90a", 90, True),
        ("sm_100a", 103, False),  # arch-specific: that arch only
        ("sm_100f", 103, True),  # family-specific: its family
        ("sm_100f", 120, False),
        ("compute_90", 120, True),  # PTX JIT-compiles forward
        ("compute_90", 89, False),
        ("compute_90a", 100, False),
    ],
)
def test_runs_on(code: str, device: int, expected: bool) -> None:
    assert runs_on(GpuCode.parse(code), device) is expected


def test_parse_arch() -> None:
    assert parse_arch("sm_90") == 90
    assert parse_arch("sm_90a") == 90
    assert parse_arch("120") == 120
    with pytest.raises(ValueError, match="expected a GPU arch like 'sm_90' or 'sm_120', got 'hopper'"):
        parse_arch("hopper")


def test_coverage_message() -> None:
    cov = coverage([["sm_90a"], ["sm_100a", "sm_90a"]], 120)
    assert not cov.covered
    assert cov.describe() == "no kernel image for sm_120 (has sm_90a, sm_100a; PTX none)"
    partial = coverage([["sm_90", "compute_90"], ["sm_90a"]], 120)
    assert partial.covered
    assert (partial.containers, partial.uncovered) == (2, 1)


def test_garbage_has_no_fatbin() -> None:
    assert parse_fatbin(b"\x00" * 256) == []
