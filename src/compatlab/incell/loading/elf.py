"""The little of an ELF file the import stage reads: its dynamic symbols (defined and undefined), the
libraries it names as DT_NEEDED, whether it holds CUDA device code (a fat binary section), and whether it is a
Python extension module (it exports ``PyInit_<name>``) that this interpreter imports.

Only 64-bit little-endian files are read, only regular files are opened, and only sections that lie inside
the file and are at most MAX_SECTION_BYTES; anything else is "not ELF" (None), never an exception. The static
stage has the full analysis.
"""

from __future__ import annotations

import dataclasses
import importlib.machinery
import os
import re
import stat
import struct
import threading
from pathlib import Path
from typing import Any

from compatlab.incell.files import is_elf

__all__ = [
    "FATBIN_SECTIONS",
    "MAX_SECTION_BYTES",
    "DynamicSymbols",
    "dynamic_symbols",
    "importable_here",
    "is_extension_module",
    "module_basename",
]


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class DynamicSymbols:
    """Names in an ELF file's dynamic symbol table, and the libraries it names as DT_NEEDED."""

    defined: frozenset[str]
    undefined: frozenset[str]
    needed: tuple[str, ...]
    device_code: bool = False  # it has a CUDA fat binary section (.nv_fatbin, __nv_relfatbin)


_SHT_DYNAMIC, _SHT_DYNSYM, _SHT_NOBITS = 6, 11, 8
FATBIN_SECTIONS = (".nv_fatbin", "__nv_relfatbin")  # the sections that hold CUDA fat binaries
_DT_NEEDED = 1
# The most of one section read into memory: a header claiming more (900 GiB) makes the file unreadable.
MAX_SECTION_BYTES = 256 << 20


# What dynamic_symbols read with keep=True, by the file's identity and state (device, inode, size, change
# time). The import stage reads each shared object twice (the stand-in's driver symbols, then whether it is
# an extension module): 1296 reads of 702 files for sglang's environment, 1.5 s of the 2-core machine; kept,
# they cost its process 59 MiB more at most (187 MiB against 128 MiB). A file rewritten since (another size
# or change time) is read again; past _CACHED files the oldest are forgotten.
_CACHED = 4096
_read: dict[tuple[int, int, int, int], DynamicSymbols | None] = {}
_read_lock = threading.Lock()


def dynamic_symbols(path: str | os.PathLike[str], *, keep: bool = False) -> DynamicSymbols | None:
    """Read .dynsym and .dynamic of a 64-bit little-endian ELF file; None if it is not one (or is broken).

    Only a regular file is opened (O_NONBLOCK, then fstat: a FIFO named ``x.so`` would block ``open``), and
    only sections that lie inside the file and are at most MAX_SECTION_BYTES are read. A file kept before in
    this process (*keep*: the import stage, which asks of each file more than once), and not changed since,
    is not read again.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            return None
        os.set_blocking(fd, True)
    except OSError:
        os.close(fd)
        return None
    key = (st.st_dev, st.st_ino, st.st_size, st.st_ctime_ns)
    with _read_lock:
        if key in _read:
            os.close(fd)
            return _read[key]
    try:
        with os.fdopen(fd, "rb") as fh:
            found = _read_dynamic(fh, st.st_size)
    except (OSError, struct.error, ValueError, IndexError, MemoryError):
        found = None
    if keep:
        with _read_lock:
            if len(_read) >= _CACHED:
                del _read[next(iter(_read))]
            _read[key] = found
    return found


def _read_dynamic(fh: Any, size: int) -> DynamicSymbols | None:
    ident = fh.read(64)
    if len(ident) < 64 or ident[:4] != b"\x7fELF" or ident[4] != 2 or ident[5] != 1:
        return None
    shoff = struct.unpack_from("<Q", ident, 0x28)[0]
    shentsize, shnum = struct.unpack_from("<HH", ident, 0x3A)
    if shoff == 0 or shentsize < 64 or shoff + shentsize * shnum > size:
        return None
    shstrndx = struct.unpack_from("<H", ident, 0x3E)[0]
    fh.seek(shoff)
    table = fh.read(shentsize * shnum)
    sections = []
    names = []
    for i in range(shnum):
        sh_name, sh_type, _flags, _addr, offset, length, link, _info, _align, entsize = struct.unpack_from(
            "<IIQQQQIIQQ", table, i * shentsize
        )
        if sh_type != _SHT_NOBITS and offset + length > size:
            raise ValueError(f"section {i} runs past the end of the file")
        sections.append((sh_type, offset, length, link, entsize))
        names.append(sh_name)

    def read(index: int) -> bytes:
        sh_type, offset, length, _, _ = sections[index]
        if sh_type == _SHT_NOBITS:
            return b""
        if length > MAX_SECTION_BYTES:
            raise ValueError(f"section {index} is {length} bytes")
        fh.seek(offset)
        data: bytes = fh.read(length)
        return data

    def cstr(strtab: bytes, at: int) -> str:
        end = strtab.find(b"\0", at)
        return strtab[at : end if end >= 0 else len(strtab)].decode("utf-8", "replace")

    defined: set[str] = set()
    undefined: set[str] = set()
    needed: list[str] = []
    for index, (sh_type, _offset, _size, link, entsize) in enumerate(sections):
        if sh_type == _SHT_DYNSYM:
            strtab = read(link)
            data = read(index)
            step = max(entsize, 24)  # an Elf64_Sym is 24 bytes; a smaller claim is damage
            # Each symbol's name offset and section index (st_name, st_shndx), the null symbol left out;
            # a name is decoded once however many symbols share it.
            count = len(data) // step
            seen: dict[int, str] = {}
            if count > 1:  # a claim of entries larger than the section leaves none to read
                fields = struct.Struct(f"<I2xH{step - 8}x")
                for st_name, st_shndx in fields.iter_unpack(memoryview(data)[step : count * step]):
                    name = seen.get(st_name)
                    if name is None:
                        name = seen[st_name] = cstr(strtab, st_name)
                    if name:
                        (undefined if st_shndx == 0 else defined).add(name)
        elif sh_type == _SHT_DYNAMIC:
            strtab = read(link)
            data = read(index)
            for at in range(0, len(data) - 15, 16):
                tag, value = struct.unpack_from("<qQ", data, at)
                if tag == 0:
                    break
                if tag == _DT_NEEDED:
                    needed.append(cstr(strtab, value))
    shstrtab = read(shstrndx) if 0 < shstrndx < len(sections) else b""
    device_code = any(cstr(shstrtab, at) in FATBIN_SECTIONS for at in names if at < len(shstrtab))
    return DynamicSymbols(
        defined=frozenset(defined), undefined=frozenset(undefined), needed=tuple(needed), device_code=device_code
    )


def module_basename(filename: str) -> str | None:
    for suffix in sorted(importlib.machinery.EXTENSION_SUFFIXES, key=len, reverse=True):
        if filename.endswith(suffix):
            return filename[: -len(suffix)]
    # Another Python's suffix (a cell built for 3.12 read from the lab's 3.11): name.<tag>.so
    if m := re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)\.(?:cpython-[^.]+|abi3)\.so", filename):
        return m.group(1)
    return None


def is_extension_module(path: str | os.PathLike[str]) -> str | None:
    """The module name if *path* is a Python extension module (it exports ``PyInit_<name>``), else None."""
    name = Path(path).name
    base = module_basename(name)
    if base is None:
        return None
    # One module built several ways, picked by its package at import (mpi4py's MPI.mpich and MPI.openmpi
    # both define PyInit_MPI): the module is named by what comes before the first dot.
    base = base.split(".", 1)[0]
    syms = dynamic_symbols(path, keep=True)
    if syms is None:
        # Named as only an extension module is (a CPython or abi3 tag) but unreadable here (section headers
        # stripped or damaged; ld.so needs none of them): load it, so that the loader, not silence, says.
        tagged = re.search(r"\.(?:cpython-[^.]+|abi3)\.so$", name) is not None
        return base if tagged and is_elf(path) else None
    return base if f"PyInit_{base}" in syms.defined else None


def importable_here(filename: str) -> bool:
    """False for a file tagged for another CPython (``.cpython-310-x86_64-linux-gnu.so`` here in 3.11): no
    import of this interpreter takes it, by name or by a package's loader. Untagged and abi3 files are taken."""
    if not re.search(r"\.cpython-[^.]+\.so$", filename):
        return True
    return any(
        filename.endswith(suffix) for suffix in importlib.machinery.EXTENSION_SUFFIXES if suffix.startswith(".cpython-")
    )
