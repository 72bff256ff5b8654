"""The site-packages index: installed distributions, their RECORD hashes, and their ELF modules."""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Sequence
from email.parser import HeaderParser
from pathlib import Path

from compatlab.stages.static.elf import is_elf, record_sha256


@dataclasses.dataclass(kw_only=True, slots=True)
class SiteDist:
    name: str
    version: str
    dist_info: Path
    requires: list[str]
    tags: list[str]
    files: list[str]  # RECORD paths, relative to site-packages


def read_site_dists(sp: Path) -> tuple[list[SiteDist], dict[str, tuple[str, int]]]:
    """Installed distributions and the RECORD hash (hex, size) of every file, by normalised path."""
    dists: list[SiteDist] = []
    hashes: dict[str, tuple[str, int]] = {}
    base = str(sp)  # os.path, not pathlib: torch's RECORD alone has ~15k lines
    for info in sorted(sp.glob("*.dist-info")):
        try:
            meta = HeaderParser().parsestr(
                (info / "METADATA").read_text(encoding="utf-8", errors="replace"), headersonly=True)
        except OSError:
            continue
        tags: list[str] = []
        try:
            wheel = HeaderParser().parsestr((info / "WHEEL").read_text(encoding="utf-8", errors="replace"))
            tags = [str(t) for t in wheel.get_all("Tag") or []]
        except OSError:
            pass
        files: list[str] = []
        try:
            lines = (info / "RECORD").read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            lines = []
        for line in lines:
            # RECORD is CSV, but file names with commas are rare enough that rsplit is exact for .so files.
            parts = line.rsplit(",", 2)
            if len(parts) != 3:
                continue
            rel, digest, size = parts
            files.append(rel)
            hexd = record_sha256(digest)
            if hexd and size.isdigit():
                hashes[os.path.normpath(os.path.join(base, rel))] = (hexd, int(size))
        dists.append(SiteDist(
            name=str(meta.get("Name", info.name.split("-")[0])), version=str(meta.get("Version", "?")),
            dist_info=info, requires=[str(r) for r in meta.get_all("Requires-Dist") or []],
            tags=tags, files=files,
        ))
    return dists, hashes


def is_shared_object(name: str) -> bool:
    return name.endswith(".so") or ".so." in name


def walk_modules(sp: Path, packages: Sequence[str] | None) -> list[Path]:
    """Every ELF shared object of the chosen top-level packages (all packages with .so files if None)."""
    found: list[Path] = []
    for top in sorted(sp.iterdir()):
        if top.name.endswith((".dist-info", ".egg-info")) or top.name == "__pycache__":
            continue
        top_name = top.name.split(".")[0] if top.is_file() else top.name
        if packages is not None and top_name not in packages:
            continue
        if top.is_file():
            if is_shared_object(top.name) and not top.is_symlink() and is_elf(top):
                found.append(top)
            continue
        for root, dirs, files in os.walk(top):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in sorted(files):
                if not is_shared_object(name):
                    continue
                path = Path(root) / name
                if not path.is_symlink() and is_elf(path):
                    found.append(path)
    return found


def is_extension(path: Path, py: tuple[int, int] | None) -> bool:
    """Whether `import` can load *path* as a module in an environment of Python *py*."""
    m = re.search(r"\.cpython-(\d)(\d+)[^.]*\.so$", path.name)
    if m:
        return py is None or (int(m.group(1)), int(m.group(2))) == py
    if path.name.endswith(".abi3.so"):
        return True
    # A bare "name.so" is importable too (triton/_C/libtriton.so), except in the library dirs of wheels.
    return path.suffix == ".so" and path.parent.name not in ("lib", "lib64")


def python_version_of(sp: Path) -> tuple[int, int] | None:
    m = re.fullmatch(r"python(\d)\.(\d+)", sp.parent.name)
    return (int(m.group(1)), int(m.group(2))) if m else None


def declared_tops(site_packages: Path, dists: Sequence[str]) -> list[str]:
    """Top-level names that the cell's declared distributions install (their own files and bundled libs)."""
    from packaging.utils import canonicalize_name

    wanted = {canonicalize_name(d) for d in dists}
    tops: dict[str, None] = {}
    for info in sorted(site_packages.glob("*.dist-info")):
        name = info.name[: -len(".dist-info")].rsplit("-", 1)[0]
        if canonicalize_name(name) not in wanted or not (info / "RECORD").is_file():
            continue
        for line in (info / "RECORD").read_text(encoding="utf-8", errors="replace").splitlines():
            first = line.split(",", 1)[0].split("/", 1)[0]
            if first and not first.endswith((".dist-info", ".data")) and first != "..":
                tops[first.split(".")[0]] = None
    return list(tops)
