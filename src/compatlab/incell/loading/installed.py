"""What to load of an installed distribution: its extension modules (by file path, under the dotted name Python
imports each by), then its top-level packages (by name), from its RECORD and ``top_level.txt`` read once.

Only what lies in the environment is loaded (a RECORD row naming ``/tmp/x.so`` or ``../../../../x.so`` never
makes the lab load a file from elsewhere); an extension module tagged for another CPython is named, never
loaded; a namespace package is imported by its regular packages, and a ``.pth`` path entry names the packages
it puts on ``sys.path``.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from compatlab.incell.loading.elf import importable_here, is_extension_module, module_basename

__all__ = ["Installed", "LoadTarget", "package_targets"]


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class LoadTarget:
    """One thing to load: an extension module by file path, or a top-level package by name."""

    dist: str
    label: str  # "sgl_kernel/sm100/common_ops.abi3.so" or "sgl_kernel"
    name: str  # module name handed to the loader
    path: str | None = None  # absolute path of an extension module; None for an import by name


def _regular_packages(files: Sequence[Any], top: str) -> list[str]:
    """The packages a distribution installs below the namespace package *top* (``cuda`` -> ``cuda.core``):
    the shallowest folders under it with an ``__init__.py``."""
    inits = sorted(
        (f.parts[:-1] for f in files if len(f.parts) > 2 and f.parts[0] == top and f.parts[-1] == "__init__.py"),
        key=len,
    )
    found: list[tuple[str, ...]] = []
    for parts in inits:
        if all(parts[: len(p)] != p for p in found):
            found.append(tuple(parts))
    return [".".join(p) for p in found]


def _top_level_names(dist: importlib.metadata.Distribution, files: Sequence[Any]) -> list[str]:
    text = dist.read_text("top_level.txt")
    if text:
        listed = [n.strip() for n in text.splitlines() if n.strip()]
        dirs = {f.parts[0] for f in files if len(f.parts) == 2 and f.parts[1] == "__init__.py"}
        # As below: the packages are what users import, loose modules beside them are build helpers.
        names = [n for n in listed if n in dirs] or listed
        # `import cuda` runs no code of cuda-core: a namespace package is imported by its regular packages.
        names = [
            sub
            for n in names
            for sub in (
                [n] if n in dirs or any(f.parts == (f"{n}.py",) for f in files) else _regular_packages(files, n) or [n]
            )
        ]
    else:
        packages: list[str] = []
        modules: list[str] = []
        for f in files:
            parts = f.parts
            if not parts or parts[0] in ("..", "__pycache__") or parts[0].endswith((".dist-info", ".data")):
                continue
            if len(parts) == 2 and parts[-1] == "__init__.py":
                packages.append(parts[0])
            elif len(parts) == 1 and parts[0].endswith(".py"):
                modules.append(parts[0][:-3])
            elif len(parts) == 1 and (base := module_basename(parts[0])):
                modules.append(base)
        # Loose top-level modules beside a package are usually build helpers (flashinfer ships
        # build_backend.py): the packages are what users import.
        names = packages or modules
    where = Path(str(dist.locate_file("")))
    names = [_python_name(where.joinpath(*n.split("."))) or n for n in names]
    seen: dict[str, None] = {}
    for n in [*names, *_pth_tops(dist, files)]:
        if "/" not in n and all(part.isidentifier() for part in n.split(".")):
            seen[n] = None
    return sorted(seen)


class Installed:
    """One distribution as installed, its RECORD read once (torch's lists some 20,000 files: reading it for
    each question cost the import stage over a second a cell). Raises importlib.metadata.PackageNotFoundError
    when it is not installed."""

    def __init__(self, dist_name: str) -> None:
        self.name = dist_name
        self.dist = importlib.metadata.distribution(dist_name)
        self.problem = ""  # what is wrong with its METADATA or RECORD: it is then read as far as it can be
        try:
            self.version = self.dist.version
        except (UnicodeDecodeError, OSError, ValueError) as exc:
            self.version = "?"
            self.problem = f"its METADATA cannot be read ({type(exc).__name__}: {exc})"
        try:
            self.files = list(self.dist.files or ())
        except (UnicodeDecodeError, OSError, ValueError, TypeError) as exc:  # a blank RECORD line is a TypeError
            self.files = []
            self.problem = f"its RECORD cannot be read ({type(exc).__name__}: {exc})"

    @functools.cached_property
    def _roots(self) -> tuple[str, ...]:
        # The environment (a venv's data files live in <prefix>/lib, <prefix>/bin) and the folder the
        # distribution is installed in (a base interpreter's site-packages, seen from a venv).
        return tuple({os.path.realpath(sys.prefix), os.path.realpath(str(self.dist.locate_file("")))})

    def inside(self, path: str) -> bool:
        """Whether *path*, symlinks resolved, lies in this environment: a RECORD row naming ``/tmp/x.so``
        or ``../../../../x.so`` must never make the lab load a file from elsewhere."""
        real = os.path.realpath(path)
        return any(real == root or real.startswith(root.rstrip(os.sep) + os.sep) for root in self._roots)

    @functools.cached_property
    def outside(self) -> list[str]:
        """RECORD's shared objects that lie outside the environment (never read, never loaded)."""
        return [
            f.as_posix()
            for f in self.files
            if (f.name.endswith(".so") or ".so." in f.name) and not self.inside(str(self.dist.locate_file(f)))
        ]

    @functools.cached_property
    def elf_files(self) -> list[str]:
        """Every shared object it installed in the environment (extension modules and plain libraries)."""
        paths = (
            str(self.dist.locate_file(f))
            for f in self.files
            if (f.name.endswith(".so") or ".so." in f.name) and not (f.parts and f.parts[0] == "..")
        )
        return [p for p in paths if self.inside(p)]

    @functools.cached_property
    def _extension_modules(self) -> tuple[list[LoadTarget], list[str]]:
        """(the extension modules to load, the labels of those built for another Python)"""
        modules: list[LoadTarget] = []
        other: list[str] = []
        for f in sorted(self.files, key=str):
            if not f.name.endswith(".so") or (f.parts and f.parts[0] == ".."):
                continue
            path = Path(str(self.dist.locate_file(f)))
            if not self.inside(str(path)):
                continue
            base = is_extension_module(path)
            if base is None:
                continue
            if not importable_here(f.name):
                other.append(f.as_posix())
                continue
            dotted = _import_name(path, base) or ".".join([*f.parts[:-1], base])
            modules.append(LoadTarget(dist=self.name, label=f.as_posix(), name=dotted, path=str(path)))
        return modules, other

    @property
    def targets(self) -> list[LoadTarget]:
        """What to load of it: its extension modules, then its top-level packages."""
        return self._extension_modules[0] + [
            LoadTarget(dist=self.name, label=n, name=n) for n in _top_level_names(self.dist, self.files)
        ]

    @property
    def other_python(self) -> list[str]:
        """Extension modules built for another Python than this one (sgl-kernel 0.3.21's
        ``_mscclpp.cpython-310-x86_64-linux-gnu.so`` beside a 3.11 interpreter): ``import`` never finds them
        here, and loading one by path anyway runs code built for another C API (it crashes). Their labels."""
        return self._extension_modules[1]


def _import_name(path: Path, base: str) -> str | None:
    """The dotted name Python imports the module at *path* by: relative to the deepest ``sys.path`` entry
    that holds it (a ``.pth`` file's path entry makes ``site-packages/vendor/foo/_x.so`` the module
    ``foo._x``, not ``vendor.foo._x``); None when no entry holds it under identifiers only."""
    real = os.path.realpath(path)
    entries = sorted({os.path.realpath(e) for e in sys.path if e}, key=len, reverse=True)
    for entry in entries:
        if real.startswith(entry.rstrip(os.sep) + os.sep):
            parts = Path(real[len(entry.rstrip(os.sep)) + 1 :]).parts[:-1]
            if all(p.isidentifier() for p in parts):
                return ".".join([*parts, base])
    return None


def _python_name(folder: Path) -> str | None:
    """The dotted name Python imports the package or module at *folder* (no suffix) by, relative to the
    deepest ``sys.path`` entry that holds it: a ``.pth`` file that puts ``nvidia_cutlass_dsl/dsl_packages``
    on the path makes ``nvidia_cutlass_dsl.dsl_packages.cutlass`` the package ``cutlass``."""
    real = os.path.realpath(folder)
    for entry in sorted({os.path.realpath(e) for e in sys.path if e}, key=len, reverse=True):
        if real.startswith(entry.rstrip(os.sep) + os.sep):
            parts = Path(real[len(entry.rstrip(os.sep)) + 1 :]).parts
            return ".".join(parts) if parts and all(p.isidentifier() for p in parts) else None
    return None


def _pth_tops(dist: importlib.metadata.Distribution, files: Sequence[Any]) -> list[str]:
    """Top-level packages and modules that a distribution's ``.pth`` path entries put on ``sys.path``."""
    names: list[str] = []
    for f in files:
        if len(f.parts) != 1 or not f.name.endswith(".pth"):
            continue
        try:
            text = Path(str(dist.locate_file(f))).read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        root = Path(str(dist.locate_file(""))).resolve()
        for raw in text.splitlines():
            line = raw.strip()
            if not line or line.startswith(("#", "import ", "import\t")):
                continue
            folder = (root / line).resolve()
            prefix = folder.relative_to(root).parts if folder.is_relative_to(root) else None
            if not prefix:
                continue
            for g in files:
                rest = g.parts[len(prefix) :]
                if tuple(g.parts[: len(prefix)]) != tuple(prefix) or not rest:
                    continue
                if len(rest) == 2 and rest[1] == "__init__.py":
                    names.append(rest[0])
                elif len(rest) == 1 and rest[0].endswith(".py") and rest[0] != "__init__.py":
                    names.append(rest[0][:-3])
    return names


def package_targets(dist_name: str) -> tuple[str, list[LoadTarget]]:
    """The installed version of *dist_name* and what to load of it (:attr:`Installed.targets`)."""
    installed = Installed(dist_name)
    return installed.version, installed.targets
