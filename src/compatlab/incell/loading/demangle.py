"""C++ symbol names demangled (Itanium ABI, ``_Z…``), as a reason says them: libstdc++'s ``__cxa_demangle``
through ctypes, ``c++filt`` where libstdc++ cannot be loaded. The static stage and serve use the same demangler.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import shutil
import subprocess
from typing import Any

__all__ = ["demangle"]


@functools.cache
def _cxa_demangle() -> Any:
    name = ctypes.util.find_library("stdc++") or "libstdc++.so.6"
    try:
        lib = ctypes.CDLL(name)
        func = lib.__cxa_demangle
    except (OSError, AttributeError):
        return None
    func.restype = ctypes.c_void_p
    func.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_int)]
    return func


@functools.cache
def _free() -> Any:
    free = ctypes.CDLL(None).free
    free.argtypes = [ctypes.c_void_p]
    free.restype = None
    return free


def demangle(symbol: str) -> str | None:
    """Demangle an Itanium C++ name with libstdc++'s __cxa_demangle (c++filt as fallback); None if not C++."""
    if not symbol.startswith("_Z"):
        return None
    func = _cxa_demangle()
    if func is not None:
        status = ctypes.c_int(0)
        ptr = func(symbol.encode(), None, None, ctypes.byref(status))
        if ptr and status.value == 0:
            try:
                return ctypes.string_at(ptr).decode("utf-8", "replace")
            finally:
                _free()(ptr)
        return None
    cxxfilt = shutil.which("c++filt")
    if cxxfilt is None:
        return None
    try:
        out = subprocess.run([cxxfilt, symbol], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = out.stdout.strip()
    return text if text and text != symbol else None
