"""The static stage: predict, without a GPU and without importing anything, which modules will not load.

For every ELF shared object of the packages of interest in a site-packages directory:

1. library closure: each DT_NEEDED resolved as ld.so would (LD_LIBRARY_PATH unset);
2. undefined symbols: defined, with the required version, somewhere in the module's load set, and for a
   C++ miss the near miss (same qualified name, another signature) that explains it;
3. GPU arch coverage of the embedded fatbinaries for each target;
4. wheel metadata lint (warnings only).

Usage: ``compatlab static --site-packages DIR [--target sm_90 ...] [--json]``.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import importlib.resources
import json
import logging
import os
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from enum import StrEnum
from pathlib import Path
from typing import Any

from compatlab.config.axes import AXIS_KINDS
from compatlab.errors import LabError, UsageError
from compatlab.incell.files import read_regular
from compatlab.incell.loadcheck import CUDA_MAJOR_LIB as _CUDA_MAJOR_LIB  # the one table, shared with import
from compatlab.incell.loadcheck import dynamic_symbols
from compatlab.incell.reach import ImportGraph, dotted_name, package_of
from compatlab.runs.model import StageResult, StageState
from compatlab.site import (
    SiteDist,
    declared_tops,
    is_extension,
    is_shared_object,
    python_version_of,
    read_site_dists,
    walk_modules,
)
from compatlab.site import torch_cuda as site_torch_cuda
from compatlab.stages.base import CellContext, cell_env
from compatlab.stages.static.elf import ElfCache, UndefinedSymbol, demangle
from compatlab.stages.static.families import family_mixes
from compatlab.stages.static.fatbin import coverage, parse_arch

# Importable from here before the resolution moved out (tests use ld_cache); explicit re-exports for mypy.
from compatlab.stages.static.ldso import TORCH_PRELOAD_GLOBS as TORCH_PRELOAD_GLOBS  # noqa: PLC0414
from compatlab.stages.static.ldso import Library, LoadSet, Resolver, provided_symbols
from compatlab.stages.static.ldso import ld_cache as ld_cache  # noqa: PLC0414
from compatlab.stages.static.symbols import function_name, last_identifier, symbol_offers
from compatlab.stages.static.toolchain import toolchain_problems

__all__ = [
    "DRIVER_LIBS",
    "NOT_NEEDED_FILE",
    "Finding",
    "StaticReport",
    "check_site_packages",
    "format_report",
    "judge_loaded_by_path",
    "run_static_stage",
]

log = logging.getLogger(__name__)

# Findings in the axis kinds' packages come first: the extensions' before torch's (the one required kind,
# which they extend: an extension that lacks a torch symbol is the story; torch's own findings rarely are).
_RANKED = tuple(
    sorted(
        dict.fromkeys(name for kind in AXIS_KINDS.values() for name in kind.imports),
        key=lambda name: any(name in k.imports for k in AXIS_KINDS.values() if k.required),
    )
)
# In the cell's work folder, static/: the modules that cannot load but that no package import needs, for
# the import stage to confirm (incell/suites/test_import.py reads it; the name is spelled there too).
NOT_NEEDED_FILE = "not-needed.json"
# Installed with the NVIDIA driver, never with a wheel: missing on a machine without a GPU is expected.
DRIVER_LIBS = frozenset({"libcuda.so.1", "libcuda.so", "libnvidia-ml.so.1", "libnvidia-ml.so"})
# Libraries whose soname major is the CUDA major they were built for (libcufft.so.11 is CUDA 12: not it).
_KIND_ORDER = {"family": 0, "library": 1, "version": 2, "symbol": 3, "driver-api": 4, "arch": 5, "toolchain": 6}


class Severity(StrEnum):
    """fail: an import of this environment fails on it; warn: worth reading; note: no import needs it."""

    FAIL = "fail"
    WARN = "warn"
    NOTE = "note"


class Kind(StrEnum):
    """What a finding is about."""

    FAMILY = "family"  # two majors of one library family (cu12 beside cu13)
    LIBRARY = "library"  # a needed library is not found
    VERSION = "version"  # a needed symbol version is not provided
    SYMBOL = "symbol"  # a needed symbol is not defined
    DRIVER_API = "driver-api"  # a CUDA driver API newer than the target's driver
    ARCH = "arch"  # no code for the target GPU
    METADATA = "metadata"  # a distribution's metadata is broken
    DRIVER = "driver"  # the driver a module needs
    UNREADABLE = "unreadable"  # a file that cannot be read as ELF
    BY_NAME = "by-name"  # a library loaded by name, not by a DT_NEEDED entry
    TOOLCHAIN = "toolchain"  # a compiler the stack calls at run time (Triton's ptxas, the JIT's nvcc)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Finding:
    """One thing the checker found about one module (or distribution); ``dataclasses.replace`` changes one."""

    severity: Severity
    module: str  # path relative to site-packages, or the distribution for metadata findings
    kind: Kind
    message: str
    details: dict[str, Any] = dataclasses.field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "severity": self.severity.value,
            "module": self.module,
            "kind": self.kind.value,
            "message": self.message,
            "details": self.details,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Finding:
        """A finding as to_json wrote it (a stage's details); a key or a value it does not know raises."""
        unknown = set(data) - {"severity", "module", "kind", "message", "details"}
        if unknown:
            raise ValueError(f"a static finding has unknown keys: {', '.join(sorted(unknown))}")
        return cls(
            severity=Severity(data["severity"]),
            module=str(data["module"]),
            kind=Kind(data["kind"]),
            message=str(data["message"]),
            details=dict(data.get("details") or {}),
        )


@dataclasses.dataclass(kw_only=True, slots=True)
class StaticReport:
    """All findings of one site-packages directory, most important failure first."""

    site_packages: str
    archs: list[str]
    findings: list[Finding]
    modules: int
    seconds: float
    cache_hits: int
    cache_misses: int
    # Modules that cannot load but that `import <package>` does not need: rel path -> package, why, feature.
    not_needed: dict[str, dict[str, str]] = dataclasses.field(default_factory=dict)

    def of(self, severity: Severity) -> list[Finding]:
        return [f for f in self.findings if f.severity == severity]

    @property
    def state(self) -> StageState:
        if self.of(Severity.FAIL):
            return StageState.FAIL
        return StageState.WARN if self.of(Severity.WARN) else StageState.PASS

    @property
    def reason(self) -> str:
        """One line: the most important failure (else warning) plus how many more there are."""
        for severity in (Severity.FAIL, Severity.WARN):
            found = self.of(severity)
            if found:
                more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
                return found[0].message + more
        return ""

    def counts(self) -> dict[str, int]:
        return {s.value: len(self.of(s)) for s in Severity}

    def to_json(self) -> dict[str, Any]:
        return {
            "site_packages": self.site_packages,
            "archs": self.archs,
            "state": self.state,
            "counts": self.counts(),
            "modules": self.modules,
            "seconds": round(self.seconds, 3),
            "cache": {"hits": self.cache_hits, "misses": self.cache_misses},
            "findings": [f.to_json() for f in self.findings],
            "not_needed": self.not_needed,
        }


class _Checker(Resolver):
    def __init__(self, sp: Path, cache: ElfCache) -> None:
        self.dists, hashes = read_site_dists(sp)
        super().__init__(sp, cache, hashes)
        self.owner: dict[str, SiteDist] = {}
        for d in self.dists:
            for rel in d.files:
                self.owner[os.path.normpath(os.path.join(str(sp), rel))] = d
        self._files_by_name: dict[str, list[str]] | None = None
        self._near_miss: dict[tuple[str, tuple[str, ...]], list[tuple[str, Library]]] = {}
        self._joined: dict[str, str] = {}
        self.torch_dist = next((d for d in self.dists if d.name.lower() == "torch"), None)

    def rel(self, path: str) -> str:
        try:
            return Path(path).relative_to(self.sp).as_posix()
        except ValueError:
            return path

    def dist_of(self, path: str) -> SiteDist | None:
        return self.owner.get(os.path.normpath(path))

    # Findings --------------------------------------------------------------------------------------

    def files_by_name(self) -> dict[str, list[str]]:
        """Every shared object under site-packages by file name: where a missing library may be."""
        if self._files_by_name is None:
            index: dict[str, list[str]] = {}
            for root, _dirs, files in os.walk(self.sp):
                for name in files:
                    if is_shared_object(name):
                        index.setdefault(name, []).append(os.path.join(root, name))
            self._files_by_name = index
        return self._files_by_name

    def torch_cuda(self) -> str | None:
        return site_torch_cuda(self.sp)

    def library_hint(self, name: str, needer: str, module: str) -> tuple[str, dict[str, Any]]:
        details: dict[str, Any] = {}
        elsewhere = self.files_by_name().get(name, [])
        if elsewhere:
            where = self.rel(elsewhere[0])
            dist = self.dist_of(elsewhere[0])
            details["shipped_at"] = where
            who = f"{dist.name} {dist.version} ships it at {where}" if dist else f"{where} exists"
            return f"{who}, but nothing on {self.rel(needer)}'s search path points there", details
        m = _CUDA_MAJOR_LIB.match(name)
        stem = name.split(".so", maxsplit=1)[0] + ".so."
        others = sorted(
            self.rel(p)
            for n, ps in self.files_by_name().items()
            if n.startswith(stem) and re.fullmatch(r"\d+", n[len(stem) :])
            for p in ps
        )
        details["other_versions"] = others
        cuda = self.torch_cuda()
        mod_dist = self.dist_of(module)
        mod_name = mod_dist.name if mod_dist else self.rel(module).split("/")[0]
        if m and cuda and cuda.split(".")[0] != m.group(2):
            where = ""
            cudart = self.torch_loaded.get(f"libcudart.so.{cuda.split('.')[0]}")
            if cudart is not None:
                parent = Path(self.rel(cudart.path)).parent
                where = f" ({(parent.parent if parent.name == 'lib' else parent).as_posix()})"
            details["torch_cuda"] = cuda
            return (
                f"this environment's torch is CUDA {cuda}{where}; {mod_name} was built for CUDA {m.group(2)}"
            ), details
        if others:
            return f"this environment has {', '.join(others)}", details
        return "not in site-packages nor in the system's library cache", details

    def near_miss(self, symbol: str, libs: Sequence[Library]) -> list[tuple[str, Library]]:
        """Definitions with the same qualified C++ name as *symbol* but another signature."""
        wanted = function_name(demangle(symbol))
        if wanted is None:
            return []
        ident = last_identifier(wanted)
        if not ident:
            return []
        needle = f"{len(ident)}{ident}"
        key = (symbol, tuple(lib.info.sha256 for lib in libs))
        if key in self._near_miss:
            return self._near_miss[key]
        out: list[tuple[str, Library]] = []
        for lib in libs:
            joined = self._joined.get(lib.info.sha256)
            if joined is None:
                joined = self._joined[lib.info.sha256] = "\n" + "\n".join(lib.info.defined) + "\n"
            pos = joined.find(needle)
            while pos >= 0:
                start = joined.rfind("\n", 0, pos) + 1
                end = joined.find("\n", pos)
                cand = joined[start:end]
                if cand != symbol and cand.startswith("_Z"):
                    pretty = demangle(cand)
                    if function_name(pretty) == wanted:
                        out.append((pretty, lib))
                pos = joined.find(needle, end)
        self._near_miss[key] = out
        return out


def _check_module(ck: _Checker, path: Path, *, after_torch: bool = False) -> tuple[list[Finding], set[str]]:
    """Findings about one module, and the paths of the libraries its loading loads."""
    findings: list[Finding] = []
    mpath = os.path.normpath(path)
    rel = ck.rel(mpath)
    module = ck._lib(mpath)
    if module is None:
        # Never a silent pass: the static stage says it could not judge this file (the import stage will).
        why = ck.unreadable.get(mpath, f"{mpath}: not a readable ELF file").replace(mpath, rel)
        return [
            Finding(
                severity=Severity.WARN,
                module=rel,
                kind=Kind.UNREADABLE,
                details={"why": why},
                message=f"{why}; the static stage cannot check it",
            )
        ], {mpath}
    ls = ck.load_set(module, after_torch=after_torch)
    missing_names = set()
    for name, needer in ls.missing:
        missing_names.add(name)
        via = "" if needer == mpath else f" (needed by {ck.rel(needer)})"
        unreadable = next((p for p in ck.unreadable if os.path.basename(p) == name), None)
        if unreadable is not None:
            why = ck.unreadable[unreadable].replace(unreadable, ck.rel(unreadable))
            findings.append(
                Finding(
                    severity=Severity.WARN,
                    module=rel,
                    kind=Kind.UNREADABLE,
                    details={"library": name, "why": why},
                    message=f"{rel} needs {name}{via}; {why}; the static stage cannot check it",
                )
            )
            continue
        if name in DRIVER_LIBS:
            findings.append(
                Finding(
                    severity=Severity.NOTE,
                    module=rel,
                    kind=Kind.DRIVER,
                    message=f"{rel}: {name} not found{via}: it comes with the NVIDIA driver, not with a wheel",
                    details={"library": name, "needed_by": ck.rel(needer)},
                )
            )
            continue
        hint, details = ck.library_hint(name, needer, mpath)
        findings.append(
            Finding(
                severity=Severity.FAIL,
                module=rel,
                kind=Kind.LIBRARY,
                message=f"{rel}: {name} not found{via}: {hint}",
                details={"library": name, "needed_by": ck.rel(needer), **details},
            )
        )

    # Versions needed from each library (.gnu.version_r): ld.so refuses the whole module on a miss.
    explained: set[tuple[str, str]] = set()
    for file, versions in module.info.version_needs.items():
        lib = ls.by_soname.get(file)
        if lib is None:
            continue
        for v in versions:
            if v not in lib.info.version_defs:
                explained.add((file, v))
                users = sorted({u.name for u in module.info.undefined if u.version == v and u.library == file})
                offers = symbol_offers(v, lib.info.version_defs)
                findings.append(
                    Finding(
                        severity=Severity.FAIL,
                        module=rel,
                        kind=Kind.VERSION,
                        message=f"{rel} needs {v} from {file}; {ck.rel(lib.path)} {offers}",
                        details={
                            "library": file,
                            "version": v,
                            "provider": ck.rel(lib.path),
                            "symbols": [demangle(s) for s in users],
                        },
                    )
                )

    driver_missing = bool(missing_names & DRIVER_LIBS)
    mod_dist = ck.dist_of(mpath)
    mod_name = mod_dist.name if mod_dist else rel.split("/")[0]
    for sym in module.info.undefined:
        if sym.weak or provided_symbols(sym, ls.libs):
            continue
        if sym.library and (sym.library in missing_names or (sym.library, sym.version) in explained):
            continue  # reported with the library or version it comes from
        if ck.python is None and sym.name.startswith(("Py", "_Py")):
            continue
        if driver_missing and re.match(r"^(cu|nvml)[A-Z]", sym.name):
            continue  # the driver's API, from a library this machine does not have
        findings.append(_symbol_finding(ck, rel, mod_name, sym, ls))
    return findings, {lib.path for lib in ls.libs}


def _symbol_finding(ck: _Checker, rel: str, mod_name: str, sym: UndefinedSymbol, ls: LoadSet) -> Finding:
    pretty = demangle(sym.name)
    details: dict[str, Any] = {"symbol": sym.name, "demangled": pretty, "version": sym.version, "library": sym.library}
    near = ck.near_miss(sym.name, ls.libs) if sym.name.startswith("_Z") else []
    if near:
        other, lib = near[0]
        dist = ck.dist_of(lib.path)
        who = f"{dist.name} {dist.version}" if dist else ck.rel(lib.path)
        because = (
            f"{mod_name} was built against another {dist.name}"
            if dist and dist.name != mod_name
            else "the files do not come from one build"
        )
        details["near_misses"] = [{"demangled": p, "provider": ck.rel(x.path)} for p, x in near]
        return Finding(
            severity=Severity.FAIL,
            module=rel,
            kind=Kind.SYMBOL,
            details=details,
            message=f"{rel} needs {pretty}; {who} ({os.path.basename(lib.path)}) exports {other}: {because}.",
        )
    if sym.version:
        text = (
            f"{rel} needs {pretty}@{sym.version} ({sym.library}), which no library in its load set "
            f"defines with that version"
        )
    else:
        text = f"{rel} needs {pretty}, which no library in its load set defines"
    missing = sorted({n for n, _ in ls.missing if n not in DRIVER_LIBS})
    if missing:
        # The module already fails on the missing library, which may well define this symbol.
        details["maybe_from_missing"] = missing
        return Finding(
            severity=Severity.NOTE,
            module=rel,
            kind=Kind.SYMBOL,
            details=details,
            message=f"{text} (it may come from the missing {', '.join(missing)})",
        )
    return Finding(severity=Severity.FAIL, module=rel, kind=Kind.SYMBOL, message=text, details=details)


def _arch_findings(
    ck: _Checker, path: Path, targets: Sequence[tuple[str, Sequence[str], Sequence[str]]]
) -> list[Finding]:
    mpath = os.path.normpath(path)
    rel = ck.rel(mpath)
    info = ck.info(mpath)
    if info is None:
        return []
    out: list[Finding] = []
    if info.fatbin_error:
        out.append(
            Finding(
                severity=Severity.WARN,
                module=rel,
                kind=Kind.ARCH,
                message=f"{rel}: cannot read its GPU code: {info.fatbin_error}",
            )
        )
    if not info.fatbins:
        return out
    # NVIDIA's CUDA libraries load most kernels through their own loaders, outside .nv_fatbin (cuFFT 11
    # carries a lone sm_52 cubin there and runs on sm_90): their .nv_fatbin does not tell their coverage.
    vendor = rel.startswith("nvidia/")
    for target_name, archs, not_needed in targets:
        skip = any(fnmatch.fnmatchcase(rel, g) for g in not_needed)
        for arch in archs:
            cov = coverage(info.fatbins, parse_arch(arch))
            details = {
                "target": target_name,
                "arch": arch,
                "cubins": list(cov.cubins),
                "ptx": list(cov.ptx),
                "containers": cov.containers,
                "uncovered": cov.uncovered,
            }
            if not cov.covered:
                where = (
                    f" (not needed on target {target_name})"
                    if skip and target_name
                    else (" (not needed here)" if skip else "")
                )
                if vendor and not skip:
                    where = " in .nv_fatbin (NVIDIA's libraries load most kernels their own way)"
                out.append(
                    Finding(
                        severity=Severity.NOTE if skip or vendor else Severity.FAIL,
                        module=rel,
                        kind=Kind.ARCH,
                        message=f"{rel}: {cov.describe()}{where}",
                        details=details,
                    )
                )
            elif cov.uncovered:
                out.append(
                    Finding(
                        severity=Severity.NOTE,
                        module=rel,
                        kind=Kind.ARCH,
                        details=details,
                        message=(
                            f"{rel}: {cov.uncovered} of {cov.containers} fatbins have no code for sm_{cov.device}"
                        ),
                    )
                )
    return out


@functools.cache
def _driver_api() -> dict[str, dict[str, Any]]:
    """data/driver_api.json (scripts/gen_driver_api.py): entry point -> the CUDA version and driver floor."""
    text = importlib.resources.files("compatlab").joinpath("data", "driver_api.json").read_text(encoding="utf-8")
    table: dict[str, dict[str, Any]] = json.loads(text)["entry_points"]
    return table


def _driver_covers(min_driver: str, needed: str) -> bool:
    """At the precision the target gives: min-driver '570.26' covers 570.26.01."""
    have = tuple(int(p) for p in min_driver.split(".") if p.isdigit())
    need = tuple(int(p) for p in needed.split(".") if p.isdigit())
    return have >= need[: len(have)]


def _driver_floor_findings(ck: _Checker, path: Path, min_drivers: Sequence[tuple[str, str]]) -> list[Finding]:
    """Entry points a module imports from libcuda that a target's min-driver does not export yet.

    A module linked against libcuda.so.1 is loaded with RTLD_NOW by Python: an entry point the driver lacks
    is an undefined symbol at import, on that driver.
    """
    info = ck.info(os.path.normpath(path))
    if not min_drivers or info is None or not {"libcuda.so.1", "libcuda.so"} & set(info.needed):
        return []
    table = _driver_api()
    rel = ck.rel(os.path.normpath(path))
    out: list[Finding] = []
    for target, min_driver in min_drivers:
        newer = sorted(
            (
                (table[u.name]["driver"], u.name, table[u.name]["cuda"])
                for u in info.undefined
                if not u.weak
                and table.get(u.name, {}).get("driver")
                and not _driver_covers(min_driver, table[u.name]["driver"])
            ),
            key=lambda t: (tuple(int(p) for p in t[0].split(".")), t[1]),
            reverse=True,
        )
        if not newer:
            continue
        driver, name, cuda = newer[0]
        more = f" (and {len(newer) - 1} more)" if len(newer) > 1 else ""
        who = f"target {target}'s" if target else "the"
        out.append(
            Finding(
                severity=Severity.FAIL,
                module=rel,
                kind=Kind.DRIVER_API,
                message=(
                    f"{rel} imports {name} from libcuda, an entry point of CUDA {cuda} (driver {driver} or "
                    f"newer){more}: {who} min-driver {min_driver} is older"
                ),
                details={
                    "target": target,
                    "min_driver": min_driver,
                    "entry_points": [{"symbol": n, "cuda": c, "driver": d} for d, n, c in newer],
                },
            )
        )
    return out


def _metadata_findings(ck: _Checker, modules: Sequence[Path], py: tuple[int, int] | None) -> list[Finding]:
    out: list[Finding] = []
    by_dist: dict[str, list[Path]] = {}
    for m in modules:
        dist = ck.dist_of(os.path.normpath(m))
        if dist is not None:
            by_dist.setdefault(dist.name, []).append(m)
    torch_names = {os.path.basename(p) for p in ck.torch_files}
    for dist in ck.dists:
        mods = by_dist.get(dist.name, [])
        if not mods or dist.name.lower() == "torch":
            continue
        who = f"{dist.name} {dist.version}"
        requires_torch = any(re.match(r"^torch\b(?![-_.\w])", r.strip(), re.I) for r in dist.requires)
        if not requires_torch:
            for m in mods:
                info = ck.info(os.path.normpath(m))
                links = sorted(set(info.needed) & torch_names) if info else []
                if links:
                    out.append(
                        Finding(
                            severity=Severity.WARN,
                            module=dist.name,
                            kind=Kind.METADATA,
                            message=(
                                f"{who}: {ck.rel(os.path.normpath(m))} links {links[0]} but METADATA has no "
                                "Requires-Dist on torch: a resolver may pair it with any torch"
                            ),
                            details={"dist": dist.name, "version": dist.version, "links": links},
                        )
                    )
                    break
        for tag in dist.tags:
            interp, abi, plat = [*tag.split("-"), "", "", ""][:3]
            if plat.startswith("linux_"):
                out.append(
                    Finding(
                        severity=Severity.WARN,
                        module=dist.name,
                        kind=Kind.METADATA,
                        message=(
                            f"{who}: WHEEL says Tag: {tag}; an index only takes manylinux/musllinux "
                            "wheels, so the file name and WHEEL disagree (renamed without rewriting WHEEL?)"
                        ),
                        details={"dist": dist.name, "tag": tag},
                    )
                )
            m2 = re.fullmatch(r"cp(\d)(\d+)", interp)
            if m2 and py is not None:
                built = (int(m2.group(1)), int(m2.group(2)))
                if (abi == "abi3" and built > py) or (abi not in {"abi3", "none"} and built != py):
                    out.append(
                        Finding(
                            severity=Severity.WARN,
                            module=dist.name,
                            kind=Kind.METADATA,
                            message=f"{who}: WHEEL says Tag: {tag}, which Python {py[0]}.{py[1]} cannot use",
                            details={"dist": dist.name, "tag": tag},
                        )
                    )
    if py is not None:
        for m in modules:
            built_for = re.search(r"\.cpython-(\d)(\d+)-", m.name)
            if built_for and (int(built_for.group(1)), int(built_for.group(2))) != py:
                rel = ck.rel(os.path.normpath(m))
                out.append(
                    Finding(
                        severity=Severity.NOTE,
                        module=rel,
                        kind=Kind.METADATA,
                        message=(
                            f"{rel}: built for CPython {built_for.group(1)}.{built_for.group(2)}; this environment's "
                            f"Python is {py[0]}.{py[1]}, so `import` never loads it"
                        ),
                    )
                )
    return out


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class _Verdict:
    needed: str  # yes | no | unknown
    why: str
    package: str
    feature: str = ""
    confirmable: bool = False  # the import stage may find it not needed (reach.Need.confirmable)

    @property
    def optional(self) -> bool:
        """A warning here, and listed for the import stage to confirm."""
        return self.needed == "no" or self.confirmable

    @property
    def words(self) -> str:
        if self.needed == "no":
            text = f"`import {self.package}` does not need it ({self.why})"
        else:
            text = f"`import {self.package}` may not need it ({self.why}): the import stage decides"
        return text + (f"; {self.package} says it is for: {self.feature}" if self.feature else "")


class _Needs:
    """Reachability of each failing module from `import <its package>` (see reach.py)."""

    def __init__(self, sp: Path, py: tuple[int, int] | None) -> None:
        self.sp = sp
        self.py = py
        self.graphs: dict[str, ImportGraph] = {}

    def graph(self, top: str) -> ImportGraph:
        if top not in self.graphs:
            self.graphs[top] = ImportGraph(self.sp, top)
        return self.graphs[top]

    def of(self, rel: str, loaded_by: Sequence[str]) -> _Verdict:
        """An extension module is judged by the import graph of its package; a library by those of the
        extension modules that load it (needed if any of them is)."""
        top = package_of(self.sp, rel)
        if _importable(self.sp / rel, self.py) and not rel.split("/", 1)[0].endswith(".libs"):
            need = self.graph(top).need(dotted_name(rel))
            symbols = dynamic_symbols(self.sp / rel)  # one rule with the import stage's: a fat binary section
            device_code = symbols is None or symbols.device_code
            confirmable = need.confirmable(rel, device_code=device_code)
            if need.optional and not confirmable:  # no code names it, but a loader may pick it by GPU
                return _Verdict(
                    needed="unknown",
                    why=f"{need.why}, but a loader may pick this build by the GPU it finds",
                    package=top,
                    feature=need.feature,
                )
            return _Verdict(
                needed=need.needed,
                why=need.why,
                package=top,
                feature=need.feature,
                confirmable=need.needed == "unknown" and confirmable,
            )
        verdicts = [self.of(e, ()) for e in loaded_by if e != rel]
        if not verdicts:
            return _Verdict(needed="unknown", why="no extension module is known to load it", package=top)
        # A library: only "no" carries over; an unknown loader keeps it red (the import stage loads
        # extension modules, not libraries, so nothing would confirm it).
        for word in ("yes", "unknown"):
            hit = next((v for v in verdicts if v.needed == word), None)
            if hit is not None:
                return dataclasses.replace(hit, confirmable=False)
        first = verdicts[0]
        users = ", ".join(sorted({e for e in loaded_by if e != rel}))
        return _Verdict(
            needed="no", package=first.package, feature=first.feature, why=f"only {users} load it, and {first.why}"
        )


_PY_LIBRARY_NAME = re.compile(r"""["']((?:[^"'\s]*/)?(lib[A-Za-z0-9_+-]+\.so\.[0-9]+))["']""")


def _python_names(sp: Path, tops: Sequence[str]) -> dict[str, list[str]]:
    """Library names in string literals of the packages' Python code: name -> ["file:line", ...]."""
    out: dict[str, list[str]] = {}
    for top in tops:
        root = sp / top
        files = sorted(root.rglob("*.py")) if root.is_dir() else [sp / f"{top}.py"]
        for file in files:
            try:
                data = read_regular(file)
            except OSError:
                continue
            if b".so." not in data:
                continue
            text = data.decode("utf-8", "replace")
            rel = file.relative_to(sp).as_posix()
            for m in _PY_LIBRARY_NAME.finditer(text):
                out.setdefault(m.group(2), []).append(f"{rel}:{text.count(chr(10), 0, m.start()) + 1}")
    return out


def _by_name_findings(ck: _Checker, modules: Sequence[Path], packages: Sequence[str] | None) -> list[Finding]:
    """Libraries a package names to load at run time (ctypes in its Python code, dlopen in its .rodata)
    that ld.so would not find here, or that are of another CUDA major than the environment's torch."""
    where: dict[str, list[tuple[str, Library | None]]] = {}
    for path in modules:
        lib = ck._lib(str(path))
        if lib is None:
            continue
        for name in lib.info.by_name:
            where.setdefault(name, []).append((ck.rel(lib.path), lib))
    tops = packages if packages is not None else sorted({ck.rel(os.path.normpath(m)).split("/")[0] for m in modules})
    for name, lines in _python_names(ck.sp, [t for t in tops if (ck.sp / t).is_dir()]).items():
        where.setdefault(name, []).extend((line, None) for line in lines)
    cuda = ck.torch_cuda()
    out: list[Finding] = []
    for name, places in sorted(where.items()):
        shown = ", ".join(p for p, _ in places[:3]) + (f" and {len(places) - 3} more" if len(places) > 3 else "")
        first, requester = places[0]
        found = next((hit for _p, req in places if (hit := ck.find_by_name(name, req))), None)
        shipped = ck.files_by_name().get(name, [])
        owner = (
            ck.dist_of(os.path.join(ck.sp, first))
            if requester is not None
            else ck.dist_of(os.path.join(ck.sp, first.rsplit(":", 1)[0]))
        )
        details: dict[str, Any] = {
            "library": name,
            "named_in": [p for p, _ in places],
            "found": found,
            "dist": owner.name if owner else None,
        }
        m = _CUDA_MAJOR_LIB.match(name)
        # A literal in Python code is a load the package means to do (a ctypes preload); a name in a
        # library's .rodata may be one of many candidates it tries (MKL's dispatch, an optional transport).
        in_python = any(req is None for _p, req in places)
        verb = "loads" if in_python else "names"
        what = "by name at run time" if in_python else "(a library it may dlopen at run time)"
        if name in DRIVER_LIBS:  # the driver's: absent on a machine without a GPU, as expected
            continue
        if m and cuda and cuda.split(".")[0] != m.group(2):
            out.append(
                Finding(
                    severity=Severity.WARN,
                    module=first,
                    kind=Kind.BY_NAME,
                    details=details,
                    message=(
                        f"{shown} {verb} {name} {what}: CUDA {m.group(2)}, but this environment's torch is "
                        f"CUDA {cuda}" + ("" if found or shipped else ", and nothing here provides it")
                    ),
                )
            )
            continue
        if found is None and not shipped:
            hint, more = ck.library_hint(
                name, os.path.join(ck.sp, first.rsplit(":", 1)[0]), os.path.join(ck.sp, first.rsplit(":", 1)[0])
            )
            details.update(more)
            out.append(
                Finding(
                    severity=Severity.WARN if in_python else Severity.NOTE,
                    module=first,
                    kind=Kind.BY_NAME,
                    details=details,
                    message=(f"{shown} {verb} {name} {what}, which ld.so would not find here: {hint}"),
                )
            )
    return _one_per_catalog(out)


def _as_needed(f: Finding, need: _Verdict) -> Finding:
    """A finding of a module that failed, told whether `import <package>` needs that module: an optional
    one's failure is a warning that says what it costs (the feature)."""
    details = {**f.details, "import_needs": need.needed, "import_needs_why": need.why}
    if f.severity != Severity.FAIL or not need.optional:
        return dataclasses.replace(f, details=details)
    if need.feature:
        details["feature"] = need.feature
    return dataclasses.replace(f, severity=Severity.WARN, message=f"{f.message}; {need.words}", details=details)


def _one_symbol_warning(found: list[Finding], rel: str, words: str) -> list[Finding]:
    """A module import does not need that lacks many symbols (cuda-core's cu12/_tensor_bridge, 25 of torch's
    aoti_* symbols): one warning naming them, not one each. Failures stay one a symbol."""
    missing = [f for f in found if f.kind == Kind.SYMBOL and f.severity == Severity.WARN]
    if len(missing) < 2:
        return found
    names = [str(f.details.get("demangled") or f.details["symbol"]) for f in missing]
    merged = Finding(
        severity=Severity.WARN,
        module=rel,
        kind=Kind.SYMBOL,
        details={**missing[0].details, "symbols": [f.details["symbol"] for f in missing]},
        message=(
            f"{rel} needs {len(names)} symbols that no library in its load set defines: {', '.join(names[:4])}"
            + (f" and {len(names) - 4} more" if len(names) > 4 else "")
            + f"; {words}"
        ),
    )
    merged_ids = {id(f) for f in missing}
    return [f for f in found if id(f) not in merged_ids] + [merged]


_CATALOG = 4  # a file naming this many absent libraries is a list of candidates: one finding for it


def _one_per_catalog(findings: list[Finding]) -> list[Finding]:
    """One finding for a file that names many absent libraries (cuda-pathfinder's descriptor_catalog.py
    names 92 across CUDA 12 and 13): a list of candidates the package looks for, each only when asked."""
    absent: dict[tuple[str, Severity], list[Finding]] = {}
    for f in findings:
        if f.details.get("found") is None and "which ld.so would not find here" in f.message:
            absent.setdefault((f.module.rsplit(":", 1)[0], f.severity), []).append(f)
    out: list[Finding] = []
    grouped: set[int] = set()
    for (file, severity), group in absent.items():
        if len(group) < _CATALOG:
            continue
        grouped |= {id(f) for f in group}
        names = [str(f.details["library"]) for f in group]
        out.append(
            Finding(
                severity=severity,
                module=group[0].module,
                kind=Kind.BY_NAME,
                details={
                    "libraries": names,
                    "named_in": sorted({p for f in group for p in f.details["named_in"]}),
                    "dist": group[0].details.get("dist"),
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


def _importable(path: Path, py: tuple[int, int] | None) -> bool:
    """Whether `import` can load *path* as a module: a file tagged for this CPython (or abi3), or a bare
    ``name.so`` that exports ``PyInit_name`` (triton's ``libtriton.so``). A bare ``.so`` that does not is a
    library, which its package may load by path (bitsandbytes' ``libbitsandbytes_cuda130.so``): the import
    stage sees whether `import` maps it."""
    if not is_extension(path, py):
        return False
    if re.search(r"\.(?:cpython-[^.]+|abi3)\.so$", path.name):
        return True
    symbols = dynamic_symbols(path)
    return symbols is not None and f"PyInit_{path.name.split('.', 1)[0]}" in symbols.defined


def _check(
    site_packages: Path,
    *,
    targets: Sequence[tuple[str, Sequence[str], Sequence[str]]],
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
    ck = _Checker(sp, cache)
    modules = walk_modules(sp, packages)
    py = python_version_of(sp)
    per_module: list[tuple[str, list[Finding]]] = []
    loaded_by_import: set[str] = set()
    loaders: dict[str, list[str]] = {}  # library -> the extension modules whose loading loads it
    not_needed: dict[str, dict[str, str]] = {}
    for path in modules:
        found, closure = _check_module(ck, path)
        found.extend(_arch_findings(ck, path, targets))
        found.extend(_driver_floor_findings(ck, path, min_drivers))
        per_module.append((os.path.normpath(path), found))
        if _importable(path, py):
            loaded_by_import |= closure
            for lib in closure:
                loaders.setdefault(lib, []).append(os.path.normpath(path))
    findings: list[Finding] = []
    needs = _Needs(sp, py)
    for mpath, raw in per_module:
        dist = ck.dist_of(mpath)
        found = (
            raw
            if dist is None
            else [dataclasses.replace(f, details={**f.details, "dist": f.details.get("dist", dist.name)}) for f in raw]
        )
        if mpath not in loaded_by_import:
            # A plugin or a library only dlopen()ed on demand (nvshmem's MPI bootstrap, libcufile_rdma,
            # a module for another Python): worth knowing, but no import of this environment fails on it.
            found = [
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
        elif any(f.severity == Severity.FAIL for f in found):
            need = needs.of(ck.rel(mpath), [ck.rel(e) for e in loaders.get(mpath, ())])
            found = [_as_needed(f, need) for f in found]
            if need.optional:
                not_needed[ck.rel(mpath)] = {
                    "package": need.package,
                    "why": need.why,
                    "feature": need.feature,
                    "needed": need.needed,
                }
                findings.extend(_one_symbol_warning(found, ck.rel(mpath), need.words))
                continue
        findings.extend(found)
    findings.extend(_metadata_findings(ck, modules, py))
    findings.extend(_by_name_findings(ck, modules, packages))
    for mix in family_mixes({d.name: d.version for d in ck.dists}):
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
            torch_cuda=ck.torch_cuda(),
            dists=[d.canonical for d in ck.dists],
            owner=lambda path: d.canonical if (d := ck.dist_of(str(path))) else None,
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
    findings.sort(
        key=lambda f: (
            list(Severity).index(f.severity),
            _KIND_ORDER.get(f.kind, 9),
            "shipped_at" not in f.details and "torch_cuda" not in f.details,
            "near_misses" not in f.details,
            _package_rank(f.module),
            f.module,
        )
    )
    return StaticReport(
        site_packages=str(sp),
        archs=archs_all,
        findings=findings,
        modules=len(modules),
        seconds=time.monotonic() - start,
        cache_hits=cache.hits - hits0,
        cache_misses=cache.misses - misses0,
        not_needed=not_needed,
    )


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
    targets: Sequence[tuple[str, Sequence[str], Sequence[str]]],
    min_drivers: Sequence[tuple[str, str]] = (),
) -> list[Finding]:
    """Libraries a package's `import` loads by path (ctypes over a computed name, ``torch.ops.load_library``
    over a glob), judged as extension modules are: this stage sees no extension module load them (their
    findings are notes), but the import stage saw the import map them. Their closure is resolved with what
    `import torch` loaded before them, and their findings keep their severity."""
    ck = _Checker(Path(site_packages), ElfCache())
    out: list[Finding] = []
    for rel in rels:
        path = Path(site_packages) / rel
        found, _closure = _check_module(ck, path, after_torch=ck.torch_dist is not None)
        found.extend(_arch_findings(ck, path, targets))
        found.extend(_driver_floor_findings(ck, path, min_drivers))
        for f in found:
            f.details["loaded_by_path"] = True
        out.extend(found)
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
    details = report.to_json()
    details["modules_by_dist"] = _modules_by_dist(ctx.site, declared)
    # The import stage confirms these with what each package import actually mapped (NOT_NEEDED_FILE).
    out = ctx.work_dir / "static"
    out.mkdir(parents=True, exist_ok=True)
    (out / NOT_NEEDED_FILE).write_text(json.dumps(report.not_needed, indent=2) + "\n", encoding="utf-8")
    return StageResult(name="static", state=report.state, reason=report.reason, details=details, seconds=report.seconds)


def _modules_by_dist(sp: Path, dists: Sequence[str]) -> dict[str, list[str]]:
    """Each declared distribution's extension modules (RECORD paths), for the per-package table."""
    wanted = {re.sub(r"[-_.]+", "-", d).lower() for d in dists}
    py = python_version_of(sp)
    out: dict[str, list[str]] = {}
    for dist in read_site_dists(sp)[0]:
        if re.sub(r"[-_.]+", "-", dist.name).lower() in wanted:
            out[dist.name] = sorted(
                f for f in dist.files if f.endswith(".so") and not f.startswith("..") and is_extension(Path(f), py)
            )
    return out


def format_report(report: StaticReport, verbose: bool) -> Iterator[str]:
    """The report as lines for a terminal: a summary, then findings (notes with *verbose*)."""
    counts = report.counts()
    yield (
        f"static: {report.site_packages}: {report.state} ({counts['fail']} failures, "
        f"{counts['warn']} warnings, {counts['note']} notes; {report.modules} modules in "
        f"{report.seconds:.1f} s, "
        f"cache {report.cache_hits} hits/{report.cache_misses} misses)"
    )
    shown: dict[tuple[str, str, str], int] = {}
    for f in report.findings:
        if f.severity == Severity.NOTE and not verbose:
            continue
        key = (f.severity, f.module, f.kind)
        shown[key] = shown.get(key, 0) + 1
        if shown[key] <= 10 or verbose:
            yield f"{f.severity}: {f.message}"
        elif shown[key] == 11:
            more = sum(1 for g in report.findings if (g.severity, g.module, g.kind) == key) - 10
            yield f"{f.severity}: … and {more} more {f.kind} findings for {f.module} (--json or -v lists all)"
