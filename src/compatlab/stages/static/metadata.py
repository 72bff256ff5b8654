"""Wheel metadata lints (warnings and notes, never failures): what a distribution's METADATA and WHEEL say
against what its files are.

- a distribution whose modules link torch's libraries but whose METADATA has no Requires-Dist on torch (a
  resolver may pair it with any torch);
- a WHEEL ``Tag`` an index would refuse (``linux_*``: renamed without rewriting WHEEL?) or this Python
  cannot use;
- a module built for another CPython than the environment's, which `import` never loads.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path

from compatlab.runs.records.static import Finding, Kind, Severity
from compatlab.stages.static.resolve import SiteResolver

__all__ = ["metadata_findings"]


def metadata_findings(site: SiteResolver, modules: Sequence[Path], py: tuple[int, int] | None) -> list[Finding]:
    """The lints of the distributions owning *modules*, for an environment of Python *py* (None: unknown)."""
    out: list[Finding] = []
    by_dist: dict[str, list[Path]] = {}
    for m in modules:
        dist = site.dist_of(os.path.normpath(m))
        if dist is not None:
            by_dist.setdefault(dist.name, []).append(m)
    torch_names = {os.path.basename(p) for p in site.torch_files}
    for dist in site.dists:
        mods = by_dist.get(dist.name, [])
        if not mods or dist.name.lower() == "torch":
            continue
        who = f"{dist.name} {dist.version}"
        requires_torch = any(re.match(r"^torch\b(?![-_.\w])", r.strip(), re.I) for r in dist.requires)
        if not requires_torch:
            for m in mods:
                info = site.info(os.path.normpath(m))
                links = sorted(set(info.needed) & torch_names) if info else []
                if links:
                    out.append(
                        Finding(
                            severity=Severity.WARN,
                            module=dist.name,
                            kind=Kind.METADATA,
                            message=(
                                f"{who}: {site.rel(os.path.normpath(m))} links {links[0]} but METADATA has no "
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
                rel = site.rel(os.path.normpath(m))
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
