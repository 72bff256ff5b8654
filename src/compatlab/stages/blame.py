"""Every red, amber or grey stage result named by a code of the one table (incell/causes.py).

A stage that knows its cause sets ``StageResult.cause`` itself (the import suite, from each failed load);
``cause_of`` names the rest from what each stage writes, so that the runner can give every result a code
(``with_cause``) and the cell its independent causes (``blames``): one per stage and code, in pipeline order,
since an earlier stage's failure blocks more of the cell than a later one's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from compatlab.incell.causes import CAUSES
from compatlab.runs.model import Blame, StageResult, StageState
from compatlab.runs.records.pins import PinsDetails
from compatlab.runs.records.static import Kind, StaticDetails
from compatlab.runs.records.suite import SuiteDetails

__all__ = ["blames", "cause_of", "with_cause"]

_STATIC_KINDS: Mapping[Kind, str] = {
    Kind.FAMILY: "cuda-major-mix",
    Kind.LIBRARY: "missing-library",
    Kind.VERSION: "symbol-version",
    Kind.SYMBOL: "abi-symbol",
    Kind.DRIVER_API: "driver-too-old",
    Kind.DRIVER: "driver-too-old",
    Kind.ARCH: "no-kernel-image",
    Kind.METADATA: "metadata",
    Kind.UNREADABLE: "metadata",
    Kind.BY_NAME: "missing-library",
    Kind.TOOLCHAIN: "toolchain",
}


_ABI = {"abi-symbol", "torch-abi", "python-abi"}  # one break of one symbol, however precisely named


def _static(result: StageResult) -> str:
    """The code of static's first finding of the result's own severity (the stage's worst)."""
    for f in StaticDetails.of(result).findings:
        if f.severity.value == result.state.value:
            code = _STATIC_KINDS.get(f.kind, "unclassified")
            if code == "missing-library" and f.torch_cuda:
                return "cuda-major-mix"  # a CUDA library of another major than torch's (static's library_hint)
            if code == "abi-symbol" and any(ns in f.message for ns in ("c10::", "at::", "torch::")):
                return "torch-abi"
            return code
    return "unclassified"


def _pins(result: StageResult) -> str:
    reason = result.reason
    if " both install " in reason and PinsDetails.of(result).file_clashes:
        return "file-clash"
    if "CUDA" in reason or "cu1" in reason:
        return "cuda-major-mix"
    if "replaced by" in reason or "requires" in reason:
        return "pin-broken"
    return "unclassified"


def cause_of(result: StageResult) -> str:
    """The code of a result that is not green; "" for one that passed."""
    if result.cause:
        return result.cause
    state, reason = result.state, result.reason
    if state == StageState.PASS:
        return ""
    if state == StageState.SKIP:
        return "not-run" if result.required else ""
    if state == StageState.ERROR:
        if reason.startswith("disk full"):
            return "disk-full"  # uv_failures.classify_uv_failure's words for ENOSPC
        return "lab-error" if reason.startswith("lab error") else "infra"
    if state == StageState.WARN:
        if result.name == "static" and _static(result) == "toolchain":
            return "jit-toolchain"  # the JIT's nvcc: a kernel it must build will not build
        return "feature-broken" if result.name in ("import", "static") else ""
    name = result.name
    if name == "install":
        if reason.startswith("unsatisfiable"):
            return "unsatisfiable"
        return "placeholder-sdist" if "placeholder" in reason else "unclassified"
    if name == "pins":
        return _pins(result)
    if name == "static":
        return _static(result)
    if name == "import":
        return "pin-broken" if SuiteDetails.of(result).broken_pins else "import-error"
    if name in ("serve", "cuda"):
        low = reason.lower()
        if "no kernel image" in low:
            return "no-kernel-image"
        if any(w in low for w in ("ptxas", "nvcc", "jit", "triton", "compil")):
            return "jit-failed"
        return "serve-failed" if name == "serve" else "unclassified"
    if name == "perf":
        return "too-slow"
    if name == "nccl":
        return "nccl"
    return "unclassified"


def with_cause(result: StageResult) -> StageResult:
    """*result* carrying its code (unchanged when it has one, or passed)."""
    code = cause_of(result)
    if code == result.cause:
        return result
    assert code in CAUSES, code  # every code above is a row of the table
    return dataclasses.replace(result, cause=code)


def blames(stages: Sequence[StageResult]) -> tuple[Blame, ...]:
    """The cell's independent causes: each red stage's, and within the import stage each distinct code of
    its failures; one per (stage, code), pipeline order. The static stage's prediction is left out where
    the import stage ran and failed with the same code: the observation is the same cause, told better."""
    found: list[Blame] = []
    seen: set[tuple[str, str]] = set()
    imported = next((s for s in stages if s.name == "import" and s.state == StageState.FAIL), None)
    import_codes = {str(c.get("cause")) for c in SuiteDetails.of(imported).causes or ()} if imported else set()
    if imported is not None:
        import_codes.add(cause_of(imported))
    if import_codes & _ABI:
        import_codes |= _ABI
    # Import failures a file clash causes (runtime.observed_clashes): the clash's, told by the pins stage.
    by_clash = {r for s in stages if s.name == "pins" for c in PinsDetails.of(s).file_clashes for r in c.breaks or ()}
    for s in stages:
        if s.state != StageState.FAIL:
            continue
        rows = [(str(c.get("cause")), str(c.get("reason"))) for c in SuiteDetails.of(s).causes or ()]
        for said, reason in rows or [(cause_of(s), s.reason)]:
            # An exception beside a broken pin is what the pin does (runtime.blame_broken_pins).
            code = s.cause if said == "import-error" and s.cause == "pin-broken" else said
            if s.name == "static" and code in import_codes:
                continue
            if s.name == "import" and code == "import-error" and reason in by_clash:
                continue
            if (s.name, code) not in seen:
                seen.add((s.name, code))
                found.append(Blame(stage=s.name, code=code, reason=reason))
    return tuple(found)
