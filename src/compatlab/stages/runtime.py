"""The runtime stages: import (every extension module loaded, in the cell) and cuda (driver, arch, real ops).

Both run a compat suite with the cell's own interpreter (``suite.run_suite``). ``compatlab check`` runs
them on an existing environment, e.g. on a GPU box::

    compatlab check --venv /tmp/cell --stage import --stage cuda --out reports/adhoc
"""

from __future__ import annotations

import dataclasses
import logging

from packaging.utils import canonicalize_name

from compatlab.incell.entries import import_entries
from compatlab.runs.model import StageResult, StageState
from compatlab.stages.base import CellContext

__all__ = [
    "blame_broken_pins",
    "judge_loaded_by_path",
    "loaded_by_path",
    "run_cuda_stage",
    "run_import_stage",
]

log = logging.getLogger(__name__)


def run_import_stage(ctx: CellContext) -> StageResult:
    """Load every extension module of the cell's packages, each in its own process (compat/test_import.py).

    Fails when a module cannot load for a reason of the stack (undefined symbol, missing library, crash,
    hang, Python ImportError); on a machine without a driver a stand-in libcuda.so.1 is used and said so.
    """
    from compatlab.stages.suite import run_suite

    result = judge_loaded_by_path(ctx, run_suite(ctx, "import"))
    return blame_broken_pins(result, ctx.stage("pins"))


def loaded_by_path(result: StageResult, static: StageResult | None) -> dict[str, str]:
    """The libraries a package's import mapped that static judged as loaded by no extension module (its
    findings notes), or as not needed by `import` (no Python code names it): what the package loads itself,
    by a computed path (ctypes over ``f"libbitsandbytes_cuda{v}.so"``, ``torch.ops.load_library`` over a
    glob). {label: the package whose import mapped it}."""
    if static is None:
        return {}
    unloaded = {
        str(f.get("module"))
        for f in static.details.get("findings") or []
        if isinstance(f, dict) and (f.get("details") or {}).get("loaded_by_import") is False
    }
    unloaded |= set(static.details.get("not_needed") or {})
    out: dict[str, str] = {}
    for m in import_entries(result.details):
        if m.ok and m.is_package:
            for label in m.mapped or ():
                if label in unloaded:
                    out.setdefault(label, m.module)
    return out


def judge_loaded_by_path(ctx: CellContext, result: StageResult) -> StageResult:
    """Libraries a package's import loaded by path, judged as extension modules (static.judge_loaded_by_path):
    the static stage saw no extension module load them, so their findings were notes; the import stage saw
    the import map them, after `import torch`. A failure of theirs fails this stage, a warning warns."""
    found = loaded_by_path(result, ctx.stage("static"))
    if not found or result.state in (StageState.ERROR, StageState.SKIP):
        return result
    from compatlab.stages.static.stage import judge_loaded_by_path as judge

    targets = [(t.name, t.arch, t.not_needed) for t in ctx.matrix.targets]
    min_drivers = [(t.name, t.min_driver) for t in ctx.matrix.targets if t.min_driver]
    findings = judge(ctx.site, sorted(found), targets=targets, min_drivers=min_drivers)
    details = {**result.details, "loaded_by_path": found}
    state, reason = result.state, result.reason
    said: dict[str, list[str]] = {"fail": [], "warn": []}
    for f in findings:
        if f.severity in said:
            said[f.severity].append(f"{f.message} (`import {found[f.module]}` loads it by path)")
    details["loaded_by_path_findings"] = [f.to_json() for f in findings]
    if said["fail"]:
        details["failures"] = [*said["fail"], *(details.get("failures") or [])]
        if state != StageState.FAIL:
            more = f" (and {len(said['fail']) - 1} more)" if len(said["fail"]) > 1 else ""
            state, reason = StageState.FAIL, said["fail"][0] + more
    if said["warn"]:
        details["warnings"] = [*(details.get("warnings") or []), *said["warn"]]
        if state == StageState.PASS:
            more = f" (and {len(said['warn']) - 1} more)" if len(said["warn"]) > 1 else ""
            state, reason = StageState.WARN, said["warn"][0] + more
    return dataclasses.replace(result, state=state, reason=reason, details=details)


def blame_broken_pins(result: StageResult, pins: StageResult | None) -> StageResult:
    """A failed import whose module belongs to a distribution with a pin the installed set breaks (the pins
    stage's ``broken_requirements``: a forced cell, or a stack installed by hand) names that pin: it is
    what the failure says the pin was for. sgl-kernel pins torch exactly, and its module failing beside
    another torch is that pin broken: "…: undefined symbol …; sglang-kernel 0.4.10 requires torch==2.14.1;
    torch 2.15.0 is installed"."""
    if result.state != StageState.FAIL or pins is None:
        return result
    broken = [b for b in pins.details.get("broken_requirements") or [] if isinstance(b, dict)]
    modules = import_entries(result.details)
    failed = {canonicalize_name(m.dist) for m in modules if not m.ok}
    first, _, more = result.reason.partition(" (and ")
    # The pins of the distribution whose module the reason names come first.
    named = {canonicalize_name(m.dist) for m in modules if m.reason == first}
    blamed = sorted((b for b in broken if b.get("by") in failed), key=lambda b: b.get("by") not in named)
    if not blamed:
        return result
    return dataclasses.replace(
        result,
        reason=f"{first}; {blamed[0]['text']}" + (f" (and {more}" if more else ""),
        details={**result.details, "broken_pins": [str(b["text"]) for b in blamed]},
    )


def run_cuda_stage(ctx: CellContext) -> StageResult:
    """Driver, device arch and one real op per library (incell/suites/test_cuda.py); skipped without a GPU.

    Required: a skip here (no GPU on this machine) makes the cell 'partial', not 'pass'.
    """
    from compatlab.stages.suite import run_suite

    return run_suite(ctx, "cuda", required=True)
