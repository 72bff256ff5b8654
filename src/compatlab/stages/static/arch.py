"""GPU arch coverage: for each target and each of its archs, whether a module's fatbinaries (``.nv_fatbin``,
read by fatbin.py) hold code that runs on it, judged over the parsed containers alone.

A module matching one of the target's not-needed globs gets a note instead of a failure; so does one of
NVIDIA's CUDA libraries (``nvidia/``), which load most kernels through their own loaders, outside
``.nv_fatbin`` (cuFFT 11 carries a lone sm_52 cubin there and runs on sm_90). A module some of whose
fatbinaries lack code for the device, while others have it, is a note too.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence

from compatlab.runs.records.static import Finding, Kind, Severity
from compatlab.stages.static.elf import ElfInfo
from compatlab.stages.static.fatbin import coverage, parse_arch

__all__ = ["Targets", "arch_findings"]

# Each target: its name ("" outside a matrix), its device archs (sm_90 ...), its not-needed module globs.
Targets = Sequence[tuple[str, Sequence[str], Sequence[str]]]


def arch_findings(rel: str, info: ElfInfo | None, targets: Targets) -> list[Finding]:
    """The arch findings of the module at *rel* (relative to site-packages), read as *info*."""
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
