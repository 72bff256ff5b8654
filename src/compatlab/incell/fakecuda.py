"""A stand-in libcuda.so.1 for machines without an NVIDIA driver.

Without a driver, every CUDA extension module dies on ``libcuda.so.1: cannot open shared object file``
before the loader can show an ABI break. The stand-in exports the driver entry points the modules import
and answers every call with CUDA_ERROR_NO_DEVICE, so a CPU machine still tells an ABI break from a missing
driver. It is built at run time with the system C compiler and cached by content. It is never used where a
real driver exists (see ``real_driver``).

Standard library and compatlab.incell only: it runs inside a cell's venv.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

from compatlab.incell.loading.elf import dynamic_symbols
from compatlab.incell.proc import run

__all__ = [
    "CUDA_ERROR_NO_DEVICE",
    "NO_DRIVER",
    "STAND_IN",
    "StandInError",
    "build_stand_in",
    "cache_dir",
    "driver_symbols",
    "real_driver",
    "stand_in_env",
    "stand_in_source",
]

log = logging.getLogger(__name__)

CUDA_ERROR_NO_DEVICE = 100
STAND_IN = "stand-in (CUDA_ERROR_NO_DEVICE)"
NO_DRIVER = "no NVIDIA driver on this machine (no libcuda.so.1)"  # why the cuda stage skips where real_driver() is None
_SONAME = "libcuda.so.1"
# What a CUDA runtime or a framework asks of the driver before it can say "no device".
_USUAL = (
    "cuInit",
    "cuDriverGetVersion",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDeviceGetAttribute",
    "cuDeviceGetName",
    "cuDeviceTotalMem",
    "cuDeviceTotalMem_v2",
    "cuDeviceGetUuid",
    "cuDeviceGetUuid_v2",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease",
    "cuCtxGetCurrent",
    "cuCtxSetCurrent",
    "cuCtxGetDevice",
    "cuGetProcAddress",
    "cuGetProcAddress_v2",
    "cuGetErrorString",
    "cuGetErrorName",
    "cuGetExportTable",
    "cuModuleLoadData",
    "cuModuleGetFunction",
    "cuLaunchKernel",
)
_DRIVER_SYMBOL = re.compile(r"^cu[A-Z][A-Za-z0-9_]*$")
# Functions whose output arguments matter to callers; every other symbol becomes `return 100`.
_SPECIAL = {
    # A driver new enough for any build (CUDA 13.2), so that Python-level version gates let the import go on
    # to the symbols and libraries; every device query then answers CUDA_ERROR_NO_DEVICE.
    "cuDriverGetVersion": "int cuDriverGetVersion(int *v) { if (v) *v = 13020; return 0; }",
    "cuDeviceGetCount": "int cuDeviceGetCount(int *n) { if (n) *n = 0; return NO_DEVICE; }",
    "cuGetErrorString": (
        "int cuGetErrorString(int e, const char **s) {\n"
        '  if (s) *s = "no CUDA-capable device is detected (compatlab stand-in driver)"; return 0; }'
    ),
    "cuGetErrorName": 'int cuGetErrorName(int e, const char **s) { if (s) *s = "CUDA_ERROR_NO_DEVICE"; return 0; }',
    "cuGetProcAddress": (
        "int cuGetProcAddress(const char *sym, void **pfn, int ver, unsigned long long flags) {\n"
        "  if (pfn) *pfn = (void *)compatlab_no_device; return 0; }"
    ),
    "cuGetProcAddress_v2": (
        "int cuGetProcAddress_v2(const char *sym, void **pfn, int ver, unsigned long long flags, int *st) {\n"
        "  if (pfn) *pfn = (void *)compatlab_no_device; if (st) *st = 0; return 0; }"
    ),
}


class StandInError(Exception):
    """The stand-in driver could not be built (no C compiler, or it failed)."""


def real_driver(
    *,
    proc_version: Path = Path("/proc/driver/nvidia/version"),
    ldconfig: Callable[[], str] | None = None,
    find_library: Callable[[str], str | None] = ctypes.util.find_library,
    dlopen: Callable[[str], object] | None = ctypes.CDLL,
    stand_in_dirs: Iterable[Path] = (),
) -> str | None:
    """Evidence that this machine has a real NVIDIA driver, or None.

    Any one is enough: the kernel module's /proc file, libcuda.so.1 in the linker cache, find_library,
    or a successful dlopen of libcuda.so.1 that is not our own stand-in. The sources are parameters so
    that the decision can be tested on a machine with no driver.
    """
    if proc_version.exists():
        return f"{proc_version} exists"
    cache = (ldconfig or _ldconfig_p)()
    for line in cache.splitlines():
        if _SONAME in line and "=>" in line:
            return f"ldconfig -p lists {line.split('=>')[-1].strip()}"
    own = [str(p.resolve()) for p in stand_in_dirs]
    found = find_library("cuda")
    if found and not _is_stub(found):
        return f"find_library('cuda') found {found}"
    if dlopen is not None:
        try:
            lib = dlopen(_SONAME)
        except OSError:
            return None
        path = _loaded_path(lib) or _SONAME
        if not any(path.startswith(d) for d in own) and not _is_stub(path):
            return f"dlopen({_SONAME}) loaded {path}"
    return None


def _is_stub(path: str) -> bool:
    # The CUDA toolkit's link-time stubs (…/lib64/stubs/libcuda.so) are not a driver.
    return "/stubs/" in path


def _ldconfig_p() -> str:
    exe = shutil.which("ldconfig") or ("/sbin/ldconfig" if Path("/sbin/ldconfig").exists() else None)
    if exe is None:
        return ""
    done = run([exe, "-p"], timeout=30)
    return done.stdout if done.ok else ""


def _loaded_path(lib: object) -> str | None:
    # /proc/self/maps names the file a handle came from; good enough to tell our stand-in apart.
    name = getattr(lib, "_name", None)
    try:
        maps = Path("/proc/self/maps").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    for line in maps.splitlines():
        if "libcuda.so" in line:
            return line.split()[-1]
    return str(name) if name else None


def driver_symbols(files: Iterable[str | os.PathLike[str]]) -> set[str]:
    """The driver entry points (``cu[A-Z]…``) that *files* import, plus the usual ones."""
    names = set(_USUAL)
    for f in files:
        syms = dynamic_symbols(f, keep=True)  # the import stage reads them again (is_extension_module)
        if syms is not None:
            names.update(s for s in syms.undefined if _DRIVER_SYMBOL.match(s))
    return names


def stand_in_source(symbols: Iterable[str]) -> str:
    """C source of a libcuda.so.1 that exports *symbols* and answers CUDA_ERROR_NO_DEVICE."""
    lines = [
        "/* compatlab stand-in libcuda.so.1: there is no NVIDIA driver on this machine. */",
        f"#define NO_DEVICE {CUDA_ERROR_NO_DEVICE}",
        "static int compatlab_no_device(void) { return NO_DEVICE; }",
    ]
    for name in sorted(set(symbols) | set(_USUAL)):
        if not _DRIVER_SYMBOL.match(name):
            continue
        # Extra arguments are harmless on x86-64 and aarch64: the caller owns them.
        lines.append(_SPECIAL.get(name, f"int {name}(void) {{ return NO_DEVICE; }}"))
    return "\n".join(lines) + "\n"


def _compiler() -> str | None:
    for cc in (os.environ.get("CC", ""), "cc", "gcc", "clang"):
        if cc and (found := shutil.which(cc)):
            return found
    return None


def build_stand_in(symbols: Iterable[str], cache_dir: Path, *, timeout: float = 120.0) -> Path:
    """Build (or reuse) the stand-in; returns the directory that holds libcuda.so.1."""
    source = stand_in_source(symbols)
    key = hashlib.sha256(source.encode()).hexdigest()[:16]
    out_dir = cache_dir / f"fakecuda-{key}"
    lib = out_dir / _SONAME
    if lib.is_file():
        return out_dir
    cc = _compiler()
    if cc is None:
        raise StandInError("no C compiler (cc, gcc or clang) on PATH to build the stand-in libcuda.so.1")
    out_dir.mkdir(parents=True, exist_ok=True)
    src = out_dir / "libcuda.c"
    src.write_text(source, encoding="utf-8")
    tmp = out_dir / f".{_SONAME}.{os.getpid()}"
    done = run([cc, "-shared", "-fPIC", "-O1", f"-Wl,-soname,{_SONAME}", "-o", str(tmp), str(src)], timeout=timeout)
    if not done.ok:
        tmp.unlink(missing_ok=True)
        last = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        raise StandInError(f"building the stand-in libcuda.so.1 with {cc} failed: {last}")
    os.replace(tmp, lib)  # atomic: a concurrent cell sees the old state or a whole library
    log.info("built stand-in driver %s (%d symbols)", lib, source.count("\nint "))
    return out_dir


def stand_in_env(lib_dir: Path, env: dict[str, str]) -> dict[str, str]:
    """A copy of *env* whose processes find the stand-in libcuda.so.1 first."""
    out = dict(env)
    old = out.get("LD_LIBRARY_PATH", "")
    out["LD_LIBRARY_PATH"] = str(lib_dir) + (os.pathsep + old if old else "")
    return out


def cache_dir(work_dir: str | os.PathLike[str] | None) -> Path:
    """Where the stand-in is built: $COMPATLAB_CACHE if it can be written, else the cell's work_dir, else a
    user cache."""
    if (env := os.environ.get("COMPATLAB_CACHE")) and _writable(Path(env)):
        return Path(env)
    if work_dir:
        return Path(work_dir)
    return Path.home() / ".cache" / "compatlab"


def _writable(folder: Path) -> bool:
    """Whether files can be made in *folder* (made if missing): tried, since root ignores permission bits but
    not a read-only mount."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".probe-", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError:
        log.warning("cannot write the cache %s: the stand-in driver is built in the cell's folder", folder)
        return False
    return True
