"""The fork server's memory in 2 MiB pages (fork/pages.py), asked of this machine's real kernel."""

from __future__ import annotations

import ctypes
import hashlib
import mmap
import platform
from collections.abc import Iterator

import pytest

from compatlab.incell.fork.pages import Collapser

_MIB = 1 << 20


def _kernel_has_collapse() -> bool:
    major, minor = (int(p) for p in platform.release().split(".")[:2])
    return platform.system() == "Linux" and (major, minor) >= (6, 1)


def _thp_always() -> bool:
    """The system gives 2 MiB pages by itself (``always``): memory written here is huge before anyone asks."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled", encoding="ascii") as setting:
            return "[always]" in setting.read()
    except OSError:
        return False


def _anon_huge_kib(address: int) -> int:
    """AnonHugePages of the mapping that holds *address* (/proc/self/smaps)."""
    inside = False
    with open("/proc/self/smaps", encoding="ascii", errors="replace") as smaps:
        for line in smaps:
            first = line.split()[0]
            if "-" in first and not first.endswith(":"):
                low, high = (int(b, 16) for b in first.split("-"))
                inside = low <= address < high
            elif inside and first == "AnonHugePages:":
                return int(line.split()[1])
    return 0


def _address(memory: mmap.mmap) -> int:
    view = ctypes.c_char.from_buffer(memory)
    address = ctypes.addressof(view)
    del view  # the mapping can be closed again
    return address


@pytest.fixture
def region() -> Iterator[tuple[mmap.mmap, int]]:
    """16 MiB of private anonymous memory, every page written (so in 4 KiB pages: nothing asked for more)."""
    if _thp_always():
        pytest.skip("this machine's transparent huge pages are 'always': its memory is in 2 MiB pages already")
    memory = mmap.mmap(-1, 16 * _MIB, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    for offset in range(0, len(memory), 4096):
        memory[offset : offset + 8] = offset.to_bytes(8, "little")
    yield memory, _address(memory)
    memory.close()


@pytest.mark.skipif(not _kernel_has_collapse(), reason="MADV_COLLAPSE needs Linux 6.1 or later")
def test_private_anonymous_memory_goes_into_2_mib_pages_with_its_contents_kept(
    region: tuple[mmap.mmap, int],
) -> None:
    memory, address = region
    before = hashlib.sha256(memory).hexdigest()
    assert _anon_huge_kib(address) == 0  # the machine's setting (madvise) gave it none by itself
    pages = Collapser()
    pages.collapse()
    # At least the 2 MiB-aligned stretches wholly inside the 16 MiB: 14 MiB of them.
    assert _anon_huge_kib(address) >= 14 * 1024
    assert pages.done >= 14 * _MIB
    assert hashlib.sha256(memory).hexdigest() == before


@pytest.mark.skipif(not _kernel_has_collapse(), reason="MADV_COLLAPSE needs Linux 6.1 or later")
def test_a_stretch_is_asked_once(region: tuple[mmap.mmap, int]) -> None:
    pages = Collapser()
    asked: list[int] = []
    real = pages._madvise

    def madvise(address: int, length: int, advice: int) -> int:
        asked.append(address)
        return int(real(address, length, advice))

    pages._madvise = madvise
    pages.collapse()
    first = len(asked)
    pages.collapse()
    second = mmap.mmap(-1, 8 * _MIB, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        second.write(b"x" * len(second))
        start = _address(second)
        pages.collapse()
        assert first > 0
        assert len(asked) == len(set(asked))  # no stretch asked twice, over three calls
        huge = 2 * _MIB
        inside = range(-(-start // huge) * huge, (start + len(second)) // huge * huge, huge)
        assert len(inside) >= 3
        assert set(inside) <= set(asked[first:])  # the new mapping's stretches, on the third call
        assert pages.done + pages.failed == len(asked) * huge
    finally:
        second.close()


def test_switched_off_it_asks_nothing(monkeypatch: pytest.MonkeyPatch, region: tuple[mmap.mmap, int]) -> None:
    monkeypatch.setenv("COMPATLAB_IMPORT_HUGEPAGES", "0")
    _memory, address = region
    pages = Collapser()
    pages.collapse()
    assert (pages.done, pages.failed) == (0, 0)
    assert _anon_huge_kib(address) == 0


@pytest.mark.skipif(not _kernel_has_collapse(), reason="MADV_COLLAPSE needs Linux 6.1 or later")
def test_shared_memory_is_left_alone(region: tuple[mmap.mmap, int]) -> None:
    shared = mmap.mmap(-1, 8 * _MIB, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)
    shared.write(b"s" * len(shared))
    address = _address(shared)
    try:
        pages = Collapser()
        pages.collapse()
        assert pages.done >= 14 * _MIB  # the private region beside it was collapsed
        assert _anon_huge_kib(address) == 0
    finally:
        shared.close()
