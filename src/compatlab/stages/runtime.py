"""The runtime stages: import (every extension module loaded, in the cell) and cuda (driver, arch, real ops).

Both run a compat suite with the cell's own interpreter (``suite.run_suite``). ``compatlab check`` runs
them on an existing environment, e.g. on a GPU box::

    compatlab check --venv /tmp/cell --stage import --stage cuda --out reports/adhoc
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os

from packaging.utils import canonicalize_name

from compatlab.incell.entries import ImportEntry
from compatlab.runs.model import StageResult, StageState
from compatlab.runs.records.pins import FileClash, PinsDetails
from compatlab.runs.records.static import Finding, Kind, Severity, StaticDetails
from compatlab.runs.records.suite import SuiteDetails
from compatlab.stages.base import CellContext

__all__ = [
    "blame_broken_pins",
    "failed_by_path",
    "judge_loaded_by_path",
    "loaded_by_path",
    "observed",
    "run_cuda_stage",
    "run_import_stage",
]

log = logging.getLogger(__name__)


def run_import_stage(ctx: CellContext) -> StageResult:
    """Load every extension module of the cell's packages, each in its own process (incell/suites/test_import.py).

    Fails when a module cannot load for a reason of the stack (undefined symbol, missing library, crash,
    hang, Python ImportError); on a machine without a driver a stand-in libcuda.so.1 is used and said so.
    """
    from compatlab.stages.suite import run_suite

    result = judge_loaded_by_path(ctx, run_suite(ctx, "import"))
    return blame_broken_pins(result, ctx.stage("pins"))


def _loaded_by_no_extension(static: StageResult) -> set[str]:
    """The files whose static findings are notes: no extension module of the environment loads them."""
    return {f.module for f in StaticDetails.of(static).findings if not f.loaded_by_import}


def loaded_by_path(result: StageResult, static: StageResult | None) -> dict[str, str]:
    """The libraries a package's import mapped that static judged as loaded by no extension module (its
    findings notes), or as not needed by `import` (no Python code names it): what the package loads itself,
    by a computed path (ctypes over ``f"libbitsandbytes_cuda{v}.so"``, ``torch.ops.load_library`` over a
    glob). {label: the package whose import mapped it}."""
    if static is None:
        return {}
    unloaded = _loaded_by_no_extension(static) | set(StaticDetails.of(static).not_needed)
    out: dict[str, str] = {}
    for m in SuiteDetails.of(result).entries():
        if m.ok and m.is_package:
            for label in m.mapped or ():
                if label in unloaded:
                    out.setdefault(label, m.module)
    return out


def failed_by_path(result: StageResult, static: StageResult | None) -> dict[str, str]:
    """The files of the environment a package's import tried to load and could not, whatever their names
    (``ctypes.CDLL`` of a ``_C.so``, ``torch.ops.load_library``): {label: the package whose import tried}.
    Their static findings are that package's failures (the import failed on them); a build the package did
    not pick, a name this machine lacks, and a feature's library the import worked without are not."""
    if static is None:
        return {}
    # Only what static judged as loaded by no extension module (notes): an extension module's findings
    # already count, as the static stage's own.
    unloaded = _loaded_by_no_extension(static)
    out: dict[str, str] = {}
    for m in SuiteDetails.of(result).entries():
        for f in m.failed_loads or ():
            if f.get("judged") == "cause" and str(f.get("name", "")) in unloaded:
                out.setdefault(str(f["name"]), m.module)
    return out


def judge_loaded_by_path(ctx: CellContext, result: StageResult) -> StageResult:
    """Libraries a package's import loaded by path, judged as extension modules (static.judge_loaded_by_path):
    the static stage saw no extension module load them, so their findings were notes; the import stage saw
    the import map them, after `import torch`. A failure of theirs fails this stage, a warning warns."""
    mapped = loaded_by_path(result, ctx.stage("static"))
    failed = failed_by_path(result, ctx.stage("static"))
    found = {**mapped, **failed}
    if not found or result.state in (StageState.ERROR, StageState.SKIP):
        return result
    from compatlab.stages.static.stage import judge_loaded_by_path as judge

    targets = [(t.name, t.arch, t.not_needed) for t in ctx.matrix.targets]
    min_drivers = [(t.name, t.min_driver) for t in ctx.matrix.targets if t.min_driver]
    # The import mapped each of them and worked: the loader resolved their libraries and symbols, with what
    # the process had mapped already (tvm_ffi's libtvm_ffi.so, loaded before xgrammar's bindings need it).
    # What a load cannot prove (GPU code for the target, the driver a module needs) is still judged.
    findings = [
        f
        for f in judge(ctx.site, sorted(found), targets=targets, min_drivers=min_drivers)
        if f.module in failed or f.kind.value not in _LINK_KINDS
    ]
    state, reason = result.state, result.reason
    said: dict[str, list[str]] = {"fail": [], "warn": []}
    for f in findings:
        if f.severity in said:
            how = "tried to load it and could not" if f.module in failed else "loads it by path"
            said[f.severity].append(f"{f.message} (`import {found[f.module]}` {how})")
    record = dataclasses.replace(
        SuiteDetails.of(result),
        loaded_by_path=mapped,
        tried_by_path=failed or None,
        loaded_by_path_findings=tuple(f.to_json() for f in findings),
    )
    if said["fail"]:
        record = dataclasses.replace(record, failures=(*said["fail"], *(record.failures or ())))
        if state != StageState.FAIL:
            more = f" (and {len(said['fail']) - 1} more)" if len(said["fail"]) > 1 else ""
            state, reason = StageState.FAIL, said["fail"][0] + more
    if said["warn"]:
        record = dataclasses.replace(record, warnings=(*(record.warnings or ()), *said["warn"]))
        if state == StageState.PASS:
            more = f" (and {len(said['warn']) - 1} more)" if len(said["warn"]) > 1 else ""
            state, reason = StageState.WARN, said["warn"][0] + more
    return dataclasses.replace(result, state=state, reason=reason, details=record.to_details())


def blame_broken_pins(result: StageResult, pins: StageResult | None) -> StageResult:
    """A failed import whose module belongs to a distribution with a pin the installed set breaks (the pins
    stage's ``broken_requirements``: a forced cell, or a stack installed by hand) names that pin: it is
    what the failure says the pin was for. sgl-kernel pins torch exactly, and its module failing beside
    another torch is that pin broken: "…: undefined symbol …; sglang-kernel 0.4.10 requires torch==2.14.1;
    torch 2.15.0 is installed"."""
    if result.state != StageState.FAIL or pins is None:
        return result
    broken = PinsDetails.of(pins).broken_requirements
    record = SuiteDetails.of(result)
    modules = record.entries()
    failed = {canonicalize_name(m.dist) for m in modules if not m.ok}
    first, _, more = result.reason.partition(" (and ")
    # The pins of the distribution whose module the reason names come first.
    named = {canonicalize_name(m.dist) for m in modules if m.reason == first}
    blamed = sorted((b for b in broken if b.by in failed), key=lambda b: b.by not in named)
    if not blamed:
        return result
    # An exception of the package's own code beside a broken pin is that pin (pydantic's SystemError over
    # pydantic-core's version); a named ABI break keeps its code, with the pin in the reason.
    return dataclasses.replace(
        result,
        cause="pin-broken" if result.cause in ("import-error", "") else result.cause,
        reason=f"{first}; {blamed[0].text}" + (f" (and {more}" if more else ""),
        details=dataclasses.replace(record, broken_pins=tuple(b.text for b in blamed)).to_details(),
    )


def run_cuda_stage(ctx: CellContext) -> StageResult:
    """Driver, device arch and one real op per library (incell/suites/test_cuda.py); skipped without a GPU.

    Required: a skip here (no GPU on this machine) makes the cell 'partial', not 'pass'.

    Where the machine has no NVIDIA driver at all (``fakecuda.real_driver()``, asked here with the lab's
    environment, whose driver folders are the ones ``cell_env`` passes to the cell), every test of the suite
    would skip for that one reason: the stage skips with it without starting the suite (its pytest cost 0.6-0.9
    s a cell on the 2-core machine). Any sign of a driver and the suite runs and decides, as before.
    """
    from compatlab.incell import fakecuda
    from compatlab.stages.suite import run_suite

    if _no_driver():
        return StageResult(name="cuda", state=StageState.SKIP, reason=fakecuda.NO_DRIVER, required=True)
    return run_suite(ctx, "cuda", required=True)


@functools.cache
def _no_driver() -> bool:
    """Whether this machine has no NVIDIA driver: asked once a process (the machine's driver does not come
    and go during a run)."""
    from compatlab.incell import fakecuda

    return fakecuda.real_driver() is None


# Static's findings that a load in a real process proves wrong or moot: the loader found the library (one
# the process had already mapped, as ld.so does) and the symbols.
_LINK_KINDS = ("library", "symbol", "version", "by-name")


def observed(stages: tuple[StageResult, ...]) -> tuple[StageResult, ...]:
    """The stages, the pins stage's file clashes and static's prediction corrected by what the import
    stage saw (``observed_clashes``, ``observed_static``)."""
    return observed_static(observed_clashes(stages))


def observed_clashes(stages: tuple[StageResult, ...]) -> tuple[StageResult, ...]:
    """The stages, each file clash of code the pins stage failed on a warning when the import stage ran and every
    module of the clashing distributions loaded, among them an import of the clashing files' own top-level
    package: the files on disk are one owner's and they import (opencv-python's cv2/ overwritten by
    opencv-python-headless's; PyJWT's jwt/ by jwt's). What needs the other owner's own code gets these bytes,
    which the warning says. A clash whose owners' imports fail stays a failure and says the first failure it
    causes (pymongo's bson/ overwritten by bson's: `import pymongo` cannot import SON), listed as its ``breaks``:
    the import stage's failures there are the clash's, not a cause of their own (``blame.blames``). A clash where
    no import ran stays as the pins stage said it."""
    by_name = {s.name: s for s in stages}
    pins, imported = by_name.get("pins"), by_name.get("import")
    if pins is None or pins.state != StageState.FAIL or imported is None:
        return stages
    if imported.state in (StageState.SKIP, StageState.ERROR):
        return stages
    entries = SuiteDetails.of(imported).entries()
    found = PinsDetails.of(pins)
    fails, warns = list(found.failures), list(found.warnings)
    observed_warns: list[str] = []
    clashes: list[FileClash] = []
    for clash in found.file_clashes:
        text = clash.text
        if not clash.fails or text not in fails:
            clashes.append(clash)
            continue
        owners = {canonicalize_name(o.rsplit(" ", 1)[0]) for o in clash.owners}
        mine = [e for e in entries if canonicalize_name(e.dist) in owners]
        # The imports of the clashing files' own top-level package(s): what runs the bytes on disk.
        tops = {f.split("/", 1)[0].removesuffix(".py") for f in clash.examples}
        imports = sorted({e.module for e in mine if e.is_package and e.module.split(".")[0] in tops})
        broken = [str(e.reason) for e in mine if not e.ok and e.needed is not False and e.reason]
        if broken:
            # The clash is why they fail: said once, by the clash, with the first failure it causes.
            more = f" (and {len(broken) - 1} more)" if len(broken) > 1 else ""
            said = f"{text}; it breaks {broken[0]}{more}"
            fails[fails.index(text)] = said
            clashes.append(dataclasses.replace(clash, text=said, breaks=tuple(broken)))
        elif imports:
            said = (
                f"every module of theirs loads here ({', '.join(f'`import {m}`' for m in imports)}): what needs "
                "the other owner's own code gets these bytes instead"
            )
            fails.remove(text)
            observed_warns.append(f"{text}; {said}")
            clashes.append(dataclasses.replace(clash, fails=False, observed=said))
        else:
            clashes.append(clash)
    if tuple(clashes) == found.file_clashes:
        return stages
    warns = observed_warns + warns
    state = StageState.FAIL if fails else StageState.WARN
    top = fails or warns
    reason = top[0] + (f" (and {len(top) - 1} more)" if len(top) > 1 else "")
    seen = dataclasses.replace(found, failures=tuple(fails), warnings=tuple(warns), file_clashes=tuple(clashes))
    fixed = dataclasses.replace(pins, state=state, reason=reason, cause="", details=seen.to_details())
    return tuple(fixed if s is pins else s for s in stages)


def observed_static(stages: tuple[StageResult, ...]) -> tuple[StageResult, ...]:
    """The stages, static's prediction corrected by what the import stage saw, when both ran.

    A static failure of kind library, symbol, version or by-name on a module that loaded (alone, or mapped
    by its package's import, which worked) is no failure: the loader resolved it, with what the process had
    already mapped (a NEEDED soname not on the RUNPATH that the package's own import loaded a moment
    earlier). A failure on a module the import stage saw its package not need (``needed`` False: every
    import of its distribution worked without trying to load it) is a warning, whatever static guessed from
    the import graph. Both say so in the finding (``observed``). Without an import stage static keeps its
    prediction, and its reason says it is one.
    """
    by_name = {s.name: s for s in stages}
    static, imported = by_name.get("static"), by_name.get("import")
    if static is None or static.state not in (StageState.FAIL, StageState.WARN):
        return stages
    if imported is None or imported.state in (StageState.SKIP, StageState.ERROR):
        if static.state == StageState.FAIL and "prediction" not in static.reason:
            fixed = dataclasses.replace(static, reason=static.reason + " (static's prediction: no import ran)")
            return tuple(fixed if s is static else s for s in stages)
        return stages
    entries = SuiteDetails.of(imported).entries()
    loaded = {e.module for e in entries if e.ok}
    for e in entries:
        if e.is_package and e.ok:
            loaded.update(e.mapped or ())
    unneeded = {e.module: e for e in entries if e.needed is False}
    # A module the import stage loaded after a library of its own package (no RUNPATH finds it; its package
    # loads it first): static's "not found" of that library is moot, the library's own failure is the story.
    preloaded = {e.module: os.path.basename(e.preloaded) for e in entries if e.preloaded}
    packages: dict[str, list[ImportEntry]] = {}
    for e in entries:
        if e.is_package:
            packages.setdefault(canonicalize_name(e.dist), []).append(e)

    def untried(module: str, dist: object) -> bool:
        # Every import of its distribution worked and none tried to load it: a library the package loads
        # when a feature is used (torch_memory_saver's hook libraries, by ctypes, per CUDA major).
        mine = packages.get(canonicalize_name(str(dist)), []) if dist else []
        return bool(mine) and all(
            p.ok and module not in (p.mapped or ()) and all(x.get("name") != module for x in p.failed_loads or ())
            for p in mine
        )

    record = StaticDetails.of(static)
    changed = False
    out: list[Finding] = []
    for found in record.findings:
        module, fails_here = found.module, found.severity == Severity.FAIL
        f = found
        if fails_here and found.kind in _LINK_KINDS and module in loaded:
            f = dataclasses.replace(
                found, severity=Severity.NOTE, details={**found.details, "observed": "it loaded here"}
            )
        elif fails_here and found.kind == Kind.LIBRARY and preloaded.get(module) == found.library:
            said = f"its package loads {found.library} first; the import stage loaded it so"
            f = dataclasses.replace(found, severity=Severity.NOTE, details={**found.details, "observed": said})
        elif fails_here and (module in unneeded or untried(module, found.dist)):
            said = "`import` does not need it: its package imports without trying to load it"
            message = f"{found.message} ({said})"
            f = dataclasses.replace(
                found, severity=Severity.WARN, message=message, details={**found.details, "observed": said}
            )
        changed = changed or f is not found
        out.append(f)
    if not changed:
        return stages
    fails = [f for f in out if f.severity == Severity.FAIL]
    warns = [f for f in out if f.severity == Severity.WARN]
    state = StageState.FAIL if fails else StageState.WARN if warns else StageState.PASS
    top = fails or warns
    reason = (top[0].message + (f" (and {len(top) - 1} more)" if len(top) > 1 else "")) if top else ""
    fixed = dataclasses.replace(
        static,
        state=state,
        reason=reason,
        cause="",
        details=dataclasses.replace(record, findings=tuple(out), observed_by_import=True).to_details(),
    )
    return tuple(fixed if s is static else s for s in stages)
