"""Reachability: does ``import <package>`` need a given module of it? Read from the package's Python code.

``import P`` executes ``P/__init__.py`` and, recursively, every module it imports at module level: the
statements of a module body and of class bodies run at import, those of a function body only when the
function is called. An import inside ``try: … except ImportError`` (or one of its bases, or a bare
``except``) does not fail the import of P when it fails, nor do imports under ``if TYPE_CHECKING:``,
which never run. So a module of P is

- **needed** when a chain of unguarded module-level imports leads from ``P/__init__.py`` to it;
- **not needed** when P's code imports it only inside functions (a lazily chosen backend: numba's
  threading layers) or only under an ImportError guard (an optional speed-up);
- **not needed** also when P has Python code and none of it imports the module or names it (jaxlib's MLIR
  dialects, a Tk backend of matplotlib): ``import P`` cannot reach it;
- **unknown** otherwise: P has no Python code to read, or a module that ``import P`` runs names it in a
  string (a loader that picks a build by path at import time, as sgl_kernel does for ``sm90/`` and
  ``sm100/common_ops``, or mpi4py for ``MPI.mpich`` and ``MPI.openmpi``). Unknown counts as needed.

A module judged not needed here is only a warning once the import stage confirms it: ``import P``
loaded, and had not mapped the module when it finished. An unknown module may be confirmed the same way
(mpi4py loads the build for the MPI library it finds, and this environment has one), except a build the
loader may pick by GPU (one with device code, or in an ``sm90/`` folder): the GPU here need not be the
target's, so those stay red (see :meth:`Need.confirmable`).

P is the package that owns the module: for a namespace package (``cuda/``, no ``__init__.py``) the
regular package below it (``cuda.core``), as ``import cuda`` runs none of its distributions' code.

Where the package says what a lazily imported module is for, the reason carries it: the docstring of
the function that imports it, or the message its ImportError handler raises or warns with.
"""

from __future__ import annotations

import ast
import dataclasses
import os
import re
from collections.abc import Iterator
from pathlib import Path

from compatlab.incell.files import read_regular

__all__ = ["ImportGraph", "Need", "Reference", "dotted_name", "package_of", "picked_by_gpu"]

_GUARDS = frozenset({"ImportError", "ModuleNotFoundError", "Exception", "BaseException", "OSError"})
_NOT_NEEDED, _NEEDED, _UNKNOWN = "no", "yes", "unknown"
_ARCH_DIR = re.compile(r"sm_?[0-9]+[a-z]?")


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Reference:
    """One import statement of a package's code that names a module."""

    target: str  # the module imported, dotted
    file: str  # the importing file, relative to site-packages
    line: int
    function: str = ""  # the function it sits in ("" at module level), qualified within its file
    guarded: bool = False  # under try/except ImportError
    feature: str = ""  # what the package says the import is for


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Need:
    """Whether ``import <package>`` needs a module: yes, no or unknown (counted as yes), and why."""

    needed: str
    why: str
    feature: str = ""
    named: bool = False  # unknown because code that `import P` runs names it in a string (a load by path)
    unnamed: bool = False  # no because no code of P imports it or names it (a computed path may still load it)

    @property
    def optional(self) -> bool:
        return self.needed == _NOT_NEEDED

    def confirmable(self, rel: str, *, device_code: bool) -> bool:
        """May the import stage find this module not needed? Yes when the code says so, and when code that
        `import P` runs names it (it may load it by path), unless the loader may pick the build by GPU (see
        :func:`picked_by_gpu`). Not when P has no Python code: then nothing runs that could leave it out.
        A module no code names at all is confirmable unless it too may be picked by GPU: a loader that builds
        the path from the GPU it finds (``f"sm{major}{minor}"``) names it nowhere."""
        by_gpu = picked_by_gpu(rel, device_code=device_code)
        if self.optional:
            return not (self.unnamed and by_gpu)
        return self.needed == _UNKNOWN and self.named and not by_gpu


def picked_by_gpu(rel: str, *, device_code: bool) -> bool:
    """A build a loader may choose by the GPU it finds: it carries device code, or sits in an ``sm90/``-style
    folder. Whether ``import P`` loads it on this machine says nothing of the target's GPU."""
    return device_code or any(_ARCH_DIR.fullmatch(part) for part in rel.split("/")[:-1])


def package_of(site_packages: Path, rel: str) -> str:
    """The package whose ``import`` owns the module at *rel*: its top-level folder, or for a namespace package
    (no ``__init__.py``: ``cuda/``, ``nvidia/``) the first regular package below it (``cuda.core``)."""
    parts = rel.split("/")[:-1]
    for depth in range(1, len(parts) + 1):
        if (site_packages.joinpath(*parts[:depth]) / "__init__.py").is_file():
            return ".".join(parts[:depth])
    return rel.split("/", 1)[0].split(".", 1)[0]


@dataclasses.dataclass(slots=True)
class _Module:
    name: str
    file: str
    refs: list[Reference] = dataclasses.field(default_factory=list)
    strings: set[str] = dataclasses.field(default_factory=set)


def dotted_name(rel: str) -> str:
    """``numba/np/ufunc/tbbpool.cpython-311-x86_64-linux-gnu.so`` -> ``numba.np.ufunc.tbbpool``."""
    parts = rel.split("/")
    base = parts[-1].split(".", 1)[0]
    if base == "__init__":
        return ".".join(parts[:-1])
    return ".".join([*parts[:-1], base])


def _is_test(rel: str) -> bool:
    parts = rel.split("/")
    return any(p in ("tests", "test", "testing") for p in parts[:-1]) or parts[-1].startswith("test_")


def _first_line(text: str | None) -> str:
    for line in (text or "").strip().splitlines():
        if line.strip():
            return line.strip()
    return ""


def _catches_import_error(handler: ast.ExceptHandler) -> bool:
    if handler.type is None:
        return True
    kinds = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    for kind in kinds:
        name = kind.attr if isinstance(kind, ast.Attribute) else kind.id if isinstance(kind, ast.Name) else ""
        if name in _GUARDS:
            return True
    return False


def _handler_message(handlers: list[ast.ExceptHandler]) -> str:
    """The first string a handler raises or warns with: the package's own words for what breaks."""
    for handler in handlers:
        for node in ast.walk(handler):
            if isinstance(node, ast.Raise | ast.Call):
                for sub in ast.walk(node):
                    if isinstance(sub, ast.Constant) and isinstance(sub.value, str) and len(sub.value) > 12:
                        return _first_line(sub.value)
    return ""


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


class _Reader:
    """Walks one module's AST and records every import with the context it runs in."""

    def __init__(self, module: _Module, package: bool) -> None:
        self.m = module
        self.package = package

    def targets(self, node: ast.Import | ast.ImportFrom) -> list[str]:
        if isinstance(node, ast.Import):
            out: list[str] = []
            for alias in node.names:
                parts = alias.name.split(".")
                out.extend(".".join(parts[: i + 1]) for i in range(len(parts)))
            return out
        if node.level:
            base_parts = self.m.name.split(".")
            if not self.package:
                base_parts = base_parts[:-1]
            if node.level > 1:
                base_parts = base_parts[: len(base_parts) - (node.level - 1)]
            base = ".".join(base_parts)
            mod = f"{base}.{node.module}" if node.module else base
        else:
            mod = node.module or ""
        if not mod:
            return []
        parts = mod.split(".")
        out = [".".join(parts[: i + 1]) for i in range(len(parts))]
        out.extend(f"{mod}.{alias.name}" for alias in node.names if alias.name != "*")
        return out

    def walk(self, body: list[ast.stmt], function: str, guarded: bool, feature: str) -> None:
        for node in body:
            self.visit(node, function, guarded, feature)

    def visit(self, node: ast.stmt, function: str, guarded: bool, feature: str) -> None:
        if isinstance(node, ast.Import | ast.ImportFrom):
            for target in self.targets(node):
                self.m.refs.append(
                    Reference(
                        target=target,
                        file=self.m.file,
                        line=node.lineno,
                        function=function,
                        guarded=guarded,
                        feature=feature,
                    )
                )
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            name = f"{function}.{node.name}" if function else node.name
            doc = _first_line(ast.get_docstring(node)) or feature
            self.walk(node.body, name, guarded, doc)
        elif isinstance(node, ast.ClassDef):
            self.walk(node.body, function, guarded, feature)  # a class body runs where the class is defined
        elif isinstance(node, ast.Try | ast.TryStar):
            guard = any(_catches_import_error(h) for h in node.handlers)
            said = _handler_message(node.handlers) if guard else ""
            self.walk(node.body, function, guarded or guard, said or feature)
            for handler in node.handlers:
                self.walk(handler.body, function, guarded or guard, said or feature)
            self.walk(node.orelse, function, guarded, feature)
            self.walk(node.finalbody, function, guarded, feature)
        elif isinstance(node, ast.If):
            if not _is_type_checking(node.test):
                self.walk(node.body, function, guarded, feature)
            self.walk(node.orelse, function, guarded, feature)
        else:
            for field in ("body", "orelse", "finalbody", "handlers"):
                inner = getattr(node, field, None)
                if isinstance(inner, list):
                    self.walk([s for s in inner if isinstance(s, ast.stmt)], function, guarded, feature)
            for case in getattr(node, "cases", []) or []:  # match statements
                self.walk(case.body, function, guarded, feature)


def _strings(tree: ast.Module) -> set[str]:
    docstrings: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                docstrings.add(id(body[0].value))
    return {
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings and len(n.value) < 4096
    }


class ImportGraph:
    """The module-level import graph of one top-level package in a site-packages directory.

    Python files are parsed on demand, only those that ``import <package>`` reaches plus the ones that
    import a module asked about; the package's own files only (other packages are not followed).
    """

    def __init__(self, site_packages: Path, top: str) -> None:
        self.sp = site_packages
        self.top = top
        self.files: dict[str, str] = {}  # dotted -> rel path of its .py (or __init__.py)
        self._parsed: dict[str, _Module | None] = {}
        self._reach: tuple[dict[str, tuple[str, ...]], set[str]] | None = None
        root = site_packages.joinpath(*top.split("."))
        if root.is_dir():
            for dirpath, dirs, names in os.walk(root):
                dirs[:] = sorted(d for d in dirs if d != "__pycache__" and d.isidentifier())
                for name in names:
                    if name.endswith(".py"):
                        rel = Path(dirpath, name).relative_to(site_packages).as_posix()
                        self.files[dotted_name(rel)] = rel
        elif (py := root.with_name(root.name + ".py")).is_file():
            self.files[top] = py.relative_to(site_packages).as_posix()

    def module(self, dotted: str) -> _Module | None:
        if dotted in self._parsed:
            return self._parsed[dotted]
        rel = self.files.get(dotted)
        parsed = None
        if rel is not None:
            try:
                tree = ast.parse(read_regular(self.sp / rel), filename=rel)
            except (OSError, SyntaxError, ValueError, RecursionError, MemoryError):
                tree = None
            if tree is not None:
                parsed = _Module(name=dotted, file=rel)
                _Reader(parsed, rel.endswith("__init__.py")).walk(tree.body, "", False, "")
                parsed.strings = _strings(tree)
        self._parsed[dotted] = parsed
        return parsed

    def _own(self, dotted: str) -> bool:
        return dotted == self.top or dotted.startswith(self.top + ".")

    def reach(self) -> tuple[dict[str, tuple[str, ...]], set[str]]:
        """Modules ``import <top>`` runs (each with the chain that runs it), and those only a guard runs."""
        if self._reach is not None:
            return self._reach
        chains: dict[str, tuple[str, ...]] = {self.top: (self.top,)}
        queue = [self.top]
        while queue:
            name = queue.pop(0)
            mod = self.module(name)
            if mod is None:
                continue
            for ref in mod.refs:
                if ref.function or ref.guarded or not self._own(ref.target) or ref.target in chains:
                    continue
                chains[ref.target] = (*chains[name], ref.target)
                queue.append(ref.target)
        guarded: set[str] = set()
        queue = list(chains)
        while queue:
            name = queue.pop(0)
            mod = self.module(name)
            if mod is None:
                continue
            for ref in mod.refs:
                if ref.function or not self._own(ref.target) or ref.target in chains or ref.target in guarded:
                    continue
                guarded.add(ref.target)
                queue.append(ref.target)
        self._reach = (chains, guarded)
        return self._reach

    def references(self, dotted: str) -> Iterator[Reference]:
        """Every import of *dotted* anywhere in the package's Python code, the package's tests last."""
        stem = dotted.rsplit(".", 1)[-1].encode()
        for name in sorted(self.files, key=lambda n: (_is_test(self.files[n]), n)):
            if name not in self._parsed:
                try:  # only files that spell the module's name can import it: skip parsing the others
                    if stem not in read_regular(self.sp / self.files[name]):
                        continue
                except OSError:
                    continue
            mod = self.module(name)
            if mod is None:
                continue
            for ref in mod.refs:
                if ref.target == dotted:
                    yield ref

    def need(self, dotted: str) -> Need:
        """Does ``import <top>`` need the module *dotted* (an extension module of the package)?"""
        chains, guarded = self.reach()
        if dotted in chains:
            return Need(needed=_NEEDED, why=f"`import {self.top}` imports it: " + " → ".join(chains[dotted]))
        stem = dotted.rsplit(".", 1)[-1]
        word = re.compile(rf"(?<![A-Za-z0-9_]){re.escape(stem)}(?![A-Za-z0-9_])")
        for name in chains:
            mod = self.module(name)
            if mod is not None and any(word.search(s) for s in mod.strings):
                return Need(
                    needed=_UNKNOWN,
                    named=True,
                    why=f"{mod.file}, which `import {self.top}` runs, names {stem!r}: it may load it by path",
                )
        refs = list(self.references(dotted))
        if not refs:
            if self.module(self.top) is None:  # no Python to read (a bare extension, a namespace): unknown
                return Need(needed=_UNKNOWN, why=f"no Python code of {self.top} imports it")
            # `import P` ran P's code, which neither imports the module nor names it: the import stage
            # confirms it (P imported without mapping it) before this is a warning.
            return Need(needed=_NOT_NEEDED, unnamed=True, why=f"no Python code of {self.top} imports it or names it")
        own = [r for r in refs if not _is_test(r.file)] or refs
        ref = (
            next((r for r in own if r.guarded and not r.function), None)
            or next((r for r in own if r.feature), None)
            or own[0]
        )
        if dotted in guarded or (ref.guarded and not ref.function):
            why = f"{ref.file}:{ref.line} imports it under try/except ImportError"
        elif not ref.function:  # at module level of a module that `import P` itself does not run
            why = f"imported only by {ref.file}:{ref.line}, which `import {self.top}` does not run"
        else:
            why = f"only imported inside {ref.function}() ({ref.file}:{ref.line})"
            if ref.guarded:
                why += ", under try/except ImportError"
        feature = ref.feature or next((r.feature for r in own if r.feature), "")
        return Need(needed=_NOT_NEEDED, why=why, feature=feature)
