"""The CUDA driver the import stage loads the modules against: the machine's, or a stand-in.

With no NVIDIA driver on the machine (``fakecuda.real_driver()`` finds none), a stand-in ``libcuda.so.1``
(fakecuda) exports the driver symbols the stack's ELF files import and answers every call
CUDA_ERROR_NO_DEVICE, so a module links as it would on a GPU box and an ABI break still shows. A load that
fails on an undefined ``cu…`` symbol the stand-in lacked grows it by that symbol (a rebuild into the cache:
a new ``LD_LIBRARY_PATH``), and the load is tried again; a symbol of another shape is the stack's.
"""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path

from compatlab.incell import fakecuda

__all__ = ["Driver"]

_DRIVER_SYMBOL = re.compile(r"^cu[A-Z][A-Za-z0-9_]*$")


class Driver:
    """The real driver, or a stand-in grown on demand with the driver symbols the modules import."""

    def __init__(self, work_dir: str | None, elf_files: list[str]) -> None:
        self.cache = fakecuda.cache_dir(work_dir)
        self.real = fakecuda.real_driver()
        self.problem = ""
        self.lib_dir: Path | None = None
        self.symbols: set[str] = set()
        self._lock = threading.Lock()
        if self.real is None:
            self.symbols = fakecuda.driver_symbols(elf_files)
            self._build()

    def _build(self) -> None:
        try:
            self.lib_dir = fakecuda.build_stand_in(self.symbols, self.cache)
        except fakecuda.StandInError as exc:
            self.problem, self.lib_dir = str(exc), None

    def add(self, symbol: str) -> bool:
        """Grow the stand-in by one symbol it lacked; False when that cannot help."""
        with self._lock:
            if symbol in self.symbols:
                return True  # another load added it meanwhile
            if self.lib_dir is None or not _DRIVER_SYMBOL.match(symbol):
                return False
            self.symbols.add(symbol)
            self._build()
            return self.lib_dir is not None

    def env(self) -> dict[str, str]:
        base = dict(os.environ)
        return fakecuda.stand_in_env(self.lib_dir, base) if self.lib_dir is not None else base

    def describe(self) -> str:
        if self.real is not None:
            return f"real ({self.real})"
        if self.lib_dir is not None:
            return fakecuda.STAND_IN
        return f"none ({self.problem})"
