"""The static stage: predict, without a GPU and without importing anything, which modules will not load.

For every ELF shared object of the packages of interest in a site-packages directory:

1. library closure: each DT_NEEDED resolved as ld.so would (LD_LIBRARY_PATH unset), and the undefined
   symbols: defined, with the required version, somewhere in the module's load set, and for a C++ miss the
   near miss (same qualified name, another signature) that explains it (closure.py, over resolve.py);
2. GPU arch coverage of the embedded fatbinaries for each target (arch.py), and the driver floor: entry
   points of libcuda newer than a target's min-driver (driver.py);
3. wheel metadata lint (metadata.py, warnings only), libraries loaded by name (by_name.py), two majors of
   one library family (families.py) and the compilers the stack calls at run time (toolchain.py);
4. a failing module `import <package>` does not need is a warning (needs.py); folds.py orders and folds.

Usage: ``compatlab static --site-packages DIR [--target sm_90 ...] [--json]``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from packaging.utils import canonicalize_name

from compatlab.errors import LabError, UsageError
from compatlab.runs.model import StageResult, StageState
from compatlab.runs.records.static import Finding, Kind, Severity
from compatlab.site import declared_tops, is_extension, python_version_of, read_site_dists, walk_modules
from compatlab.stages.base import CellContext, cell_env
from compatlab.stages.static import folds
from compatlab.stages.static.arch import Targets, arch_findings
from compatlab.stages.static.by_name import by_name_findings
from compatlab.stages.static.closure import module_findings
from compatlab.stages.static.driver import driver_findings
from compatlab.stages.static.elf import ElfCache
from compatlab.stages.static.families import family_mixes
from compatlab.stages.static.fatbin import parse_arch
from compatlab.stages.static.metadata import metadata_findings
from compatlab.stages.static.needs import ImportNeeds, importable
from compatlab.stages.static.report import StaticReport
from compatlab.stages.static.resolve import SiteResolver
from compatlab.stages.static.toolchain import toolchain_problems

__all__ = ["NOT_NEEDED_FILE", "check_site_packages", "judge_loaded_by_path", "run_static_stage"]

# In the cell's work folder, static/: the modules that cannot load but that no package import needs, for
# the import stage to confirm (incell/imports/needed.py reads it; the name is spelled there too).
NOT_NEEDED_FILE = "not-needed.json"


def _check(
    site_packages: Path,
    *,
    targets: Targets,
    packages: Sequence[str] | None,
    cache: ElfCache | None = None,
    min_drivers: Sequence[tuple[str, str]] = (),
    env: Mapping[str, str] | None = None,
) -> StaticReport:
    """The stage's checks of *site_packages*; with *env* (the environment the stack runs in) also the
    compilers it calls at run time (toolchain.py)."""
    start = time.monotonic()
    sp = Path(site_packages)
    if not sp.is_dir():
        raise UsageError(f"{sp}: no such directory; pass the site-packages directory of an environment")
    for _name, archs, _nn in targets:
        for arch in archs:
            try:
                parse_arch(arch)
            except ValueError as exc:
                raise UsageError(str(exc)) from None
    cache = cache or ElfCache()
    hits0, misses0 = cache.hits, cache.misses
    site = SiteResolver(sp, cache)
    modules = walk_modules(sp, packages)
    cache.prefetch(modules, jobs=_cores())  # the files never read before, on every core (ELF parsing is CPU)
    py = python_version_of(sp)
    per_module: list[tuple[str, list[Finding]]] = []
    loaded_by_import: set[str] = set()
    loaders: dict[str, list[str]] = {}  # library -> the extension modules whose loading loads it
    not_needed: dict[str, dict[str, str]] = {}
    for path in modules:
        found, closure = _module(site, path, targets, min_drivers)
        per_module.append((os.path.normpath(path), found))
        if importable(path, py):
            loaded_by_import |= closure
            for lib in closure:
                loaders.setdefault(lib, []).append(os.path.normpath(path))
    findings: list[Finding] = []
    needs = ImportNeeds(sp, py)
    for mpath, raw in per_module:
        dist = site.dist_of(mpath)
        found = raw if dist is None else [f.of_dist(dist.name) for f in raw]
        if mpath not in loaded_by_import:
            found = folds.loaded_by_no_extension(found)
        elif any(f.severity == Severity.FAIL for f in found):
            need = needs.of(site.rel(mpath), [site.rel(e) for e in loaders.get(mpath, ())])
            found = [folds.as_needed(f, need) for f in found]
            if need.optional:
                not_needed[site.rel(mpath)] = {
                    "package": need.package,
                    "why": need.why,
                    "feature": need.feature,
                    "needed": need.needed,
                }
                findings.extend(folds.one_symbol_warning(found, site.rel(mpath), need.words))
                continue
        findings.extend(found)
    findings.extend(metadata_findings(site, modules, py))
    findings.extend(by_name_findings(site, modules, packages))
    for mix in family_mixes({d.name: d.version for d in site.dists}):
        findings.append(
            Finding(
                severity=Severity.FAIL,
                module=mix.other[0],
                kind=Kind.FAMILY,
                message=mix.message,
                details={"dist": mix.other[0], "family": mix.family.name, "versions": dict([mix.first, mix.other])},
            )
        )
    archs_all = list(dict.fromkeys(a for _n, archs, _nn in targets for a in archs))
    if env is not None and archs_all:
        for problem in toolchain_problems(
            sp,
            archs_all,
            env,
            torch_cuda=site.torch_cuda(),
            dists=[d.canonical for d in site.dists],
            owner=lambda path: d.canonical if (d := site.dist_of(str(path))) else None,
        ):
            findings.append(
                Finding(
                    severity=Severity(problem.severity),
                    module=problem.dist,
                    kind=Kind.TOOLCHAIN,
                    message=problem.message,
                    details={"dist": problem.dist, **problem.details},
                )
            )
    return StaticReport(
        site_packages=str(sp),
        archs=archs_all,
        findings=folds.ordered(findings),
        modules=len(modules),
        seconds=time.monotonic() - start,
        cache_hits=cache.hits - hits0,
        cache_misses=cache.misses - misses0,
        not_needed=not_needed,
    )


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _module(
    site: SiteResolver,
    path: Path,
    targets: Targets,
    min_drivers: Sequence[tuple[str, str]],
    *,
    after_torch: bool = False,
) -> tuple[list[Finding], set[str]]:
    """One module's findings (closure, arch coverage, driver floor), and the libraries its loading loads."""
    found, closure = module_findings(site, path, after_torch=after_torch)
    mpath = os.path.normpath(path)
    found.extend(arch_findings(site.rel(mpath), site.info(mpath), targets))
    found.extend(driver_findings(site.rel(mpath), site.info(mpath), min_drivers))
    return found, closure


def check_site_packages(
    site_packages: Path,
    *,
    archs: Sequence[str],
    not_needed: Sequence[str] = (),
    packages: Sequence[str] | None = None,
    cache: ElfCache | None = None,
    min_driver: str | None = None,
    env: Mapping[str, str] | None = None,
) -> StaticReport:
    """Check every shared object of *packages* (None: every package with .so files) in *site_packages*.

    *archs* are the device archs to cover (``sm_90``, ``sm_120``); modules matching a *not_needed* glob
    (relative to site-packages, e.g. ``sgl_kernel/sm100/*``) get a note instead of a failure when they
    lack code for one. Raises UsageError for a directory that does not exist or a bad arch.
    """
    return _check(
        site_packages,
        targets=[("", tuple(archs), tuple(not_needed))],
        packages=packages,
        cache=cache,
        min_drivers=[("", min_driver)] if min_driver else (),
        env=env,
    )


def judge_loaded_by_path(
    site_packages: Path,
    rels: Sequence[str],
    *,
    targets: Targets,
    min_drivers: Sequence[tuple[str, str]] = (),
) -> list[Finding]:
    """Libraries a package's `import` loads by path (ctypes over a computed name, ``torch.ops.load_library``
    over a glob), judged as extension modules are: this stage sees no extension module load them (their
    findings are notes), but the import stage saw the import map them. Their closure is resolved with what
    `import torch` loaded before them, and their findings keep their severity."""
    site = SiteResolver(Path(site_packages), ElfCache())
    out: list[Finding] = []
    for rel in rels:
        found, _closure = _module(
            site, Path(site_packages) / rel, targets, min_drivers, after_torch=site.torch_dist is not None
        )
        out.extend(dataclasses.replace(f, details={**f.details, "loaded_by_path": True}) for f in found)
    return out


def run_static_stage(ctx: CellContext) -> StageResult:
    """The matrix's ``static`` stage for one cell: every target's archs, with its not-needed globs.

    The modules checked are those of the cell's declared packages (torch, sgl-kernel, flashinfer …) and
    the libraries their wheels bundle; other packages' libraries are still read as providers.
    """
    targets = [(t.name, t.arch, t.not_needed) for t in ctx.matrix.targets]
    declared = [v.package for v in ctx.cell.packages if v.package]
    try:
        report = _check(
            ctx.site,
            targets=targets,
            packages=declared_tops(ctx.site, declared),
            min_drivers=[(t.name, t.min_driver) for t in ctx.matrix.targets if t.min_driver],
            env=cell_env(ctx.venv),  # what SGLang's server will run with: its compilers are these
        )
    except LabError as exc:
        return StageResult(name="static", state=StageState.ERROR, reason=str(exc))
    record = report.record(modules_by_dist=_modules_by_dist(ctx.site, declared))
    # The import stage confirms these with what each package import actually mapped (NOT_NEEDED_FILE).
    out = ctx.work_dir / "static"
    out.mkdir(parents=True, exist_ok=True)
    (out / NOT_NEEDED_FILE).write_text(json.dumps(report.not_needed, indent=2) + "\n", encoding="utf-8")
    return StageResult(
        name="static", state=report.state, reason=report.reason, details=record.to_details(), seconds=report.seconds
    )


def _modules_by_dist(sp: Path, dists: Sequence[str]) -> dict[str, list[str]]:
    """Each declared distribution's extension modules (RECORD paths), for the per-package table."""
    wanted = {canonicalize_name(d) for d in dists}
    py = python_version_of(sp)
    out: dict[str, list[str]] = {}
    for dist in read_site_dists(sp)[0]:
        if dist.canonical in wanted:
            out[dist.name] = sorted(
                f for f in dist.files if f.endswith(".so") and not f.startswith("..") and is_extension(Path(f), py)
            )
    return out
