"""Shared fixtures of the lab's tests: a local index of tiny real wheels, served on loopback."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fixtures.shared_run import SharedRun, shared_run
from fixtures.wheels import build_wheel, serve, write_simple_index


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest tests (marked ``long``) first, the rest in their order: xdist hands the tests out in order,
    and one of a minute taken last keeps the run going that minute on one core while the others idle."""
    items.sort(key=lambda item: item.get_closest_marker("long") is None)


@pytest.fixture(scope="session")
def index_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """torch builds on their own index (like PyTorch's), everything else on a public-like one."""
    root = tmp_path_factory.mktemp("indexes")
    w = root / "wheels"
    cu13 = {"torch/version.py": "cuda = '13.0'\n"}
    cu12 = {"torch/version.py": "cuda = '12.8'\n"}
    torch_wheels = [
        build_wheel(w, "torch", "2.9.1+cu130", files=cu13, requires=["nvidia-cuda-runtime-cu13==13.0.96"]),
        build_wheel(w, "torch", "2.10.0+cu130", files=cu13, requires=["nvidia-cuda-runtime-cu13==13.0.96"]),
        build_wheel(w, "torch", "2.9.1+cu128", files=cu12, requires=["nvidia-cuda-runtime-cu12==12.8.90"]),
    ]
    public = [
        build_wheel(w, "sgl-kernel", "0.3.21"),
        # The generic build on the public index, as PyPI has it: what an unguarded resolve picks.
        build_wheel(w, "torch", "2.10.0", files=cu12, requires=["nvidia-cuda-runtime-cu12==12.8.90"]),
        build_wheel(w, "flashinfer-python", "0.6.4", requires=["torch"]),
        build_wheel(w, "flashinfer-python", "0.7.4", requires=["torch", "cuda-bindings>=13"]),
        build_wheel(w, "flashinfer-python", "0.8.0", requires=["torch>=2.10"]),
        build_wheel(w, "cuda-bindings", "13.0.3"),
        # Older than any pytest accepts: adding pytest to a cell that has it would change the stack.
        build_wheel(w, "pluggy", "0.13.1"),
        build_wheel(w, "nvidia-cuda-runtime-cu13", "13.0.96"),
        build_wheel(w, "nvidia-cuda-runtime-cu12", "12.8.90"),
    ]
    write_simple_index(root / "torch", torch_wheels)
    write_simple_index(root / "public", public)
    with serve(root) as url:
        yield url


@pytest.fixture(scope="session")
def expected_only_run(tmp_path_factory: pytest.TempPathFactory, index_url: str) -> SharedRun:
    """One whole `nox -s matrix` of EXPECTED_ONLY, made once for every worker of the run (fixtures.shared_run);
    the tests that take it only read its folder."""
    return shared_run(tmp_path_factory, index_url)
