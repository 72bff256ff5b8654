"""ELF shared objects: what a file needs and offers at load time, read once per content hash.

Headers and the dynamic section come from pyelftools; the dynamic symbol table is unpacked with
:mod:`struct` because pyelftools builds one object per symbol: libtorch_cpu.so's 79k symbols take 2.4 s
through pyelftools, 0.19 s through ``nm -D`` and 0.13 s this way, with no binutils needed on the machine.

The files are strangers' (any wheel on an index), so reading one is bounded work:

- only a regular file is opened (a FIFO named ``x.so`` would block ``open`` forever), without following
  it if it changes while it is read;
- the section header table and every section read must lie inside the file, and no section read into
  memory may exceed ``MAX_SECTION_BYTES`` (a header claiming 900 GiB is refused, never allocated);
- symbol versions (``.gnu.version_r``: Elf_Verneed ``vn_version u16, vn_cnt u16, vn_file u32, vn_aux u32,
  vn_next u32`` each followed by ``vn_cnt`` Elf_Vernaux ``vna_hash u32, vna_flags u16, vna_other u16,
  vna_name u32, vna_next u32``; ``.gnu.version_d``: Elf_Verdef ``vd_version u16, vd_flags u16, vd_ndx u16,
  vd_cnt u16, vd_hash u32, vd_aux u32, vd_next u32`` and Elf_Verdaux ``vda_name u32, vda_next u32``) are
  walked here, not by pyelftools: a ``next`` of 0 ends a chain, every entry must lie inside its section,
  and an offset seen twice is a loop (pyelftools trusts ``sh_info``, so one edited count made it walk
  4 billion entries with growing memory);
- the whole parse runs under a wall-clock deadline (``PARSE_SECONDS``).

Whatever fails any of these raises NotElf with a one-line reason; the static stage reports the module as
``cannot read: …``, never as a pass.

The cache is keyed by the file's own content: the sha256 of its bytes, never the hash RECORD claims (a
file changed after install would reuse another environment's verdict). Hashing is skipped only for a file
already hashed whose identity and stat are unchanged: device, inode, size, mtime and ctime (uv installs
by hard link, so one torch build is hashed once per machine, not once per cell).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import json
import logging
import mmap
import multiprocessing
import os
import re
import stat
import struct
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from compatlab.errors import LabError
from compatlab.incell.files import is_elf
from compatlab.proc import default_cache_dir
from compatlab.stages.static.fatbin import FATBIN_SECTIONS, FatbinError, parse_fatbin

__all__ = [
    "CACHE_SCHEMA",
    "MAX_SECTION_BYTES",
    "PARSE_SECONDS",
    "ElfCache",
    "ElfInfo",
    "NotElf",
    "UndefinedSymbol",
    "default_cache_dir",
    "demangle",
    "is_elf",
    "open_regular",
    "read_elf",
    "sha256_file",
]

log = logging.getLogger(__name__)

# Bump when ElfInfo's shape or meaning changes: old cache entries are then ignored, never misread.
# 2: entries are keyed by the file's own sha256 (1 trusted RECORD's hash).
CACHE_SCHEMA = 2

# Bounds on what one file may make the parser do. libtorch_cuda.so's largest section read into memory
# (.dynstr) is a few MB and its parse takes well under a second.
PARSE_SECONDS = 30.0
MAX_SECTION_BYTES = 256 << 20
_MAX_SECTIONS = 1 << 16

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
        fields["undefined"] = [UndefinedSymbol(str(n), str(v), str(lib), bool(w)) for n, v, lib, w in data["undefined"]]
        return cls(**fields)


def open_regular(path: Path | str) -> IO[bytes]:
    """*path* opened for reading if it is a regular file (symlinks followed); NotElf for anything else.

    Opened with O_NONBLOCK, then checked with fstat: ``open`` of a FIFO without a writer never returns.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise NotElf(f"{path}: cannot read: {exc.strerror}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = "a FIFO" if stat.S_ISFIFO(mode) else "a directory" if stat.S_ISDIR(mode) else "a device or socket"
            raise NotElf(f"{path}: cannot read: {kind}, not a regular file")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def sha256_file(path: Path) -> str:
    """Hex sha256 of a regular file's content (NotElf for a FIFO, a device or a directory)."""
    with open_regular(path) as fh:
        return _sha256_fh(fh, os.fstat(fh.fileno()).st_size)


def _sha256_fh(fh: IO[bytes], size: int) -> str:
    """Hex sha256 of the first *size* bytes of *fh* (a file that grows while hashed adds nothing)."""
    h = hashlib.sha256()
    fh.seek(0)
    left = size
    while left > 0 and (chunk := fh.read(min(left, 1 << 20))):
        h.update(chunk)
        left -= len(chunk)
    return h.hexdigest()


def demangle(name: str) -> str:
    """Demangle a C++ symbol with libstdc++'s __cxa_demangle; other names unchanged.

    The same demangler as the import stage's (incell/loading/demangle.py, which runs inside cells, with the
    stdlib only), so the static and import reasons name a symbol identically.
    """
    from compatlab.incell.loading.demangle import demangle as cxa_demangle

    return cxa_demangle(name) or name


def _iter_dynamic(elf: Any) -> Iterator[tuple[str, Any]]:
    from elftools.elf.dynamic import DynamicSection

    for section in elf.iter_sections():
        if isinstance(section, DynamicSection):
            for tag in section.iter_tags():
                yield str(tag.entry.d_tag), tag
            return


class _Damaged(ValueError):
    """What makes a file unreadable, in words; read_elf turns it into NotElf naming the file."""


class _Deadline:
    """A wall-clock budget for one parse; ``check`` raises NotElf once it is spent."""

    def __init__(self, path: Path | str, seconds: float) -> None:
        self.path, self.seconds = path, seconds
        self.end = time.monotonic() + seconds

    def check(self) -> None:
        if time.monotonic() > self.end:
            raise _Damaged(f"parsing took longer than {self.seconds:g} s")


def read_elf(path: Path, sha256: str = "", *, seconds: float = PARSE_SECONDS) -> ElfInfo:
    """Read *path*'s dynamic interface and embedded GPU code. Raises NotElf for anything else.

    Bounded: a regular file only, sections inside the file and at most MAX_SECTION_BYTES each, version
    chains walked at most once per entry, *seconds* of wall clock in all.
    """
    with open_regular(path) as fh:
        return _read_file(path, fh, sha256, seconds=seconds)


def _read_file(path: Path | str, fh: IO[bytes], sha256: str, *, seconds: float) -> ElfInfo:
    from elftools.elf.elffile import ELFFile

    if fh.read(4) != b"\x7fELF":
        raise NotElf(f"{path}: not a readable ELF file (no ELF magic)")
    fh.seek(0)
    size = os.fstat(fh.fileno()).st_size
    deadline = _Deadline(path, seconds)
    try:
        elf = ELFFile(fh)
        _check_layout(elf, size)
        return _read(elf, fh, sha256, size=size, deadline=deadline)
    except _Damaged as exc:
        raise NotElf(f"{path}: cannot read: {exc}") from None
    except MemoryError:
        raise NotElf(f"{path}: cannot read: it needs more memory than this machine has") from None
    except Exception as exc:  # noqa: BLE001  pyelftools raises many types on a damaged file: each is "cannot read"
        raise NotElf(f"{path}: cannot read: {type(exc).__name__}: {str(exc)[:300]}") from None


def _check_layout(elf: Any, size: int) -> None:
    """Every section inside the file: a damaged header must not make a read allocate what it claims."""
    n = elf.num_sections()
    shoff, shentsize = elf["e_shoff"], elf["e_shentsize"]
    if n > _MAX_SECTIONS or (n and (shentsize < 40 or shoff + n * shentsize > size)):
        raise _Damaged(
            f"the section header table ({n} entries of {shentsize} bytes at offset "
            f"{shoff}) does not fit in the {size}-byte file"
        )
    for i in range(n):
        header = elf._get_section_header(i)
        if header["sh_type"] != "SHT_NOBITS" and header["sh_offset"] + header["sh_size"] > size:
            raise _Damaged(
                f"section {i} claims {header['sh_size']} bytes at offset "
                f"{header['sh_offset']}, past the end of the {size}-byte file"
            )


def _read(elf: Any, fh: Any, sha256: str, *, size: int, deadline: _Deadline) -> ElfInfo:
    info = ElfInfo(sha256=sha256, elf_class=int(elf.elfclass), machine=str(elf["e_machine"]))
    has_dynamic = any(seg["p_type"] == "PT_DYNAMIC" for seg in _iter_segment_headers(elf, size))
    found_dynamic = False
    for tag, entry in _iter_dynamic(elf):
        found_dynamic = True
        deadline.check()
        if tag == "DT_NEEDED":
            info.needed.append(str(entry.needed))
        elif tag == "DT_SONAME":
            info.soname = str(entry.soname)
        elif tag == "DT_RPATH":
            info.rpath.extend(p for p in str(entry.rpath).split(":") if p)
        elif tag == "DT_RUNPATH":
            info.runpath.extend(p for p in str(entry.runpath).split(":") if p)

    if has_dynamic and not found_dynamic:
        # ld.so loads through the program headers; without the section this reading would see an object
        # that needs and lacks nothing: a silent pass.
        raise _Damaged("it has a PT_DYNAMIC segment but no dynamic section (section headers stripped or damaged)")

    # Version indexes used by .gnu.version: defined versions and (file, version) pairs needed.
    index: dict[int, tuple[str, str]] = {}  # index -> (version, file it is needed from or "")
    dynsym = versym = None
    fat_ranges: list[tuple[int, int]] = []
    rodata: tuple[int, int] | None = None
    for section in elf.iter_sections():
        deadline.check()
        stype = section["sh_type"]
        if stype == "SHT_GNU_verdef":
            strtab = _section_bytes(fh, elf.get_section(section["sh_link"]))
            for flags, ndx, names in _verdefs(elf, _section_bytes(fh, section), section["sh_info"], deadline):
                if names and not flags & _VER_FLG_BASE:
                    name = _cstr(strtab, names[0])
                    index[ndx] = (name, "")
                    info.version_defs.append(name)
        elif stype == "SHT_GNU_verneed":
            strtab = _section_bytes(fh, elf.get_section(section["sh_link"]))
            for file_off, aux in _verneeds(elf, _section_bytes(fh, section), section["sh_info"], deadline):
                file = _cstr(strtab, file_off)
                wanted = info.version_needs.setdefault(file, [])
                for other, name_off in aux:
                    name = _cstr(strtab, name_off)
                    index[other] = (name, file)
                    wanted.append(name)
        elif stype == "SHT_DYNSYM":
            dynsym = section
        elif stype == "SHT_GNU_versym":
            versym = section
        elif section.name in FATBIN_SECTIONS and stype != "SHT_NOBITS" and section["sh_size"]:
            fat_ranges.append((section["sh_offset"], section["sh_size"]))
        elif section.name == ".rodata" and stype != "SHT_NOBITS" and section["sh_size"]:
            rodata = (section["sh_offset"], section["sh_size"])

    if dynsym is not None and dynsym["sh_size"]:
        _read_dynsym(elf, fh, dynsym, versym=versym, index=index, info=info, deadline=deadline)
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


def _iter_segment_headers(elf: Any, size: int) -> Iterator[Any]:
    n, phoff, phentsize = elf.num_segments(), elf["e_phoff"], elf["e_phentsize"]
    if n and (phentsize < 32 or phoff + n * phentsize > size):
        raise _Damaged(
            f"the program header table ({n} entries of {phentsize} bytes at offset "
            f"{phoff}) does not fit in the {size}-byte file"
        )
    for i in range(n):
        yield elf._get_segment_header(i)


def _section_bytes(fh: Any, section: Any) -> bytes:
    """A section's bytes: inside the file (checked by _check_layout) and at most MAX_SECTION_BYTES."""
    if section["sh_type"] == "SHT_NOBITS":
        return b""
    if section["sh_size"] > MAX_SECTION_BYTES:
        raise _Damaged(
            f"section {section.name or '?'} is {section['sh_size']} bytes, over the "
            f"{MAX_SECTION_BYTES >> 20} MiB this lab reads of one section"
        )
    fh.seek(section["sh_offset"])
    data: bytes = fh.read(section["sh_size"])
    return data


def _cstr(strtab: bytes, offset: int) -> str:
    end = strtab.find(b"\0", offset)
    if offset >= len(strtab) or end < 0:
        raise _Damaged(f"a string at offset {offset} runs past its string table")
    return strtab[offset:end].decode("utf-8", "replace")


def _walk(
    data: bytes, first: int, count: int, deadline: _Deadline, *, what: str, fmt: struct.Struct, next_field: int
) -> Iterator[tuple[int, tuple[int, ...]]]:
    """(offset, fields) of each *fmt* entry of a version chain in *data*: at most *count* entries.

    An entry whose ``next`` field is 0 ends the chain; an offset seen twice (a loop) or an entry outside
    the section is damage, not an end.
    """
    seen: set[int] = set()
    at = first
    for _ in range(count):
        deadline.check()
        if at in seen:
            raise _Damaged(f"the {what} chain loops back to offset {at}")
        if at < 0 or at + fmt.size > len(data):
            raise _Damaged(f"the {what} chain leaves its section (offset {at} of {len(data)} bytes)")
        seen.add(at)
        fields = fmt.unpack_from(data, at)
        yield at, fields
        if not fields[next_field]:
            return
        at += fields[next_field]


def _verneeds(elf: Any, data: bytes, count: int, deadline: _Deadline) -> Iterator[tuple[int, list[tuple[int, int]]]]:
    """(file name offset, [(version index, version name offset)]) of each Elf_Verneed."""
    e = "<" if elf.little_endian else ">"
    need, aux = struct.Struct(e + "HHIII"), struct.Struct(e + "IHHII")
    # No more entries than fit in the section: sh_info and vn_cnt are only claims.
    needs = _walk(data, 0, min(count, len(data) // need.size), deadline, what="version-needed", fmt=need, next_field=4)
    for at, (_v, cnt, file_off, aux_off, _n) in needs:
        auxes = _walk(
            data,
            at + aux_off,
            min(cnt, len(data) // aux.size),
            deadline,
            what="version-needed aux",
            fmt=aux,
            next_field=4,
        )
        yield file_off, [(other, name) for _a, (_h, _f, other, name, _n) in auxes]


def _verdefs(elf: Any, data: bytes, count: int, deadline: _Deadline) -> Iterator[tuple[int, int, list[int]]]:
    """(flags, version index, [name offsets]) of each Elf_Verdef."""
    e = "<" if elf.little_endian else ">"
    vdef, aux = struct.Struct(e + "HHHHIII"), struct.Struct(e + "II")
    defs = _walk(
        data, 0, min(count, len(data) // vdef.size), deadline, what="version-definition", fmt=vdef, next_field=6
    )
    for at, (_v, flags, ndx, cnt, _h, aux_off, _n) in defs:
        auxes = _walk(
            data,
            at + aux_off,
            min(cnt, len(data) // aux.size),
            deadline,
            what="version-definition aux",
            fmt=aux,
            next_field=1,
        )
        yield flags, ndx, [name for _a, (name, _n) in auxes]


def _read_dynsym(
    elf: Any,
    fh: Any,
    dynsym: Any,
    *,
    versym: Any,
    index: dict[int, tuple[str, str]],
    info: ElfInfo,
    deadline: _Deadline,
) -> None:
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
        if not i & 0xFFF:
            deadline.check()
        bind = sym[info_i] >> 4
        if bind not in (_STB_GLOBAL, _STB_WEAK, _STB_GNU_UNIQUE):
            continue
        name = _cstr(strtab, sym[name_i])
        if not name:
            continue
        vidx = (versions[i] & ~_VERSYM_HIDDEN) if i < len(versions) else 0
        version, library = index.get(vidx, ("", ""))
        if sym[shndx_i] == _SHN_UNDEF:
            info.undefined.append(UndefinedSymbol(name, version, library, bind == _STB_WEAK))
        else:
            defined.setdefault(name, []).append(version)


def _prefetch_one(job: tuple[str, float, str]) -> tuple[tuple[int, ...], ElfInfo, bool] | None:
    """A prefetch worker's file: read through a cache of its own over the same folder (so it is stored there
    too); its stat key, its ElfInfo, and whether it was parsed (not found in the cache on disk)."""
    root, seconds, path = job
    cache = ElfCache(Path(root).parent, seconds=seconds)
    try:
        info = cache.load(Path(path))
        st = os.stat(path, follow_symlinks=False)
    except Exception:  # noqa: BLE001  whatever it was, load() in the stage meets it again and says it
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns), info, cache.misses > 0


class ElfCache:
    """ElfInfo by the file's content hash: on disk (one JSON file per hash, written atomically) and in memory.

    A matrix re-reads torch's symbol tables once per unique torch build, not once per cell. The key is the
    sha256 of the bytes on disk, never a hash from RECORD; a file's hash is remembered by its identity and
    stat (device, inode, size, mtime, ctime) in memory and under ``stat/`` in the cache, so a file hard-linked
    into many venvs is hashed once. A file that cannot be read is remembered as such for this object's life.
    """

    def __init__(self, root: Path | None = None, *, seconds: float = PARSE_SECONDS) -> None:
        self.root = (root or default_cache_dir()) / f"elf-v{CACHE_SCHEMA}"
        self.seconds = seconds
        self._memory: dict[str, ElfInfo] = {}
        self._digests: dict[tuple[int, ...], str] = {}
        self._unreadable: dict[tuple[int, ...], NotElf] = {}
        self._parsed_elsewhere: set[str] = set()  # read by a prefetch worker, not yet asked of load()
        self.hits = 0  # served from disk or memory
        self.misses = 0  # read from the ELF file
        self.read_only = False  # set once a write failed: the cache is then read, never written

    def _path(self, digest: str) -> Path:
        return self.root / digest[:2] / f"{digest}.json"

    def _stat_path(self, key: tuple[int, ...]) -> Path:
        name = hashlib.sha256(repr(key).encode()).hexdigest()
        return self.root / "stat" / name[:2] / name

    def load(self, path: Path, sha256: str | None = None) -> ElfInfo:
        """ElfInfo of *path*, a regular file; NotElf for anything that cannot be read.

        *sha256* is ignored: kept so that callers passing RECORD's hash still work, but what RECORD says is
        never the key (the file on disk may differ from it).
        """
        del sha256
        with open_regular(path) as fh:
            st = os.fstat(fh.fileno())
            key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
            if key in self._unreadable:
                raise self._unreadable[key]
            digest = self._digests.get(key) or self._known_digest(key)
            if digest is None:
                digest = _sha256_fh(fh, st.st_size)
                self._remember_digest(key, digest)
            self._digests[key] = digest
            info = self._lookup(digest)
            if info is not None:
                return info
            self.misses += 1
            fh.seek(0)
            try:
                info = _read_file(path, fh, digest, seconds=self.seconds)
                after = os.fstat(fh.fileno())
                if (after.st_size, after.st_mtime_ns) != (st.st_size, st.st_mtime_ns):
                    raise NotElf(f"{path}: cannot read: it changed while it was read")
            except NotElf as exc:
                self._unreadable[key] = exc
                raise
        self._memory[digest] = info
        self._store(self._path(digest), info)
        return info

    def prefetch(self, paths: Sequence[Path], jobs: int) -> int:
        """Read the files of *paths* that this cache has never seen (by stat), ``jobs`` processes at a time,
        largest first: ``load`` then answers them from memory, as it answers a file it read itself. Returns
        how many were read. A file a worker could not read is left to ``load``, which reads it again and says
        why; a pool that cannot start leaves every file to it. This is only speed: the answers are the same."""
        todo: list[tuple[int, str]] = []
        for path in paths:
            try:
                st = os.stat(path, follow_symlinks=False)
            except OSError:
                continue
            key: tuple[int, ...] = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
            if not stat.S_ISREG(st.st_mode) or key in self._digests:
                continue
            known = self._known_digest(key)
            if known is not None:
                self._digests[key] = known  # load() then reads its stat entry no second time
                continue
            todo.append((st.st_size, os.fspath(path)))
        if jobs < 2 or len(todo) < 2:
            return 0
        todo.sort(reverse=True)
        read = 0
        try:
            context = multiprocessing.get_context("spawn")  # the stage may run beside other threads: no fork
            with concurrent.futures.ProcessPoolExecutor(max_workers=min(jobs, len(todo)), mp_context=context) as pool:
                for got in pool.map(_prefetch_one, [(str(self.root), self.seconds, p) for _s, p in todo]):
                    if got is None:
                        continue
                    key, info, parsed = got
                    self._digests[key] = info.sha256
                    self._memory[info.sha256] = info
                    if parsed:
                        self._parsed_elsewhere.add(info.sha256)  # load() counts it a miss, not a hit
                    read += 1
        except (OSError, concurrent.futures.process.BrokenProcessPool) as exc:
            log.warning("could not read ELF files in parallel (%s): reading them one by one", exc)
        return read

    def _lookup(self, digest: str) -> ElfInfo | None:
        if digest in self._memory:
            if digest in self._parsed_elsewhere:
                self._parsed_elsewhere.discard(digest)
                self.misses += 1
            else:
                self.hits += 1
            return self._memory[digest]
        cached = self._path(digest)
        try:
            data = json.loads(cached.read_text(encoding="utf-8"))
            info = ElfInfo.from_json(data)
            if info.sha256 != digest:
                raise ValueError(f"entry is for {info.sha256}")
        except (FileNotFoundError, NotADirectoryError):
            return None
        except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
            # A corrupt or foreign entry is re-read, never trusted.
            log.warning("ignoring unreadable cache entry %s: %s", cached, exc)
            return None
        self.hits += 1
        self._memory[digest] = info
        return info

    def _known_digest(self, key: tuple[int, ...]) -> str | None:
        try:
            text = self._stat_path(key).read_text(encoding="ascii").strip()
        except (OSError, ValueError):
            return None
        return text if re.fullmatch(r"[0-9a-f]{64}", text) else None

    def _remember_digest(self, key: tuple[int, ...], digest: str) -> None:
        self._write(self._stat_path(key), digest + "\n")

    def _store(self, target: Path, info: ElfInfo) -> None:
        self._write(target, json.dumps(info.to_json(), separators=(",", ":")))

    def _write(self, target: Path, text: str) -> None:
        if self.read_only:
            return
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as fh:
                    fh.write(text)
                os.replace(tmp, target)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        except OSError as exc:
            # A read-only or full cache makes the check slower, not wrong: one warning, no more tries.
            self.read_only = True
            log.warning(
                "cannot write the ELF cache %s (%s): this run reads ELF files without storing them",
                self.root,
                exc.strerror or exc,
            )
