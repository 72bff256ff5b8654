"""PEP 503 names on the standard library: what packaging.utils.canonicalize_name says of every valid name."""

from __future__ import annotations

import pytest
from packaging.utils import canonicalize_name as packaging_canonicalize_name

from compatlab.incell.names import canonicalize_name

NAMES = ["Flashinfer_Python", "flashinfer.python", "sgl-kernel", "SGL__Kernel", "zope.interface", "A-._-b", "torch"]


@pytest.mark.parametrize("name", NAMES)
def test_a_name_is_canonical_as_packaging_says(name: str) -> None:
    assert canonicalize_name(name) == packaging_canonicalize_name(name)


def test_runs_of_separators_are_one_dash_and_case_does_not_count() -> None:
    assert canonicalize_name("Flashinfer_Python") == "flashinfer-python"
    assert canonicalize_name("A-._-b") == "a-b"
