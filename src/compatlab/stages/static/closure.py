"""The library closure of one module and what ld.so would refuse in it, in the order ld.so refuses it:

1. a DT_NEEDED library not found (one of the driver's is a note: it comes with the NVIDIA driver);
2. a symbol version (``.gnu.version_r``) its provider does not define: ld.so refuses the whole module;
3. an undefined symbol no library of the load set defines, with the near miss that explains a C++ one (same
   qualified name, another signature: built against another build of the provider).

A symbol from a missing library or version is reported with it, not again; Python's API is assumed present
without an interpreter, and the driver's API without the driver.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from compatlab.runs.records.static import Finding, Kind, Severity
from compatlab.stages.static.elf import UndefinedSymbol, demangle
from compatlab.stages.static.ldso import LoadSet, provided_symbols
from compatlab.stages.static.resolve import DRIVER_LIBS, SiteResolver
from compatlab.stages.static.symbols import symbol_offers

__all__ = ["module_findings"]


def module_findings(
    site: SiteResolver, path: Path | str, *, after_torch: bool = False
) -> tuple[list[Finding], set[str]]:
    """Findings about one module, and the paths of the libraries its loading loads."""
    findings: list[Finding] = []
    mpath = os.path.normpath(path)
    rel = site.rel(mpath)
    module = site.library(mpath)
    if module is None:
        # Never a silent pass: the static stage says it could not judge this file (the import stage will).
        why = site.unreadable.get(mpath, f"{mpath}: not a readable ELF file").replace(mpath, rel)
        return [
            Finding(
                severity=Severity.WARN,
                module=rel,
                kind=Kind.UNREADABLE,
                details={"why": why},
                message=f"{why}; the static stage cannot check it",
            )
        ], {mpath}
    ls = site.load_set(module, after_torch=after_torch)
    missing_names = set()
    for name, needer in ls.missing:
        missing_names.add(name)
        via = "" if needer == mpath else f" (needed by {site.rel(needer)})"
        unreadable = next((p for p in site.unreadable if os.path.basename(p) == name), None)
        if unreadable is not None:
            why = site.unreadable[unreadable].replace(unreadable, site.rel(unreadable))
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
                    details={"library": name, "needed_by": site.rel(needer)},
                )
            )
            continue
        hint, details = site.library_hint(name, needer, mpath)
        findings.append(
            Finding(
                severity=Severity.FAIL,
                module=rel,
                kind=Kind.LIBRARY,
                message=f"{rel}: {name} not found{via}: {hint}",
                details={"library": name, "needed_by": site.rel(needer), **details},
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
                        message=f"{rel} needs {v} from {file}; {site.rel(lib.path)} {offers}",
                        details={
                            "library": file,
                            "version": v,
                            "provider": site.rel(lib.path),
                            "symbols": [demangle(s) for s in users],
                        },
                    )
                )

    driver_missing = bool(missing_names & DRIVER_LIBS)
    mod_dist = site.dist_of(mpath)
    mod_name = mod_dist.name if mod_dist else rel.split("/")[0]
    for sym in module.info.undefined:
        if sym.weak or provided_symbols(sym, ls.libs):
            continue
        if sym.library and (sym.library in missing_names or (sym.library, sym.version) in explained):
            continue  # reported with the library or version it comes from
        if site.python is None and sym.name.startswith(("Py", "_Py")):
            continue
        if driver_missing and re.match(r"^(cu|nvml)[A-Z]", sym.name):
            continue  # the driver's API, from a library this machine does not have
        findings.append(_symbol_finding(site, rel, mod_name, sym, ls))
    return findings, {lib.path for lib in ls.libs}


def _symbol_finding(site: SiteResolver, rel: str, mod_name: str, sym: UndefinedSymbol, ls: LoadSet) -> Finding:
    pretty = demangle(sym.name)
    details: dict[str, Any] = {"symbol": sym.name, "demangled": pretty, "version": sym.version, "library": sym.library}
    near = site.near_miss(sym.name, ls.libs) if sym.name.startswith("_Z") else []
    if near:
        other, lib = near[0]
        dist = site.dist_of(lib.path)
        who = f"{dist.name} {dist.version}" if dist else site.rel(lib.path)
        because = (
            f"{mod_name} was built against another {dist.name}"
            if dist and dist.name != mod_name
            else "the files do not come from one build"
        )
        details.update(near_misses=[{"demangled": p, "provider": site.rel(x.path)} for p, x in near])
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
        details.update(maybe_from_missing=missing)
        return Finding(
            severity=Severity.NOTE,
            module=rel,
            kind=Kind.SYMBOL,
            details=details,
            message=f"{text} (it may come from the missing {', '.join(missing)})",
        )
    return Finding(severity=Severity.FAIL, module=rel, kind=Kind.SYMBOL, message=text, details=details)
