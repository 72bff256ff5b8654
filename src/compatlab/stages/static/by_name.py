"""Libraries loaded by name, not by a DT_NEEDED entry: what a package names to load at run time.

Two sources: ``lib*.so.N`` string literals in the packages' Python code (a ctypes preload: a load the package
means to do, a warning when ld.so would not find it) and library names in an ELF object's .rodata (one of many
candidates it may dlopen(): MKL's dispatch, an optional transport; a note). Either is also a warning when it is
of another CUDA major than the environment's torch; the driver's libraries are never reported.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from compatlab.incell.files import read_regular
from compatlab.incell.loading.cudamajor import CUDA_MAJOR_LIB
from compatlab.runs.records.static import Finding, Kind, Severity
from compatlab.stages.static.folds import one_per_catalog
from compatlab.stages.static.ldso import Library
from compatlab.stages.static.resolve import DRIVER_LIBS, SiteResolver

__all__ = ["by_name_findings"]

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


def by_name_findings(site: SiteResolver, modules: Sequence[Path], packages: Sequence[str] | None) -> list[Finding]:
    """Libraries a package names to load at run time (ctypes in its Python code, dlopen in its .rodata)
    that ld.so would not find here, or that are of another CUDA major than the environment's torch."""
    where: dict[str, list[tuple[str, Library | None]]] = {}
    for path in modules:
        lib = site.library(str(path))
        if lib is None:
            continue
        for name in lib.info.by_name:
            where.setdefault(name, []).append((site.rel(lib.path), lib))
    tops = packages if packages is not None else sorted({site.rel(os.path.normpath(m)).split("/")[0] for m in modules})
    for name, lines in _python_names(site.sp, [t for t in tops if (site.sp / t).is_dir()]).items():
        where.setdefault(name, []).extend((line, None) for line in lines)
    cuda = site.torch_cuda()
    out: list[Finding] = []
    for name, places in sorted(where.items()):
        shown = ", ".join(p for p, _ in places[:3]) + (f" and {len(places) - 3} more" if len(places) > 3 else "")
        first, requester = places[0]
        found = next((hit for _p, req in places if (hit := site.find_by_name(name, req))), None)
        shipped = site.files_by_name().get(name, [])
        owner = (
            site.dist_of(os.path.join(site.sp, first))
            if requester is not None
            else site.dist_of(os.path.join(site.sp, first.rsplit(":", 1)[0]))
        )
        details: dict[str, Any] = {
            "library": name,
            "named_in": [p for p, _ in places],
            "found": found,
            "dist": owner.name if owner else None,
        }
        m = CUDA_MAJOR_LIB.match(name)
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
            hint, more = site.library_hint(
                name, os.path.join(site.sp, first.rsplit(":", 1)[0]), os.path.join(site.sp, first.rsplit(":", 1)[0])
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
    return one_per_catalog(out)
