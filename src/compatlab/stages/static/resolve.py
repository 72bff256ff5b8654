"""The site resolver: ld.so's resolution (ldso.py) over one site-packages directory, with what the checks ask
of the site besides: which distribution owns a file, where a missing library is shipped, which CUDA torch is,
and the near miss of an undefined C++ symbol (same qualified name, another signature) in a load set.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from compatlab.incell.loading.cudamajor import CUDA_MAJOR_LIB  # the one table, shared with import
from compatlab.site import SiteDist, is_shared_object, read_site_dists
from compatlab.site import torch_cuda as site_torch_cuda
from compatlab.stages.static.elf import ElfCache, demangle
from compatlab.stages.static.ldso import Library, Resolver
from compatlab.stages.static.symbols import function_name, last_identifier

__all__ = ["DRIVER_LIBS", "SiteResolver"]

# Installed with the NVIDIA driver, never with a wheel: missing on a machine without a GPU is expected.
DRIVER_LIBS = frozenset({"libcuda.so.1", "libcuda.so", "libnvidia-ml.so.1", "libnvidia-ml.so"})


class SiteResolver(Resolver):
    """ld.so's resolution over *sp*, with the site's distributions (RECORD) and their files."""

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
        """Why library *name* (needed by *needer*, on behalf of *module*) is not found: where it is shipped,
        the CUDA major torch has instead, the other versions present; and those facts as details."""
        details: dict[str, Any] = {}
        elsewhere = self.files_by_name().get(name, [])
        if elsewhere:
            where = self.rel(elsewhere[0])
            dist = self.dist_of(elsewhere[0])
            details.update(shipped_at=where)
            who = f"{dist.name} {dist.version} ships it at {where}" if dist else f"{where} exists"
            return f"{who}, but nothing on {self.rel(needer)}'s search path points there", details
        m = CUDA_MAJOR_LIB.match(name)
        stem = name.split(".so", maxsplit=1)[0] + ".so."
        others = sorted(
            self.rel(p)
            for n, ps in self.files_by_name().items()
            if n.startswith(stem) and re.fullmatch(r"\d+", n[len(stem) :])
            for p in ps
        )
        details.update(other_versions=others)
        cuda = self.torch_cuda()
        mod_dist = self.dist_of(module)
        mod_name = mod_dist.name if mod_dist else self.rel(module).split("/")[0]
        if m and cuda and cuda.split(".")[0] != m.group(2):
            where = ""
            cudart = self.torch_loaded.get(f"libcudart.so.{cuda.split('.')[0]}")
            if cudart is not None:
                parent = Path(self.rel(cudart.path)).parent
                where = f" ({(parent.parent if parent.name == 'lib' else parent).as_posix()})"
            details.update(torch_cuda=cuda)
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
