"""A static finding's own details are read through its properties (runs/records/static.py), as the folds do."""

from __future__ import annotations

import pytest

from compatlab.runs.records.static import Finding, Kind, Severity


def _symbol(symbol: str, demangled: str | None = None, **more: object) -> Finding:
    details: dict[str, object] = {"symbol": symbol, **more}
    if demangled is not None:
        details["demangled"] = demangled
    return Finding(severity=Severity.WARN, module="pkg/_C.so", kind=Kind.SYMBOL, message="m", details=details)


def test_a_symbol_is_shown_demangled_where_it_could_be() -> None:
    plain = _symbol("_ZN3c104cuda19CUDAErrorLogCaptureD1Ev", "c10::cuda::CUDAErrorLogCapture::~CUDAErrorLogCapture()")
    assert plain.symbol == "_ZN3c104cuda19CUDAErrorLogCaptureD1Ev"
    assert plain.shown_symbol == "c10::cuda::CUDAErrorLogCapture::~CUDAErrorLogCapture()"
    assert _symbol("cudaMalloc").shown_symbol == "cudaMalloc"


def test_a_finding_without_a_symbol_says_so() -> None:
    bare = Finding(severity=Severity.FAIL, module="m.so", kind=Kind.SYMBOL, message="m")
    with pytest.raises(KeyError):
        _ = bare.symbol


def test_the_distribution_given_and_defaulted() -> None:
    unnamed = _symbol("s")
    assert (unnamed.given_dist, unnamed.dist) == (None, "")
    named = unnamed.of_dist("flashinfer-python")
    assert (named.given_dist, named.dist) == ("flashinfer-python", "flashinfer-python")
    # a finding that already names its distribution keeps it, and the original is not changed
    assert named.of_dist("torch").dist == "flashinfer-python"
    assert unnamed.details == {"symbol": "s"}


def test_a_by_name_finding_says_where_it_was_found_and_who_names_it() -> None:
    f = Finding(
        severity=Severity.WARN,
        module="cuda/pathfinder/_dynamic_libs/descriptor_catalog.py:12",
        kind=Kind.BY_NAME,
        message="m",
        details={"library": "libnvrtc.so.12", "named_in": ["a.py:1", "b.py:2"], "found": None},
    )
    assert (f.library, f.found, f.named_in) == ("libnvrtc.so.12", None, ["a.py:1", "b.py:2"])
    assert Finding.from_json(f.to_json()) == f
