"""stages/blame.py names a red or amber static stage by the first finding of its own severity, read from the
stage's record (runs/records/static.py) as the stage writes it."""

from __future__ import annotations

import pytest

from compatlab.incell.causes import CAUSES
from compatlab.runs.model import StageResult, StageState
from compatlab.runs.records.static import Finding, Kind, Severity, StaticDetails
from compatlab.stages import blame


def _static(state: StageState, *findings: Finding) -> StageResult:
    return StageResult(
        name="static", state=state, reason=findings[0].message, details=StaticDetails(findings=findings).to_details()
    )


def _finding(kind: Kind, message: str = "m.so: x", severity: Severity = Severity.FAIL, **details: str) -> Finding:
    return Finding(severity=severity, module="m.so", kind=kind, message=message, details=dict(details))


KIND_CODES = [
    (Kind.FAMILY, "cuda-major-mix"),
    (Kind.LIBRARY, "missing-library"),
    (Kind.VERSION, "symbol-version"),
    (Kind.SYMBOL, "abi-symbol"),
    (Kind.DRIVER_API, "driver-too-old"),
    (Kind.DRIVER, "driver-too-old"),
    (Kind.ARCH, "no-kernel-image"),
    (Kind.METADATA, "metadata"),
    (Kind.UNREADABLE, "metadata"),
    (Kind.BY_NAME, "missing-library"),
    (Kind.TOOLCHAIN, "toolchain"),
]


@pytest.mark.parametrize(("kind", "code"), KIND_CODES)
def test_each_kind_of_static_failure_has_a_code_of_the_table(kind: Kind, code: str) -> None:
    assert code in CAUSES
    assert blame.cause_of(_static(StageState.FAIL, _finding(kind))) == code


def test_every_kind_a_finding_may_have_is_named_above() -> None:
    assert sorted(k for k, _ in KIND_CODES) == sorted(Kind)


def test_the_first_finding_of_the_stages_own_severity_names_it() -> None:
    note = _finding(Kind.ARCH, severity=Severity.NOTE)
    warn = _finding(Kind.METADATA, severity=Severity.WARN)
    symbol = _finding(Kind.SYMBOL, "m.so needs c10::cuda::f(int)")
    library = _finding(Kind.LIBRARY)
    assert blame.cause_of(_static(StageState.FAIL, note, warn, symbol, library)) == "torch-abi"
    assert blame.cause_of(_static(StageState.FAIL, library, symbol)) == "missing-library"
    assert blame.cause_of(_static(StageState.FAIL, _finding(Kind.SYMBOL, "m.so needs ns::f(int)"))) == "abi-symbol"
    assert blame.cause_of(_static(StageState.FAIL, note)) == "unclassified"  # no failure among its findings


def test_a_missing_cuda_library_of_another_major_than_torchs_is_a_cuda_major_mix() -> None:
    mix = _finding(Kind.LIBRARY, "m.so needs libcudart.so.12", library="libcudart.so.12", torch_cuda="13.0")
    assert mix.torch_cuda == "13.0"
    assert blame.cause_of(_static(StageState.FAIL, mix)) == "cuda-major-mix"
    assert blame.cause_of(_static(StageState.FAIL, _finding(Kind.LIBRARY, library="libfoo.so.1"))) == "missing-library"


def test_a_static_warning_is_a_broken_feature_unless_the_jit_toolchain_is_missing() -> None:
    toolchain = _finding(Kind.TOOLCHAIN, "nvcc is not on PATH: the JIT cannot build", severity=Severity.WARN)
    arch = _finding(Kind.ARCH, severity=Severity.WARN)
    assert blame.cause_of(_static(StageState.WARN, toolchain)) == "jit-toolchain"
    assert blame.cause_of(_static(StageState.WARN, arch)) == "feature-broken"
    assert blame.cause_of(StageResult(name="static", state=StageState.ERROR, reason="cannot read x.so")) == "infra"
