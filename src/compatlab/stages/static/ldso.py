"""ld.so, emulated: which libraries a module's loading loads, found the way the dynamic loader finds them.

Search order as ld.so has it, with LD_LIBRARY_PATH unset: DT_RPATH of the requester and of the objects
that loaded it (unless the requester has DT_RUNPATH), DT_RUNPATH, the ld.so cache, the default
directories. The interpreter's own closure is loaded first, and an extension of torch also finds what
``import torch`` preloaded.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
from collections.abc import Iterable, Sequence
from functools import cache
from pathlib import Path

from compatlab.stages.static.elf import ElfCache, ElfInfo, NotElf, UndefinedSymbol, is_elf

# The name these records always had, before the resolution moved out of compatlab.stages.static.stage.
log = logging.getLogger("compatlab.stages.static.stage")

# What `import torch` has loaded before an extension of torch is loaded: these libraries' closures.
# libcaffe2_nvrtc.so stands for torch's explicit preload of nvrtc (torch/__init__.py, _load_global_deps).
TORCH_PRELOAD_GLOBS = ("libtorch*.so", "libc10*.so", "libcaffe2_nvrtc.so")
_DEFAULT_DIRS = (
    "/lib64",
    "/usr/lib64",
    "/lib/x86_64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu",
    "/lib/aarch64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/lib",
    "/usr/lib",
)


@cache
def ld_cache() -> dict[str, tuple[str, ...]]:
    """The system's ld.so cache (``ldconfig -p``): library name -> paths, in the cache's order."""
    from compatlab.proc import run

    out: dict[str, list[str]] = {}
    for prog in ("/sbin/ldconfig", "/usr/sbin/ldconfig", "ldconfig"):
        if os.sep in prog and not os.path.exists(prog):
            continue
        try:
            done = run([prog, "-p"], timeout=30)
        except OSError:
            continue
        if done.ok:
            for line in done.stdout.splitlines():
                m = re.match(r"^\s+(\S+) \(([^)]*)\) => (\S+)$", line)
                if m:
                    out.setdefault(m.group(1), []).append(m.group(3))
            break
    else:
        log.info("no ldconfig; falling back to the standard library directories")
    return {k: tuple(v) for k, v in out.items()}


@cache
def _elf_ident(path: str) -> tuple[int, int] | None:
    """(ELF class byte, e_machine) of a file, to skip libraries of another architecture as ld.so does."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(20)
    except OSError:
        return None
    if len(head) < 20 or head[:4] != b"\x7fELF":
        return None
    return head[4], int.from_bytes(head[18:20], "little" if head[5] == 1 else "big")


@dataclasses.dataclass(slots=True)
class Library:
    path: str  # as ld.so would name it (not symlink-resolved), normalised
    info: ElfInfo


@dataclasses.dataclass(kw_only=True, slots=True)
class LoadSet:
    libs: list[Library]  # the module's closure, module first
    missing: list[tuple[str, str]]  # (library name, path of the object that needs it)
    by_soname: dict[str, Library]
    uses_torch: bool


class Resolver:
    """One environment as ld.so sees it: the interpreter's closure, torch's preload set, each module's."""

    def __init__(self, sp: Path, cache: ElfCache, hashes: dict[str, tuple[str, int]]) -> None:
        self.sp = sp
        self.cache = cache
        self.hashes = hashes  # RECORD (hex sha256, size) by normalised path (the cache never trusts them)
        self.unreadable: dict[str, str] = {}  # path -> why it cannot be read (NotElf's message)
        self.python = self._interpreter()
        self.base = self._closure_of([self.python] if self.python else [], {}) if self.python else []
        self.base_loaded = self._loaded_map(self.base)
        torch_roots: list[str] = []
        torch_lib = sp / "torch" / "lib"
        if torch_lib.is_dir():
            for pattern in TORCH_PRELOAD_GLOBS:
                torch_roots.extend(os.path.normpath(p) for p in sorted(torch_lib.glob(pattern)) if is_elf(p))
        self.torch_files = set(torch_roots)
        self.torch_set = (
            [lib for lib in self._closure_of(torch_roots, self.base_loaded) if lib not in self.base]
            if torch_roots
            else []
        )
        self.torch_loaded = {**self.base_loaded, **self._loaded_map(self.torch_set)}

    # Reading ---------------------------------------------------------------------------------------

    def info(self, path: str) -> ElfInfo | None:
        """The file's ElfInfo, read by its own content (never by what RECORD claims); None if unreadable,
        with the reason in ``self.unreadable``."""
        try:
            return self.cache.load(Path(path))
        except (NotElf, OSError) as exc:
            log.info("cannot read %s: %s", path, exc)
            self.unreadable[path] = str(exc)
            return None

    def _interpreter(self) -> Library | None:
        # <venv>/lib/pythonX.Y/site-packages -> <venv>/bin/python; ld.so takes the executable's $ORIGIN
        # from its real path, so the symlink of a venv is resolved.
        for name in ("python3", "python"):
            exe = self.sp.parent.parent.parent / "bin" / name
            if exe.exists():
                real = os.path.realpath(exe)
                info = self.info(real)
                if info is not None:
                    return Library(real, info)
        log.info("no interpreter found for %s; Python API symbols are assumed present", self.sp)
        return None

    # Resolution ------------------------------------------------------------------------------------

    @staticmethod
    def _loaded_map(libs: Iterable[Library]) -> dict[str, Library]:
        out: dict[str, Library] = {}
        for lib in libs:
            out.setdefault(os.path.basename(lib.path), lib)
            if lib.info.soname:
                out.setdefault(lib.info.soname, lib)
        return out

    def _expand(self, entry: str, origin: str) -> str | None:
        text = entry.replace("${ORIGIN}", origin).replace("$ORIGIN", origin)
        text = text.replace("${PLATFORM}", "x86_64").replace("$PLATFORM", "x86_64")
        text = text.replace("${LIB}", "lib64").replace("$LIB", "lib64")
        if "$" in text:
            return None
        return os.path.normpath(text)

    def _search(self, name: str, chain: Sequence[Library], ident: tuple[int, int] | None) -> str | None:
        requester = chain[-1]
        dirs: list[str] = []
        # DT_RPATH of the requester and of the objects that loaded it, unless the requester has RUNPATH.
        if not requester.info.runpath:
            for obj in reversed(chain):
                if not obj.info.runpath:
                    dirs.extend(filter(None, (self._expand(e, os.path.dirname(obj.path)) for e in obj.info.rpath)))
        dirs.extend(filter(None, (self._expand(e, os.path.dirname(requester.path)) for e in requester.info.runpath)))
        candidates = [os.path.join(d, name) for d in dirs]
        candidates.extend(ld_cache().get(name, ()))
        candidates.extend(os.path.join(d, name) for d in _DEFAULT_DIRS)
        for cand in candidates:
            if os.path.isfile(cand) and (ident is None or _elf_ident(cand) == ident):
                return os.path.normpath(cand)
        return None

    def _closure_of(
        self, roots: Sequence[Library | str], loaded: dict[str, Library], missing: list[tuple[str, str]] | None = None
    ) -> list[Library]:
        """Breadth-first load order of *roots* and what they need; *loaded* is consulted first."""
        order: list[Library] = []
        seen: dict[str, Library] = {}
        queue: list[tuple[Library, tuple[Library, ...]]] = []
        for root in roots:
            lib = root if isinstance(root, Library) else self.library(root)
            if lib is not None and lib.path not in seen:
                seen[lib.path] = lib
                order.append(lib)
                queue.append((lib, (lib,)))
        while queue:
            lib, chain = queue.pop(0)
            ident = _elf_ident(lib.path)
            for name in lib.info.needed:
                hit = loaded.get(name)
                if hit is not None:
                    continue
                local = next((x for x in order if x.info.soname == name or os.path.basename(x.path) == name), None)
                if local is not None:
                    continue
                path = self._search(name, chain, ident)
                dep = self.library(path) if path else None
                if dep is None:
                    if missing is not None and (name, lib.path) not in missing:
                        missing.append((name, lib.path))
                    continue
                if dep.path not in seen:
                    seen[dep.path] = dep
                    order.append(dep)
                    queue.append((dep, (*chain, dep)))
        return order

    def find_by_name(self, name: str, requester: Library | None) -> str | None:
        """Where ``dlopen(name)`` from *requester* (None: Python's ctypes) would find *name*, or None.

        A library already loaded by that soname is taken as it is; then the requester's DT_RUNPATH (or its
        DT_RPATH), the ld.so cache and the default directories, as for a DT_NEEDED entry.
        """
        hit = self.torch_loaded.get(name)
        if hit is not None:
            return hit.path
        chain = [requester] if requester is not None else ([self.python] if self.python else [])
        if not chain:
            candidates = [*ld_cache().get(name, ()), *(os.path.join(d, name) for d in _DEFAULT_DIRS)]
            return next((os.path.normpath(c) for c in candidates if os.path.isfile(c)), None)
        return self._search(name, chain, _elf_ident(chain[-1].path))

    def library(self, path: str) -> Library | None:
        """The ELF file at *path* as a library of a load set; None when it cannot be read (``unreadable``)."""
        info = self.info(os.path.normpath(path))
        return Library(os.path.normpath(path), info) if info is not None else None

    def load_set(self, module: Library, *, after_torch: bool = False) -> LoadSet:
        """The module's closure as `import` would see it: torch's libraries already loaded if it uses them,
        or, with *after_torch*, because the import stage saw it loaded (by path) after `import torch`."""
        missing: list[tuple[str, str]] = []
        libs = self._closure_of([module], self.torch_loaded, missing)
        torch_sonames = {n for n, lib in self.torch_loaded.items() if lib.path in self.torch_files}
        uses_torch = (
            after_torch
            or module.path in self.torch_files
            or any(n in torch_sonames for lib in libs for n in lib.info.needed)
        )
        if not uses_torch and self.torch_set:
            # Not an extension of torch: torch's libraries are not there to satisfy its needs.
            missing = []
            libs = self._closure_of([module], self.base_loaded, missing)
        providers = [*libs, *self.base, *(self.torch_set if uses_torch else [])]
        by_soname: dict[str, Library] = {}
        for lib in providers:
            by_soname.setdefault(os.path.basename(lib.path), lib)
            if lib.info.soname:
                by_soname.setdefault(lib.info.soname, lib)
        return LoadSet(libs=providers, missing=missing, by_soname=by_soname, uses_torch=uses_torch)


def provided_symbols(sym: UndefinedSymbol, libs: Sequence[Library]) -> bool:
    for lib in libs:
        versions = lib.info.defined.get(sym.name)
        if versions is not None and (not sym.version or sym.version in versions):
            return True
    return False
