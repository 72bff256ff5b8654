"""The fork server's own memory in 2 MiB pages, so that a child costs less to fork and to end.

Forking copies the page tables of the server's private memory and takes a reference on every page of it; the
child's exit drops them again. A server that has imported torch and the packages it adopted holds about 1 GiB
in 4 KiB pages: 14-15 ms a fork and 32-34 ms from the fork to the child reaped before it loads anything
(benchmarks/bench_fork.py, sglang 0.5.23's interpreter, 2 cores). In 2 MiB pages there are 512 times fewer
entries: 3-4 ms and 10-11 ms.

Linux's ``MADV_COLLAPSE`` (6.1 and later) turns what is already mapped into 2 MiB pages in place, also where
the system's transparent-huge-page setting is ``madvise`` (most machines), where nothing else would. Only the
server's private anonymous memory (the heap and anonymous mappings: Python's objects, torch's and NumPy's
buffers) is asked, each 2 MiB-aligned stretch once; the contents, the addresses and the mappings stay what
they were, so what a child sees and maps is the same. Where the kernel cannot (an older kernel, memory it will
not move), the call fails and the pages stay as they were: the children cost what they did.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

__all__ = ["Collapser"]

_MADV_COLLAPSE = 25  # linux/mman.h
_HUGE = 2 << 20  # the x86-64 and arm64 (4 KiB base pages) PMD size


class Collapser:
    """Asks the kernel for 2 MiB pages over the process's private anonymous memory, a stretch once: what
    ``collapse`` made huge and what it could not, in bytes, summed over its calls. Off (asks nothing) where
    $COMPATLAB_IMPORT_HUGEPAGES is ``0`` or the machine is not Linux."""

    def __init__(self) -> None:
        self.done = 0  # bytes now in 2 MiB pages, by this process's asking
        self.failed = 0  # bytes the kernel would not collapse
        self._asked: set[int] = set()  # stretches asked already (their start addresses)
        self._madvise: Any = None  # libc's madvise, where it is asked
        if os.environ.get("COMPATLAB_IMPORT_HUGEPAGES", "") != "0" and os.path.exists("/proc/self/maps"):
            try:
                madvise = ctypes.CDLL(None, use_errno=True).madvise
            except (OSError, AttributeError):
                return
            madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
            madvise.restype = ctypes.c_int
            self._madvise = madvise

    def collapse(self) -> None:
        """Every 2 MiB stretch of private anonymous memory not asked before, asked now."""
        if self._madvise is None:
            return
        try:
            with open("/proc/self/maps", encoding="ascii", errors="replace") as maps:
                regions = maps.read().splitlines()
        except OSError:
            return
        for line in regions:
            parts = line.split()
            # address perms offset dev inode [path]: private read-write memory with no file behind it
            if len(parts) < 5 or not parts[1].startswith("rw") or parts[1][3:4] != "p":
                continue
            if len(parts) > 5 and parts[5] != "[heap]":
                continue  # a file's pages, the stack, [vvar] and the like are left alone
            low, high = (int(bound, 16) for bound in parts[0].split("-"))
            first = -(-low // _HUGE) * _HUGE
            for stretch in range(first, high // _HUGE * _HUGE, _HUGE):
                if stretch in self._asked:
                    continue
                self._asked.add(stretch)
                if self._madvise(stretch, _HUGE, _MADV_COLLAPSE) == 0:
                    self.done += _HUGE
                else:  # EINVAL on a kernel without it; EAGAIN, ENOMEM: not now (each about a microsecond)
                    self.failed += _HUGE
