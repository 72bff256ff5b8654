"""The site-packages index: installed distributions, their RECORD hashes, their ELF modules, and torch's CUDA.

The one reader of a site-packages folder for every stage: the pins stage reads its distributions and
requirements here, the static stage its files and hashes, and both ask ``torch_cuda`` which CUDA torch was
built for (torch/version.py, else the +cuXY local tag), as ``compatlab check`` does for an existing environment
(``cuda_of_torch``). Below the stages and the existing environment alike, it imports only ``compatlab.incell``.
"""

from __future__ import annotations

import base64
import dataclasses
import os
import re
from collections.abc import Sequence
from email.parser import HeaderParser
from pathlib import Path

from packaging.utils import canonicalize_name

from compatlab.incell.files import is_elf, read_regular, read_text


@dataclasses.dataclass(kw_only=True, slots=True)
class SiteDist:
    name: str
    version: str
    dist_info: Path
    requires: list[str]
    tags: list[str]
    files: list[str]  # RECORD paths, relative to site-packages
    digests: dict[str, str] = dataclasses.field(default_factory=dict)  # RECORD path -> sha256 hex, where given

    @property
    def canonical(self) -> str:
        """The name as PEP 503 compares names (``Flashinfer_Python`` is ``flashinfer-python``)."""
        return canonicalize_name(self.name)


def record_sha256(value: str) -> str | None:
    """Hex digest of a RECORD hash field (``sha256=<urlsafe base64>``), or None for other algorithms."""
    algo, _, digest = value.partition("=")
    if algo != "sha256" or not digest:
        return None
    try:
        return base64.urlsafe_b64decode(digest + "=" * (-len(digest) % 4)).hex()
    except ValueError:
        return None


def read_site_dists(sp: Path) -> tuple[list[SiteDist], dict[str, tuple[str, int]]]:
    """Installed distributions and the RECORD hash (hex, size) of every file, by normalised path."""
    dists: list[SiteDist] = []
    hashes: dict[str, tuple[str, int]] = {}
    base = str(sp)  # os.path, not pathlib: torch's RECORD alone has ~15k lines
    for info in sorted(sp.glob("*.dist-info")):
        try:
            meta = HeaderParser().parsestr(read_text(info / "METADATA"), headersonly=True)
        except OSError:
            continue
        tags: list[str] = []
        try:
            wheel = HeaderParser().parsestr(read_text(info / "WHEEL"))
            tags = [str(t) for t in wheel.get_all("Tag") or []]
        except OSError:
            pass
        files: list[str] = []
        digests: dict[str, str] = {}
        try:
            lines = read_text(info / "RECORD").splitlines()
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
            if hexd:
                digests[rel] = hexd
            if hexd and size.isdigit():
                hashes[os.path.normpath(os.path.join(base, rel))] = (hexd, int(size))
        dists.append(
            SiteDist(
                name=str(meta.get("Name", info.name.split("-")[0])),
                version=str(meta.get("Version", "?")),
                dist_info=info,
                requires=[str(r) for r in meta.get_all("Requires-Dist") or []],
                tags=tags,
                files=files,
                digests=digests,
            )
        )
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
    wanted = {canonicalize_name(d) for d in dists}
    tops: dict[str, None] = {}
    for info in sorted(site_packages.glob("*.dist-info")):
        name = info.name[: -len(".dist-info")].rsplit("-", 1)[0]
        if canonicalize_name(name) not in wanted or not (info / "RECORD").is_file():
            continue
        try:
            lines = read_text(info / "RECORD").splitlines()
        except OSError:
            continue
        for line in lines:
            first = line.split(",", 1)[0].split("/", 1)[0]
            if first and not first.endswith((".dist-info", ".data")) and first != "..":
                tops[first.split(".")[0]] = None
    return list(tops)


def dists_by_name(sp: Path) -> dict[str, SiteDist]:
    """The installed distributions by canonical name (PEP 503), for lookups by requirement name."""
    return {d.canonical: d for d in read_site_dists(sp)[0] if d.version != "?"}


def cuda_of_torch(version_py: str | None, torch_version: str | None) -> str | None:
    """CUDA version torch was built for: its torch/version.py text, else its local tag (cu130 -> 13.0)."""
    if version_py and (m := re.search(r"^cuda\s*(?::\s*[^=]+)?\s*=\s*['\"]([\d.]+)['\"]", version_py, re.MULTILINE)):
        return m.group(1)
    if torch_version and (m := re.search(r"\+cu(\d+)(\d)$", torch_version)):
        return f"{int(m.group(1))}.{m.group(2)}"
    return None


def torch_cuda(sp: Path, torch_version: str | None = None) -> str | None:
    """The CUDA of the torch installed in *sp* (None for a CPU build or no torch)."""
    version_py = sp / "torch" / "version.py"
    try:
        text = read_regular(version_py, limit=1 << 20).decode("utf-8")
    except (OSError, UnicodeDecodeError):
        text = None
    return cuda_of_torch(text, torch_version)
