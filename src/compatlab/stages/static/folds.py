"""Folds: how the checks' raw findings become the stage's, as pure functions of findings.

- a module no extension module loads (a plugin, a library only dlopen()ed on demand) has notes only;
- a failing module `import <package>` does not need (needs.py) fails nothing: a warning that says what it
  costs; many missing symbols of such a module are one warning, and many absent libraries a file names to
  load by name are one finding (a list of candidates);
- the order: failures, then warnings, then notes; within each, by kind (a family mix first, the toolchain
  last), explained findings (where the library is shipped, a near miss) before bare ones, then the axis
  kinds' packages: the extensions' before torch's (the one required kind, which they extend: an extension
  that lacks a torch symbol is the story; torch's own findings rarely are).
"""

from __future__ import annotations

import dataclasses

from compatlab.config.axes import AXIS_KINDS
from compatlab.runs.records.static import Finding, Kind, Severity
from compatlab.stages.static.needs import ImportNeed

__all__ = ["CATALOG", "as_needed", "loaded_by_no_extension", "one_per_catalog", "one_symbol_warning", "ordered"]

_RANKED = tuple(
    sorted(
        dict.fromkeys(name for kind in AXIS_KINDS.values() for name in kind.imports),
        key=lambda name: any(name in k.imports for k in AXIS_KINDS.values() if k.required),
    )
)
_KIND_ORDER = {"family": 0, "library": 1, "version": 2, "symbol": 3, "driver-api": 4, "arch": 5, "toolchain": 6}
CATALOG = 4  # a file naming this many absent libraries is a list of candidates: one finding for it


def loaded_by_no_extension(found: list[Finding]) -> list[Finding]:
    """The findings of a file no extension module loads (nvshmem's MPI bootstrap, libcufile_rdma, a module
    for another Python): worth knowing, but no import of this environment fails on it."""
    return [
        f
        if f.severity == Severity.NOTE
        else dataclasses.replace(
            f,
            severity=Severity.NOTE,
            message=f.message + " (no extension module loads it)",
            details={**f.details, "loaded_by_import": False},
        )
        for f in found
    ]


def as_needed(f: Finding, need: ImportNeed) -> Finding:
    """A finding of a module that failed, told whether `import <package>` needs that module: an optional
    one's failure is a warning that says what it costs (the feature)."""
    details = {**f.details, "import_needs": need.needed, "import_needs_why": need.why}
    if f.severity != Severity.FAIL or not need.optional:
        return dataclasses.replace(f, details=details)
    if need.feature:
        details.update(feature=need.feature)
    return dataclasses.replace(f, severity=Severity.WARN, message=f"{f.message}; {need.words}", details=details)


def one_symbol_warning(found: list[Finding], rel: str, words: str) -> list[Finding]:
    """A module import does not need that lacks many symbols (cuda-core's cu12/_tensor_bridge, 25 of torch's
    aoti_* symbols): one warning naming them, not one each. Failures stay one a symbol."""
    missing = [f for f in found if f.kind == Kind.SYMBOL and f.severity == Severity.WARN]
    if len(missing) < 2:
        return found
    names = [f.shown_symbol for f in missing]
    merged = Finding(
        severity=Severity.WARN,
        module=rel,
        kind=Kind.SYMBOL,
        details={**missing[0].details, "symbols": [f.symbol for f in missing]},
        message=(
            f"{rel} needs {len(names)} symbols that no library in its load set defines: {', '.join(names[:4])}"
            + (f" and {len(names) - 4} more" if len(names) > 4 else "")
            + f"; {words}"
        ),
    )
    merged_ids = {id(f) for f in missing}
    return [f for f in found if id(f) not in merged_ids] + [merged]


def one_per_catalog(findings: list[Finding]) -> list[Finding]:
    """One finding for a file that names many absent libraries (cuda-pathfinder's descriptor_catalog.py
    names 92 across CUDA 12 and 13): a list of candidates the package looks for, each only when asked."""
    absent: dict[tuple[str, Severity], list[Finding]] = {}
    for f in findings:
        if f.found is None and "which ld.so would not find here" in f.message:
            absent.setdefault((f.module.rsplit(":", 1)[0], f.severity), []).append(f)
    out: list[Finding] = []
    grouped: set[int] = set()
    for (file, severity), group in absent.items():
        if len(group) < CATALOG:
            continue
        grouped |= {id(f) for f in group}
        names = [str(f.library) for f in group]
        out.append(
            Finding(
                severity=severity,
                module=group[0].module,
                kind=Kind.BY_NAME,
                details={
                    "libraries": names,
                    "named_in": sorted({p for f in group for p in f.named_in}),
                    "dist": group[0].given_dist,
                },
                message=(
                    f"{file} names {len(names)} libraries to load by name at run time that ld.so would not find here: "
                    f"{', '.join(names[:4])} and {len(names) - 4} more (each is needed only when the package loads it)"
                ),
            )
        )
    return [f for f in findings if id(f) not in grouped] + out


def _package_rank(rel: str) -> int:
    top = rel.split("/", maxsplit=1)[0]
    return _RANKED.index(top) if top in _RANKED else len(_RANKED)


def ordered(findings: list[Finding]) -> list[Finding]:
    """The findings, most important first (see the module's docstring)."""
    return sorted(
        findings,
        key=lambda f: (
            list(Severity).index(f.severity),
            _KIND_ORDER.get(f.kind, 9),
            "shipped_at" not in f.details and "torch_cuda" not in f.details,
            "near_misses" not in f.details,
            _package_rank(f.module),
            f.module,
        ),
    )
