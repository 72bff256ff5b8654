"""CUDA fatbinaries embedded in ELF files: which GPU code a module carries, read without cuobjdump.

A fatbin section (``.nv_fatbin``, or ``__nv_relfatbin`` for relocatable device code) holds one or more
containers, one per translation unit. Container header (16 bytes, little-endian)::

    u32 magic 0xBA55ED50 | u16 version (1) | u16 header size (16) | u64 size of the entries that follow

Each entry: a header of at least 64 bytes, then its payload (PTX text or a cubin, often compressed)::

    0  u16 kind (1 = PTX, 2 = ELF cubin)   4  u32 entry header size (64, 80, 96, 112 …)
    8  u64 payload size (padded)           24 u16 minor, u16 major code version
    28 u32 arch (90 = sm_90, 120 = sm_120) 40 u64 flags

Flags measured with nvcc 13.0 (``-gencode`` for sm_90, sm_90a, sm_100a, sm_100f, sm_120a):
0x100000 marks an arch-specific ('a') target and 0x200000 a family-specific ('f') one; 0x1 is 64-bit,
0x10 Linux, 0x8000 a compressed payload. Only headers are read, so payloads are never decompressed.
"""

from __future__ import annotations

import dataclasses
import logging
import mmap
import re
import struct
from collections.abc import Iterable, Sequence

from compatlab.incell import cudacompat
from compatlab.incell.loading.elf import FATBIN_SECTIONS

__all__ = [
    "FATBIN_MAGIC",
    "FATBIN_SECTIONS",
    "Coverage",
    "FatbinError",
    "GpuCode",
    "coverage",
    "parse_arch",
    "parse_fatbin",
    "runs_on",
]

log = logging.getLogger(__name__)

FATBIN_MAGIC = 0xBA55ED50
_MAGIC_BYTES = struct.pack("<I", FATBIN_MAGIC)

KIND_PTX = 1
KIND_ELF = 2
_FLAG_ARCH_SPECIFIC = 0x100000
_FLAG_FAMILY_SPECIFIC = 0x200000
_CONTAINER = struct.Struct("<IHHQ")
_ENTRY = struct.Struct("<HHIQ")  # kind, unknown, header size, payload size
_ENTRY_MIN = 64

_ARCH_RE = re.compile(r"^(sm|compute)_(\d+)([af]?)$")


class FatbinError(ValueError):
    """A fatbin that cannot be read (truncated or corrupt)."""


@dataclasses.dataclass(frozen=True, order=True, slots=True)
class GpuCode:
    """One fatbin entry: a cubin (``sm_90a``) or PTX (``compute_90``)."""

    ptx: bool
    arch: int  # 90 for sm_90, 120 for sm_120
    variant: str = ""  # "", "a" (arch-specific) or "f" (family-specific)

    def __str__(self) -> str:
        return f"{'compute' if self.ptx else 'sm'}_{self.arch}{self.variant}"

    @classmethod
    def parse(cls, text: str) -> GpuCode:
        m = _ARCH_RE.match(text)
        if not m:
            raise ValueError(f"not a GPU code name: {text!r}")
        return cls(ptx=m.group(1) == "compute", arch=int(m.group(2)), variant=m.group(3))


def parse_arch(text: str) -> int:
    """Device arch of a target name: ``sm_90``, ``sm_90a`` and ``90`` are all 90 (incell.cudacompat's parser)."""
    try:
        arch = cudacompat.parse_arch(text)
    except ValueError:
        arch = None
    if arch is None or arch.kind != "sm":
        raise ValueError(f"expected a GPU arch like 'sm_90' or 'sm_120', got {text!r}")
    return arch.major * 10 + arch.minor


def runs_on(code: GpuCode, device: int) -> bool:
    """Whether *code* can run on a device of compute capability *device* (90 = 9.0).

    The rule is incell.cudacompat's, which the cuda stage applies to torch's arch list: a cubin sm_XY runs
    on devices of major X and minor >= Y; an 'a' cubin only on exactly XY; an 'f' cubin on its family.
    PTX is JIT-compiled for its arch and any newer one, except arch- and family-specific PTX.
    """
    arch = cudacompat.Arch(
        kind="compute" if code.ptx else "sm", major=code.arch // 10, minor=code.arch % 10, suffix=code.variant
    )
    return cudacompat.runs_on_device(arch, divmod(device, 10))


def _entries(buf: mmap.mmap | bytes, start: int, end: int) -> Iterable[list[GpuCode]]:
    """Containers between *start* and *end* of *buf*, each a list of its entries."""
    pos = buf.find(_MAGIC_BYTES, start, end)
    while pos >= 0 and pos + _CONTAINER.size <= end:
        magic, _version, hsize, fsize = _CONTAINER.unpack_from(buf, pos)
        if magic != FATBIN_MAGIC or hsize < _CONTAINER.size:
            pos = buf.find(_MAGIC_BYTES, pos + 4, end)
            continue
        cend = pos + hsize + fsize
        if cend > end:
            raise FatbinError(f"fatbin container at {pos:#x} runs past its section ({cend:#x} > {end:#x})")
        codes: list[GpuCode] = []
        e = pos + hsize
        while e + _ENTRY_MIN <= cend:
            kind, _unk, ehsize, psize = _ENTRY.unpack_from(buf, e)
            if ehsize < _ENTRY_MIN:
                raise FatbinError(f"fatbin entry at {e:#x} has a header of {ehsize} bytes")
            (arch,) = struct.unpack_from("<I", buf, e + 28)
            (flags,) = struct.unpack_from("<Q", buf, e + 40)
            variant = "a" if flags & _FLAG_ARCH_SPECIFIC else "f" if flags & _FLAG_FAMILY_SPECIFIC else ""
            if kind in (KIND_PTX, KIND_ELF):
                codes.append(GpuCode(ptx=kind == KIND_PTX, arch=arch, variant=variant))
            else:
                log.debug("fatbin entry kind %#x at %#x skipped", kind, e)
            e += ehsize + psize
        yield codes
        pos = buf.find(_MAGIC_BYTES, cend, end)


def parse_fatbin(buf: mmap.mmap | bytes, ranges: Sequence[tuple[int, int]] = ()) -> list[list[str]]:
    """GPU code of every non-empty container in *buf* (within the (offset, size) *ranges*).

    Returns one sorted list of names (``sm_90a``, ``compute_90``) per container: a small, JSON-ready shape
    that the ELF cache stores.
    """
    out: list[list[str]] = []
    for offset, size in ranges or [(0, len(buf))]:
        for codes in _entries(buf, offset, offset + size):
            if codes:
                out.append(sorted({str(c) for c in codes}))
    return out


@dataclasses.dataclass(frozen=True, slots=True)
class Coverage:
    """How a module's GPU code covers one device arch."""

    device: int
    covered: bool  # some code in the module runs on the device
    containers: int  # containers with code
    uncovered: int  # containers with no code for the device
    cubins: tuple[str, ...]
    ptx: tuple[str, ...]

    def describe(self) -> str:
        """``no kernel image for sm_120 (has sm_90a, sm_100a; PTX none)``."""
        ptx = ", ".join(self.ptx) or "none"
        has = ", ".join(self.cubins) or "no cubins"
        return f"no kernel image for sm_{self.device} (has {has}; PTX {ptx})"


def _arch_key(name: str) -> tuple[int, str]:
    code = GpuCode.parse(name)
    return code.arch, code.variant


def coverage(containers: Sequence[Sequence[str]], device: int) -> Coverage:
    """Coverage of *device* by a module's containers (as :func:`parse_fatbin` returns them)."""
    codes = {name: GpuCode.parse(name) for c in containers for name in c}
    uncovered = sum(1 for c in containers if not any(runs_on(codes[n], device) for n in c))
    cubins = sorted((n for n, c in codes.items() if not c.ptx), key=_arch_key)
    ptx = sorted((n for n, c in codes.items() if c.ptx), key=_arch_key)
    return Coverage(
        device=device,
        covered=any(runs_on(c, device) for c in codes.values()),
        containers=len(containers),
        uncovered=uncovered,
        cubins=tuple(cubins),
        ptx=tuple(ptx),
    )
