"""Each failed entry's verdict: broken (with its cause code), ignored on every target, a warning, a GPU's to
judge, or not judged at all."""

from __future__ import annotations

from compatlab.incell.context import TargetInfo
from compatlab.incell.entries import ImportEntry
from compatlab.incell.imports.verdicts import Verdicts, and_more, ignored


def _target(name: str, *not_needed: str) -> TargetInfo:
    return TargetInfo(
        name=name, gpu="H100", arch=("sm_90",), gpus=8, min_driver=None, nccl_env={}, not_needed=not_needed
    )


def _failed(
    module: str, kind: str, *, library: str | None = None, cause: str | None = None, verdict: str | None = None
) -> ImportEntry:
    failure = {"kind": kind, "message": "m", **({"library": library} if library else {})}
    return ImportEntry(
        module=module,
        dist="pkg",
        ok=False,
        failure=failure,
        reason=f"{module}: {kind}",
        cause=cause,
        needed=False if verdict else None,
        verdict=verdict,
    )


def test_a_module_need_not_run_where_every_target_says_so() -> None:
    h100 = _target("h100", "*/sm100/*")
    assert ignored("pkg/sm100/ops.so", [h100]) is True
    assert ignored("pkg/sm100/ops.so", [h100, _target("b200")]) is False  # one target needs it
    assert ignored("pkg/sm100/ops.so", []) is False


def test_each_failure_is_told_by_its_kind() -> None:
    entries = [
        ImportEntry(module="pkg", dist="pkg", ok=True),
        _failed("pkg/_dep.so", "missing-dependency"),
        _failed("pkg/_lazy.so", "undefined-symbol", verdict="pkg/_lazy.so: not needed"),
        _failed("pkg/sm100/ops.so", "undefined-symbol"),
        _failed("pkg/_ops.so", "undefined-symbol", cause="torch-abi"),
        _failed("pkg/_hang.so", "timeout"),
        _failed("pkg/_cuda.so", "no-driver", library="libcuda.so.1"),
        _failed("pkg/_init.so", "no-driver"),
    ]
    assert Verdicts.of(entries, [_target("h100", "*/sm100/*")]) == Verdicts(
        broken=["pkg/_ops.so: undefined-symbol", "pkg/_hang.so: timeout"],
        codes=["torch-abi", "unclassified"],
        ignored=["pkg/sm100/ops.so: undefined-symbol"],
        unjudged=["pkg/_cuda.so: no-driver"],
        needs_gpu=["pkg/_init.so: no-driver"],
        undeclared=["pkg/_dep.so: missing-dependency", "pkg/_lazy.so: not needed"],
    )


def test_a_reason_says_how_many_more_there_are() -> None:
    assert and_more(["a"]) == ""
    assert and_more(["a", "b", "c"]) == " (and 2 more)"
