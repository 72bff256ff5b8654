"""ELF shared objects: what a file needs and offers at load time, read once per content hash.

Headers, the dynamic section and symbol versions come from pyelftools; the dynamic symbol table is
unpacked with :mod:`struct` because pyelftools builds one object per symbol: libtorch_cpu.so's 79k
symbols take 2.4 s through pyelftools, 0.19 s through ``nm -D`` and 0.13 s this way, with no binutils
needed on the machine.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import logging
import mmap
import os
import re
import struct
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from compatlab.errors import LabError
from compatlab.stages.static.fatbin import FATBIN_SECTIONS, FatbinError, parse_fatbin

__all__ = [
    "CACHE_SCHEMA",
    "ElfCache",
    "ElfInfo",
    "NotElf",
    "UndefinedSymbol",
    "default_cache_dir",
    "demangle",
    "is_elf",
    "read_elf",
    "record_sha256",
    "sha256_file",
]

log = logging.getLogger(__name__)

# Bump when ElfInfo's shape or meaning changes: old cache entries are then ignored, never misread.
CACHE_SCHEMA = 1

_SHN_UNDEF = 0
_STB_GLOBAL, _STB_WEAK, _STB_GNU_UNIQUE = 1, 2, 10
_VERSYM_HIDDEN = 0x8000
_VER_FLG_BASE = 0x1
# A C string naming a versioned library, alone or at the end of a path: "libnvrtc.so.13", ".../libcuda.so.1".
_LIBRARY_NAME = re.compile(rb"(?<=[\0/])lib[A-Za-z0-9_+-]+\.so\.[0-9]+(?=\0)")


class NotElf(LabError):
    """The file is not an ELF object this lab can read."""


@dataclasses.dataclass(frozen=True, slots=True)
class UndefinedSymbol:
    name: str
    version: str = ""  # required version ("GLIBC_2.34"), "" when the reference is unversioned
    library: str = ""  # the file that version is required from (.gnu.version_r), if versioned
    weak: bool = False


@dataclasses.dataclass(kw_only=True, slots=True)
class ElfInfo:
    """The load-time interface of one ELF file; JSON-serialisable through to_json/from_json."""

    sha256: str
    elf_class: int  # 32 or 64
    machine: str  # e_machine, e.g. "EM_X86_64"
    soname: str = ""
    needed: list[str] = dataclasses.field(default_factory=list)
    rpath: list[str] = dataclasses.field(default_factory=list)
    runpath: list[str] = dataclasses.field(default_factory=list)
    # name -> versions it is defined with ("" for an unversioned definition)
    defined: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    undefined: list[UndefinedSymbol] = dataclasses.field(default_factory=list)
    version_defs: list[str] = dataclasses.field(default_factory=list)
    version_needs: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    fatbins: list[list[str]] = dataclasses.field(default_factory=list)  # see fatbin.parse_fatbin
    fatbin_error: str = ""
    # Library names (lib*.so.N) in .rodata: what the object may dlopen() by name at run time.
    by_name: list[str] = dataclasses.field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        # By hand: dataclasses.asdict deep-copies libtorch's ~80k symbols and was a third of a cold check.
        data: dict[str, Any] = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        # Tuples instead of dicts keep the cache files of the big libraries about half as large.
        data["undefined"] = [[u.name, u.version, u.library, u.weak] for u in self.undefined]
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ElfInfo:
        fields = dict(data)
        fields["undefined"] = [UndefinedSymbol(str(n), str(v), str(lib), bool(w))
                               for n, v, lib, w in data["undefined"]]
        return cls(**fields)


def is_elf(path: Path) -> bool:
    """Whether *path* starts with the ELF magic (cheap; reads four bytes)."""
    try:
        with path.open("rb") as fh:
            return fh.read(4) == b"\x7fELF"
    except OSError:
        return False


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file's content."""
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def record_sha256(value: str) -> str | None:
    """Hex digest of a RECORD hash field (``sha256=<urlsafe base64>``), or None for other algorithms."""
    algo, _, digest = value.partition("=")
    if algo != "sha256" or not digest:
        return None
    try:
        return base64.urlsafe_b64decode(digest + "=" * (-len(digest) % 4)).hex()
    except ValueError:
        return None


def demangle(name: str) -> str:
    """Demangle a C++ symbol with libstdc++'s __cxa_demangle; other names unchanged.

    The same demangler as the import stage's (loadcheck runs inside cells, with the stdlib only), so the
    static and import reasons name a symbol identically.
    """
    from compatlab.incell.loadcheck import demangle as cxa_demangle

    return cxa_demangle(name) or name


def _iter_dynamic(elf: Any) -> Iterator[tuple[str, Any]]:
    from elftools.elf.dynamic import DynamicSection

    for section in elf.iter_sections():
        if isinstance(section, DynamicSection):
            for tag in section.iter_tags():
                yield str(tag.entry.d_tag), tag
            return


def read_elf(path: Path, sha256: str = "") -> ElfInfo:
    """Read *path*'s dynamic interface and embedded GPU code. Raises NotElf for anything else."""
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile

    try:
        with path.open("rb") as fh:
            try:
                elf = ELFFile(fh)
                return _read(elf, fh, sha256)
            except (ELFError, struct.error, ValueError, IndexError) as exc:
                raise NotElf(f"{path}: not a readable ELF file ({exc})") from None
    except OSError as exc:
        raise NotElf(f"{path}: cannot read ({exc.strerror})") from None


def _read(elf: Any, fh: Any, sha256: str) -> ElfInfo:
    info = ElfInfo(sha256=sha256, elf_class=int(elf.elfclass), machine=str(elf["e_machine"]))
    for tag, entry in _iter_dynamic(elf):
        if tag == "DT_NEEDED":
            info.needed.append(str(entry.needed))
        elif tag == "DT_SONAME":
            info.soname = str(entry.soname)
        elif tag == "DT_RPATH":
            info.rpath.extend(p for p in str(entry.rpath).split(":") if p)
        elif tag == "DT_RUNPATH":
            info.runpath.extend(p for p in str(entry.runpath).split(":") if p)

    # Version indexes used by .gnu.version: defined versions and (file, version) pairs needed.
    index: dict[int, tuple[str, str]] = {}  # index -> (version, file it is needed from or "")
    dynsym = versym = None
    fat_ranges: list[tuple[int, int]] = []
    rodata: tuple[int, int] | None = None
    for section in elf.iter_sections():
        stype = section["sh_type"]
        if stype == "SHT_GNU_verdef":
            for verdef, aux in section.iter_versions():
                names = [a.name for a in aux]
                if names and not verdef["vd_flags"] & _VER_FLG_BASE:
                    index[verdef["vd_ndx"]] = (names[0], "")
                    info.version_defs.append(names[0])
        elif stype == "SHT_GNU_verneed":
            for verneed, aux in section.iter_versions():
                wanted = info.version_needs.setdefault(verneed.name, [])
                for a in aux:
                    index[a["vna_other"]] = (a.name, verneed.name)
                    wanted.append(a.name)
        elif stype == "SHT_DYNSYM":
            dynsym = section
        elif stype == "SHT_GNU_versym":
            versym = section
        elif section.name in FATBIN_SECTIONS and stype != "SHT_NOBITS" and section["sh_size"]:
            fat_ranges.append((section["sh_offset"], section["sh_size"]))
        elif section.name == ".rodata" and stype != "SHT_NOBITS" and section["sh_size"]:
            rodata = (section["sh_offset"], section["sh_size"])

    if dynsym is not None and dynsym["sh_size"]:
        _read_dynsym(elf, fh, dynsym, versym=versym, index=index, info=info)
    if rodata is not None:
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            found = _LIBRARY_NAME.findall(mm, rodata[0], rodata[0] + rodata[1])
            info.by_name = sorted({m.decode("ascii", "replace") for m in found})
    if fat_ranges:
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            try:
                info.fatbins = parse_fatbin(mm, fat_ranges)
            except FatbinError as exc:
                info.fatbin_error = str(exc)
    return info


def _section_bytes(fh: Any, section: Any) -> bytes:
    fh.seek(section["sh_offset"])
    data: bytes = fh.read(section["sh_size"])
    return data


def _read_dynsym(elf: Any, fh: Any, dynsym: Any, *, versym: Any, index: dict[int, tuple[str, str]],
                 info: ElfInfo) -> None:
    little = elf.little_endian
    end = "<" if little else ">"
    strtab = _section_bytes(fh, elf.get_section(dynsym["sh_link"]))
    raw = _section_bytes(fh, dynsym)
    if elf.elfclass == 64:
        fmt, name_i, info_i, shndx_i = end + "IBBHQQ", 0, 1, 3
    else:
        fmt, name_i, info_i, shndx_i = end + "IIIBBH", 0, 3, 5
    entsize = struct.calcsize(fmt)
    raw = raw[: len(raw) - len(raw) % entsize]
    versions: tuple[int, ...] = ()
    if versym is not None:
        vraw = _section_bytes(fh, versym)
        versions = struct.unpack(f"{end}{len(vraw) // 2}H", vraw[: len(vraw) // 2 * 2])
    defined = info.defined
    for i, sym in enumerate(struct.iter_unpack(fmt, raw)):
        if i == 0:
            continue  # the null symbol
        bind = sym[info_i] >> 4
        if bind not in (_STB_GLOBAL, _STB_WEAK, _STB_GNU_UNIQUE):
            continue
        off = sym[name_i]
        name = strtab[off: strtab.index(b"\0", off)].decode("utf-8", "replace")
        if not name:
            continue
        vidx = (versions[i] & ~_VERSYM_HIDDEN) if i < len(versions) else 0
        version, library = index.get(vidx, ("", ""))
        if sym[shndx_i] == _SHN_UNDEF:
            info.undefined.append(UndefinedSymbol(name, version, library, bind == _STB_WEAK))
        else:
            defined.setdefault(name, []).append(version)


def default_cache_dir() -> Path:
    """``$COMPATLAB_CACHE``, else ``~/.cache/compatlab``."""
    env = os.environ.get("COMPATLAB_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "compatlab"


class ElfCache:
    """ElfInfo by content hash: on disk (one JSON file per hash, written atomically) and in memory.

    A matrix re-reads torch's symbol tables once per unique torch build, not once per cell.
    """

    def __init__(self, root: Path | None = None) -> None:
        self.root = (root or default_cache_dir()) / f"elf-v{CACHE_SCHEMA}"
        self._memory: dict[str, ElfInfo] = {}
        self.hits = 0  # served from disk or memory
        self.misses = 0  # read from the ELF file

    def _path(self, digest: str) -> Path:
        return self.root / digest[:2] / f"{digest}.json"

    def load(self, path: Path, sha256: str | None = None) -> ElfInfo:
        """ElfInfo of *path*; *sha256* (e.g. from the dist's RECORD) saves hashing the file."""
        digest = sha256 or sha256_file(path)
        if digest in self._memory:
            self.hits += 1
            return self._memory[digest]
        cached = self._path(digest)
        try:
            data = json.loads(cached.read_text(encoding="utf-8"))
            if "by_name" not in data:  # written before .rodata was read: read the file again
                raise FileNotFoundError(cached)
            info = ElfInfo.from_json(data)
        except FileNotFoundError:
            pass
        except (OSError, ValueError, KeyError, TypeError) as exc:
            # A corrupt or foreign entry is re-read, never trusted.
            log.warning("ignoring unreadable cache entry %s: %s", cached, exc)
        else:
            self.hits += 1
            self._memory[digest] = info
            return info
        self.misses += 1
        info = read_elf(path, digest)
        self._memory[digest] = info
        self._store(cached, info)
        return info

    def _store(self, target: Path, info: ElfInfo) -> None:
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as fh:
                    json.dump(info.to_json(), fh, separators=(",", ":"))
                os.replace(tmp, target)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        except OSError as exc:
            # A read-only or full cache makes the check slower, not wrong.
            log.warning("cannot write cache entry %s: %s", target, exc)
