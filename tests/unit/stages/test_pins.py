"""Pure logic of the pins stage: which CUDA major a package belongs to, and driver floors."""

from __future__ import annotations

import pytest

from compatlab.stages.pins import _driver_ok, cuda_major_of


@pytest.mark.parametrize(
    ("name", "version", "files", "major"),
    [
        ("nvidia-cublas-cu12", "12.8.4.1", [], 12),
        ("nvidia-nccl-cu13", "2.28.9", [], 13),
        ("cupy-cuda12x", "13.4.0", [], 12),
        ("cuda-bindings", "13.5.0", [], 13),
        ("cuda-python", "12.6.2.post1", [], 12),
        ("nvidia-cuda-runtime", "13.0.96", [], 13),
        # cuFFT numbers itself: 12.0 is the CUDA 13 build; only its files say so.
        ("nvidia-cufft", "12.0.0.61", ["nvidia/cu13/lib/libcufft.so.12"], 13),
        ("nvidia-cufft", "12.0.0.61", [], None),
        ("nvidia-curand", "10.4.0.35", ["nvidia/cu13/lib/libcurand.so.10"], 13),
        ("numpy", "2.3.0", [], None),
    ],
)
def test_cuda_major_of(name: str, version: str, files: list[str], major: int | None) -> None:
    assert cuda_major_of(name, version, files) == major


def test_driver_floor_is_compared_at_the_precision_given() -> None:
    assert _driver_ok("580.65", "580.65.06") is True
    assert _driver_ok("580.159.03", "580.65.06") is True
    assert _driver_ok("570.86", "580.65.06") is False
    assert _driver_ok(None, "580.65.06") is None
