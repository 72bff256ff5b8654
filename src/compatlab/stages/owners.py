"""Files that two installed distributions both own, whose bytes are on disk, and why both are there.

pip and uv install wheels one after another into one site-packages and neither refuses a file that another
distribution already installed: the later wheel overwrites it, both RECORDs go on listing it (with their own
sha256), and uninstalling either removes it for both. Which bytes end up on disk depends on install order,
so two cells that differ only in an unrelated axis can end with different code. The real case: flashinfer
asks for ``cuda-python>=12.0``, a resolver settles on cuda-python 12.6.2.post1, and that old release ships
its own ``cuda/bindings/`` files: both RECORDs list 28 files, 25 of them with different bytes (12 of those
code), and installed after cuda-bindings 13.5.0 its bytes win. Newer cuda-python releases are a metapackage
that requires cuda-bindings instead.

Who owns what is read from every RECORD (``SiteDist.digests``); whose bytes are on disk, by hashing each
shared file against each RECORD's sha256. A file both RECORDs list with the same hash is no clash: every
``nvidia-*-cu12`` wheel ships the same empty ``nvidia/__init__.py``, and an ``__init__.py`` that only declares
a namespace (``pkgutil.extend_path``) does the same in each one's words. ``__pycache__`` entries are left out:
they follow their ``.py`` files. A clash on code (a ``.py`` module, an extension module or a shared library)
changes what ``import`` runs; one on data files only (headers, stubs, licences, scripts) changes less.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from compatlab.site import SiteDist, is_shared_object

__all__ = ["Clash", "file_clashes", "requirement_chain"]

_CODE_SUFFIXES = (".py", ".pyd")


def _is_code(rel: str) -> bool:
    name = rel.rsplit("/", 1)[-1]
    return name.endswith(_CODE_SUFFIXES) or is_shared_object(name)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Clash:
    """The files that two (or more) distributions both install with different bytes."""

    owners: tuple[str, ...]  # "cuda-python 12.6.2.post1", in the order the names sort
    files: tuple[str, ...]  # RECORD paths (relative to site-packages), sorted
    code: int  # how many of them are .py modules, extension modules or shared libraries
    on_disk: Mapping[str, int]  # owner -> files whose bytes on disk are that owner's; "neither" too
    chain: str = ""  # why the older owner is installed: the requirement chain that led there
    older: str = ""  # the owner with the lower version, when the versions compare

    @property
    def where(self) -> str:
        """Where the files are: their common folder ("cuda/bindings/"), else the first file."""
        try:
            common = os.path.commonpath(self.files)
        except ValueError:
            common = ""
        if common and common not in self.files:
            return common + "/"
        return self.files[0] + (f" and {len(self.files) - 1} more" if len(self.files) > 1 else "")

    @property
    def stray(self) -> bool:
        """Whether the code is only top-level modules that no owner is named after: a build helper both
        wheels packaged by mistake (flashinfer-python 0.7.2 and torch_c_dlpack_ext 0.1.5 both ship a
        top-level ``build_backend.py``). What the owners' own packages import is not changed by it."""
        names = {canonicalize_name(o.rsplit(" ", 1)[0]).replace("-", "_") for o in self.owners}
        code = [f for f in self.files if _is_code(f)]
        return bool(code) and all("/" not in f and f.endswith(".py") and f[:-3].lower() not in names for f in code)

    @property
    def fails(self) -> bool:
        """A clash on code the owners' packages run is a failure; on data files or stray modules a warning."""
        return bool(self.code) and not self.stray

    def describe(self) -> str:
        """One line for the grid: who, how many files, where, whose bytes are on disk, and why."""
        names = " and ".join(self.owners)
        what = f"{len(self.files)} file{'s' if len(self.files) != 1 else ''}"
        kind = (
            f", {self.code} of them code"
            if 0 < self.code < len(self.files)
            else ", all code"
            if self.code
            else ", data files only"
        )
        if self.stray:
            kind = (
                ", a top-level module neither is named after: only `import "
                + ", ".join(f[:-3] for f in self.files if f.endswith(".py"))
                + "` gets one of them"
            )
        line = f"{names} both install {what} ({self.where}{kind}) with different bytes: {self._disk()}"
        if self.chain:
            line += f"; {self.older} is here because {self.chain}"
        return line

    def _disk(self) -> str:
        whose = {o: n for o, n in self.on_disk.items() if n}
        if len(whose) == 1:
            ((owner, count),) = whose.items()
            if owner == "neither":
                return "the bytes on disk match neither RECORD"
            return f"the bytes on disk are {owner}'s" + ("" if count == len(self.files) else f" ({count})")
        parts = [f"{n} {'match neither RECORD' if o == 'neither' else f'are {o}s'}" for o, n in whose.items()]
        return "on disk, " + ", ".join(parts)

    def to_json(self) -> dict[str, object]:
        return {
            "owners": list(self.owners),
            "files": len(self.files),
            "where": self.where,
            "code": self.code,
            "on_disk": dict(self.on_disk),
            "chain": self.chain,
            "older": self.older,
            "examples": list(self.files[:10]),
            "fails": self.fails,
            "text": self.describe(),
        }


def _sha256(path: str) -> str | None:
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
    except OSError:
        return None
    return digest.hexdigest()


def _namespace_declaration(path: str) -> bool:
    """An ``__init__.py`` that only declares a namespace package the old ways (``pkgutil.extend_path``,
    ``pkg_resources.declare_namespace``): every distribution of the namespace ships one, in its own words."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            text = fh.read(4096)
    except OSError:
        return False
    code = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    return len(code) <= 6 and ("extend_path(" in text or "declare_namespace(" in text)


def _label(dist: SiteDist) -> str:
    return f"{dist.name} {dist.version}"


def file_clashes(site: Path, dists: Iterable[SiteDist], declared: Iterable[str] = ()) -> list[Clash]:
    """Every group of files that the same distributions install with different bytes (see the module doc).

    *declared* names the cell's own packages: a requirement chain starts at one of them where it can.
    """
    dists = list(dists)
    base = str(site)
    owners: dict[str, list[tuple[SiteDist, str]]] = collections.defaultdict(list)
    for dist in dists:
        for rel in dist.files:
            if "__pycache__/" in rel or rel.startswith(dist.dist_info.name + "/"):
                continue
            owners[os.path.normpath(os.path.join(base, rel))].append((dist, dist.digests.get(rel, "")))
    groups: dict[tuple[str, ...], list[tuple[str, str, dict[str, str]]]] = collections.defaultdict(list)
    by_label: dict[str, SiteDist] = {}
    for path, claims in owners.items():
        if len(claims) < 2:
            continue
        digests = {h for _, h in claims}
        if len(digests) == 1 and "" not in digests:
            continue  # the same bytes: no one's code is replaced
        for d, _ in claims:
            by_label[_label(d)] = d
        key = tuple(sorted({_label(d) for d, _ in claims}))
        if path.endswith("__init__.py") and _namespace_declaration(path):
            continue  # every copy declares the namespace; whichever is on disk does the same
        rel = os.path.relpath(path, base)
        groups[key].append((path, rel, {_label(d): h for d, h in claims}))
    by_name = {d.canonical: d for d in dists}
    out = []
    for key, files in sorted(groups.items()):
        on_disk: dict[str, int] = dict.fromkeys([*key, "neither"], 0)
        for path, _rel, hashes in files:
            now = _sha256(path)
            match = next((o for o, h in hashes.items() if h and h == now), "neither")
            on_disk[match] += 1
        older = _oldest([by_label[k] for k in key])
        chain = requirement_chain(by_name, older.canonical, declared) if older is not None else ""
        rels = tuple(sorted(rel for _, rel, _ in files))
        out.append(
            Clash(
                owners=key,
                files=rels,
                code=sum(_is_code(r) for r in rels),
                on_disk=on_disk,
                chain=chain,
                older=_label(older) if older is not None and chain else "",
            )
        )
    return out


def _oldest(dists: list[SiteDist]) -> SiteDist | None:
    """The owner with the lowest version: of two releases of one family (cuda-python 12 beside cuda-bindings
    13), the stale one. None when the versions do not compare or tie."""
    try:
        ranked = sorted(dists, key=lambda d: Version(d.version))
    except InvalidVersion:
        return None
    if len(ranked) < 2 or Version(ranked[0].version) == Version(ranked[1].version):
        return None
    return ranked[0]


def _edges(dists: Mapping[str, SiteDist]) -> dict[str, list[tuple[SiteDist, str]]]:
    """target -> [(the installed distribution that requires it, the requirement as written)], for the
    requirements the installed target meets (one it violates did not bring it)."""
    out: dict[str, list[tuple[SiteDist, str]]] = collections.defaultdict(list)
    for dist in dists.values():
        for raw in dist.requires:
            try:
                req = Requirement(raw)
            except InvalidRequirement:
                continue
            target = canonicalize_name(req.name)
            got = dists.get(target)
            if got is None or target == dist.canonical:
                continue
            try:
                met = not req.specifier or req.specifier.contains(got.version, prereleases=True)
            except InvalidVersion:
                met = True
            if met:
                out[target].append((dist, str(req)))
    return out


def requirement_chain(dists: Mapping[str, SiteDist], target: str, declared: Iterable[str] = ()) -> str:
    """The shortest chain of requirements from a declared package (else from any package nothing requires)
    down to *target*: "sglang 0.5.22 requires 'flashinfer-python==0.7.4' -> flashinfer-python 0.7.4 requires
    'cuda-python>=12.0'". "" when nothing installed requires it."""
    edges = _edges(dists)
    roots = {canonicalize_name(d) for d in declared}
    # Breadth first, upward from the target: the first declared package reached is the shortest chain.
    seen = {target}
    frontier: list[tuple[str, list[str]]] = [(target, [])]
    best: list[str] = []
    while frontier:
        nxt: list[tuple[str, list[str]]] = []
        for name, steps in frontier:
            for parent, req in sorted(edges.get(name, []), key=lambda e: e[0].canonical):
                if parent.canonical in seen:
                    continue
                seen.add(parent.canonical)
                chain = [f"{_label(parent)} requires {req!r}", *steps]
                if parent.canonical in roots:
                    return " -> ".join(chain)
                if not edges.get(parent.canonical) and not best:
                    best = chain  # a package nothing requires: the user's own choice
                nxt.append((parent.canonical, chain))
        frontier = nxt
    return " -> ".join(best)
