"""The import-need model: whether `import <package>` needs a module that cannot load (see incell/reach.py).

An extension module is judged by the import graph of its package: needed (``yes``), not (``no``: no code
of the package imports it), or ``unknown``. A loader may pick a build by the GPU it finds (sgl_kernel's
sm90/sm100 directories): what no code names but such a loader may choose stays ``unknown``, and the import
stage decides (``confirmable``) where the module carries device code. A library is judged by the extension
modules that load it: needed if any of them is; only ``no`` carries over (the import stage loads extension
modules, not libraries, so nothing would confirm an unknown one).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from pathlib import Path

from compatlab.incell.loading.elf import dynamic_symbols
from compatlab.incell.reach import ImportGraph, dotted_name, package_of
from compatlab.site import is_extension

__all__ = ["ImportNeed", "ImportNeeds", "importable"]


def importable(path: Path, py: tuple[int, int] | None) -> bool:
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


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class ImportNeed:
    """Whether `import <package>` needs a module: *needed* is yes, no or unknown; *why* says how it was told."""

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


class ImportNeeds:
    """Reachability of each failing module from `import <its package>`, one import graph per package."""

    def __init__(self, sp: Path, py: tuple[int, int] | None) -> None:
        self.sp = sp
        self.py = py
        self.graphs: dict[str, ImportGraph] = {}

    def graph(self, top: str) -> ImportGraph:
        if top not in self.graphs:
            self.graphs[top] = ImportGraph(self.sp, top)
        return self.graphs[top]

    def of(self, rel: str, loaded_by: Sequence[str]) -> ImportNeed:
        """An extension module is judged by the import graph of its package; a library by those of the
        extension modules that load it (needed if any of them is)."""
        top = package_of(self.sp, rel)
        if importable(self.sp / rel, self.py) and not rel.split("/", 1)[0].endswith(".libs"):
            need = self.graph(top).need(dotted_name(rel))
            symbols = dynamic_symbols(self.sp / rel)  # one rule with the import stage's: a fat binary section
            device_code = symbols is None or symbols.device_code
            confirmable = need.confirmable(rel, device_code=device_code)
            if need.optional and not confirmable:  # no code names it, but a loader may pick it by GPU
                return ImportNeed(
                    needed="unknown",
                    why=f"{need.why}, but a loader may pick this build by the GPU it finds",
                    package=top,
                    feature=need.feature,
                )
            return ImportNeed(
                needed=need.needed,
                why=need.why,
                package=top,
                feature=need.feature,
                confirmable=need.needed == "unknown" and confirmable,
            )
        verdicts = [self.of(e, ()) for e in loaded_by if e != rel]
        if not verdicts:
            return ImportNeed(needed="unknown", why="no extension module is known to load it", package=top)
        # A library: only "no" carries over; an unknown loader keeps it red (the import stage loads
        # extension modules, not libraries, so nothing would confirm it).
        for word in ("yes", "unknown"):
            hit = next((v for v in verdicts if v.needed == word), None)
            if hit is not None:
                return dataclasses.replace(hit, confirmable=False)
        first = verdicts[0]
        users = ", ".join(sorted({e for e in loaded_by if e != rel}))
        return ImportNeed(
            needed="no", package=first.package, feature=first.feature, why=f"only {users} load it, and {first.why}"
        )
