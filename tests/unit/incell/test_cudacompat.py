"""cudacompat: driver minimums and arch coverage, pure logic."""

from __future__ import annotations

import pytest

from compatlab.incell import cudacompat as cc
from compatlab.runs.model import StageState


@pytest.mark.parametrize(
    ("driver", "cuda", "state", "reason"),
    [
        ("580.159.03", "13.0", "pass", "driver 580.159.03 supports CUDA 13.0"),
        ("575.57.08", "13.0", "fail", "driver 575.57.08 is too old for CUDA 13.0: CUDA 13.x needs 580.65.06 or newer"),
        (
            "525.60.13",
            "12.8",
            "warn",
            "driver 525.60.13 runs CUDA 12.8 builds only under minor-version compatibility: "
            "PTX from CUDA 12.8 needs 570.26 or newer",
        ),
        ("520.61.05", "12.1", "fail", "driver 520.61.05 is too old for CUDA 12.1: CUDA 12.x needs 525.60.13 or newer"),
        ("570.86.10", "12.8", "pass", "driver 570.86.10 supports CUDA 12.8"),
        ("580.65.06", "12.9", "pass", "driver 580.65.06 supports CUDA 12.9"),
        ("550.54.14", "12.7", "pass", "driver 550.54.14 supports CUDA 12.7"),  # no such release: floor only
        ("600.1", "14.0", "warn", "no driver table for CUDA 14.x; driver 600.1 not checked"),
    ],
)
def test_check_driver(driver: str, cuda: str, state: str, reason: str) -> None:
    got = cc.check_driver(driver, cuda)
    assert (got.state, got.reason) == (state, reason)


def test_check_driver_api() -> None:
    assert cc.check_driver_api(13000, "13.0").reason == "the driver supports CUDA 13.0"
    got = cc.check_driver_api(12080, "13.0")
    assert (got.state, got.reason) == ("fail", "the driver supports CUDA 12.8, older than the cell's CUDA 13.0")
    assert cc.check_driver_api(12040, "12.8").state == StageState.WARN


def test_check_min_driver() -> None:
    got = cc.check_min_driver("570.86.10", "580.65", "h200x8")
    assert (got.state, got.reason) == ("fail", "driver 570.86.10 is older than target h200x8's min-driver 580.65")
    assert cc.check_min_driver("580.159.03", "580.65", "h200x8").state == StageState.PASS


def test_parse_driver_rejects_junk() -> None:
    with pytest.raises(ValueError, match="not a driver version: 'N/A'"):
        cc.parse_driver("N/A")


@pytest.mark.parametrize(
    ("device", "archs", "expected"),
    [
        ((9, 0), ["sm_80", "sm_86", "sm_90", "sm_100", "sm_120"], ("sass", "sm_90")),
        ((8, 9), ["sm_80", "sm_86"], ("sass", "sm_80")),  # same major, later minor runs sm_80 code
        ((12, 0), ["sm_90", "sm_100", "compute_100"], ("ptx", "compute_100")),  # the driver JITs the PTX
        ((12, 0), ["sm_90", "sm_100"], None),  # sm_100 machine code does not run on sm_120
        ((9, 0), ["sm_90a"], ("sass", "sm_90a")),
        ((10, 0), ["sm_90a", "compute_90a"], None),  # arch-specific code runs on that arch only
        ((10, 3), ["sm_100f"], ("sass", "sm_100f")),  # family-specific
        ((8, 0), ["sm_86", "compute_86"], None),  # neither runs on an older device
        ((9, 0), ["9.0"], ("sass", "sm_90")),
        ((9, 0), ["garbage", "sm_90"], ("sass", "sm_90")),
    ],
)
def test_arch_covers(device: tuple[int, int], archs: list[str], expected: tuple[str, str] | None) -> None:
    got = cc.arch_covers(device, archs)
    assert (None if got is None else (got.kind, got.by)) == expected


def test_parse_arch() -> None:
    assert str(cc.parse_arch("sm_120")) == "sm_120"
    assert (cc.parse_arch("compute_90a").major, cc.parse_arch("compute_90a").suffix) == (9, "a")
    with pytest.raises(ValueError, match="not a GPU arch: 'gfx90a'"):
        cc.parse_arch("gfx90a")
