"""Load extension modules one per process and say, in one line, why one would not load.

Standard library and compatlab.incell only, because it runs inside a cell's venv, where only the cell's packages,
pytest and compatlab's pure-Python modules are importable. The ELF reading here is the little the import
stage needs (dynamic symbols and DT_NEEDED); the static stage has the full analysis.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import functools
import importlib.machinery
import importlib.metadata
import importlib.util
import json
import logging
import os
import re
import shutil
import stat
import struct
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from compatlab.incell.probe import RESULT_TAG
from compatlab.incell.proc import HERE, Completed, InCellCommand, module_command, run

__all__ = [
    "CUDA_MAJOR_LIB",
    "DRIVER_LIBS",
    "FATBIN_SECTIONS",
    "STACK_KINDS",
    "DynamicSymbols",
    "Installed",
    "LoadFailure",
    "LoadTarget",
    "attempts_of",
    "c_level_failure",
    "c_level_failures",
    "c_level_probe",
    "classify",
    "classify_attempt",
    "classify_record",
    "demangle",
    "describe",
    "dynamic_symbols",
    "env_cuda_major",
    "importable_here",
    "is_extension_module",
    "load_module",
    "mapped_of",
    "package_targets",
    "probe_command",
]

log = logging.getLogger(__name__)

# Kinds that say the stack itself is broken; the others say this machine could not judge it.
STACK_KINDS = frozenset(
    {"undefined-symbol", "symbol-version", "missing-library", "numpy-abi", "import-error", "signal", "timeout", "exit"}
)

# A failure's kind as a code of the one table (incell/causes.py); an undefined symbol is refined by whose it is.
_CAUSE_OF_KIND = {
    "undefined-symbol": "abi-symbol",
    "symbol-version": "symbol-version",
    "missing-library": "missing-library",
    "numpy-abi": "numpy-abi",
    "no-driver": "needs-gpu",
    "missing-dependency": "undeclared-dependency",
    "import-error": "import-error",
    "signal": "crash",
    "timeout": "hang",
    "exit": "import-error",
}
# NumPy's C API: a module built for 1.x beside 2.x says one of these (on stderr or in the exception).
_NUMPY_ABI = (
    "_ARRAY_API not found",
    "compiled using NumPy 1.x cannot be run in",
    "numpy.core.multiarray failed to import",
    "numpy.core._multiarray_umath failed to import",
    "numpy.dtype size changed, may indicate binary incompatibility",
    "module compiled against ABI version",
)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class LoadFailure:
    """Why one module did not load, classified from what the loader and Python said."""

    # undefined-symbol | symbol-version | missing-library | no-driver | import-error | signal | timeout | exit
    kind: str
    message: str  # the one line that matters, as Python or the loader said it
    symbol: str | None = None
    demangled: str | None = None
    library: str | None = None
    signal: str | None = None
    step: str = ""  # "import torch", "load /path/x.so": what the probe was doing
    raw: str = ""  # the end of stderr, for the details
    # The exceptions around the one classified, outermost first ("OSError: Could not load this library: …"):
    # the message is the innermost cause's.
    outer: tuple[str, ...] = ()
    # For a missing CUDA library of another major than the environment's torch (libcudart.so.12 beside
    # torch +cu130): {"library": 12, "env": 13}. That is two CUDA majors in one environment, not a
    # library this machine lacks.
    cuda_mix: Mapping[str, int] | None = None

    @property
    def stack(self) -> bool:
        """True when the failure says the stack is broken (not that this machine has no driver)."""
        return self.kind in STACK_KINDS

    @property
    def cause(self) -> str:
        """Its code in incell/causes.py: an undefined symbol of CPython's C API is python-abi, one of
        torch's C++ namespaces (c10::, at::, torch::) torch-abi."""
        if self.kind == "undefined-symbol":
            name = self.demangled or self.symbol or ""
            if re.match(r"_?Py[A-Z_]", self.symbol or ""):
                return "python-abi"
            if re.match(r"(?:\w+ )?(?:c10|at|torch|caffe2)::", name) or "c10::" in name.split("(")[0]:
                return "torch-abi"
        if self.cuda_mix is not None:
            return "cuda-major-mix"
        return _CAUSE_OF_KIND.get(self.kind, "unclassified")

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        if self.cuda_mix is None:
            del out["cuda_mix"]
        else:
            out["cuda_mix"] = dict(self.cuda_mix)
        return out


# CUDA libraries whose soname's major is the CUDA major they were built with (libcudart.so.12 is CUDA 12's);
# cuFFT, cuRAND, cuSPARSE, cuSOLVER, cuDNN and NCCL number their sonames by their own releases and are not here.
# The static stage reads the same table.
CUDA_MAJOR_LIB = re.compile(r"^lib(cudart|nvrtc|cublas|cublasLt|nvJitLink|cupti|nvblas)\.so\.(\d+)$")
_TORCH_CUDA = re.compile(r"^cuda\s*(?::[^=]*)?=\s*['\"](\d+)\.", re.MULTILINE)


@functools.cache
def env_cuda_major() -> int | None:
    """The CUDA major of this interpreter's environment (in a cell: the cell's): torch's build (its
    ``torch/version.py``, read without importing torch; else a ``+cu130`` local version), else the
    ``nvidia-cuda-runtime`` wheel's. None when neither is installed."""
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        spec = None
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        try:
            text = (Path(folder) / "version.py").read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        if m := _TORCH_CUDA.search(text):
            return int(m.group(1))
    try:
        if m := re.search(r"\+cu(\d+)\d$", importlib.metadata.version("torch")):
            return int(m.group(1))
    except importlib.metadata.PackageNotFoundError:
        pass
    for name in ("nvidia-cuda-runtime", "nvidia-cuda-runtime-cu13", "nvidia-cuda-runtime-cu12"):
        try:
            version = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        return int(name.rsplit("-cu", 1)[1]) if name[-2:].isdigit() else int(version.split(".")[0])
    return None


def _cuda_mix(library: str) -> dict[str, int] | None:
    """{"library": 12, "env": 13} for a CUDA library of another major than the environment's."""
    m = CUDA_MAJOR_LIB.match(os.path.basename(library))
    env = env_cuda_major() if m else None
    if m is None or env is None or int(m.group(2)) == env:
        return None
    return {"library": int(m.group(2)), "env": env}


_UNDEFINED = re.compile(r"undefined symbol: ([^\s,]+)")
_VERSION = re.compile(r"version `([^']+)' not found(?: \(required by ([^)]+)\))?")
_MISSING_LIB = re.compile(r"([^\s:]+\.so[0-9.]*): cannot open shared object file")
# A package that looks its library up first (ctypes.util.find_library) and says so: sounddevice's
# "PortAudio library not found", "libsndfile library not found".
_NOT_FOUND = re.compile(r"([A-Za-z][\w.+-]*)(?: shared)? library (?:not found|could not be found)", re.IGNORECASE)
_OWN_WORDS = frozenset({"missing-library", "undefined-symbol", "symbol-version", "numpy-abi", "no-driver"})
_DRIVER_TEXT = (
    "found no nvidia driver",
    "cuda driver version is insufficient",
    "no cuda-capable device is detected",
    "cuda_error_no_device",
    "cudaerrornodevice",
    "cuda_error_not_initialized",
    "nvidia driver on your system is too old",
    "compatible with the cuda driver",
    "no cuda gpus are available",
    "no nvidia gpu",
    "nvml shared library not found",
    "failed to initialize nvml",
    "cuda driver initialization failed",
    "cudagetdevicecount",
    "found no nvidia driver on your system",
    "cuda is not available",
    "does not expose a usable cuda device",
)
DRIVER_LIBS = ("libcuda.so", "libnvidia-ml.so")  # the driver's: never a wheel's


def _result_record(stderr: str) -> dict[str, Any] | None:
    for line in reversed(stderr.splitlines()):
        if line.startswith(RESULT_TAG):
            try:
                data = json.loads(line[len(RESULT_TAG) :])
            except json.JSONDecodeError:
                return None
            return data if isinstance(data, dict) else None
    return None


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith(RESULT_TAG)]
    return lines[-1] if lines else ""


def mapped_of(completed: Completed) -> list[str] | None:
    """The shared objects a package import had mapped when it finished (None: not recorded)."""
    record = _result_record(completed.stderr)
    mapped = record.get("mapped") if record else None
    return [str(p) for p in mapped] if isinstance(mapped, list) else None


def attempts_of(completed: Completed) -> list[dict[str, Any]] | None:
    """Every shared object a probe's import tried to load, in order (probe.attempts); None: not recorded."""
    record = _result_record(completed.stderr)
    tried = record.get("attempts") if record else None
    return [a for a in tried if isinstance(a, dict)] if isinstance(tried, list) else None


def classify_attempt(attempt: Mapping[str, Any], step: str = "") -> LoadFailure | None:
    """A failed load attempt (probe.attempts) classified as a failed load is; None for one that loaded."""
    if attempt.get("ok"):
        return None
    exc_type, _, message = str(attempt.get("error", "")).partition(": ")
    return _classify_message(message, exc_type, step or f"load {attempt.get('name', '')}", "")


def classify(completed: Completed) -> LoadFailure | None:
    """Classify a finished probe (``probe_command``); None when the module loaded."""
    return classify_record(completed, _result_record(completed.stderr))


def classify_record(completed: Completed, record: dict[str, Any] | None) -> LoadFailure | None:
    """Classify a finished load from its process and the record its probe reported (None: it wrote none).

    The per-process probe writes the record on stderr (``classify``); a fork server's child over a pipe.
    """
    raw = completed.stderr[-4000:]
    step = str(record.get("step", "")) if record else ""
    if completed.timed_out:
        return LoadFailure(kind="timeout", message=f"killed after {completed.seconds:.0f} s", step=step, raw=raw)
    if completed.signal_name is not None:
        return LoadFailure(
            kind="signal",
            message=f"killed by {completed.signal_name}",
            signal=completed.signal_name,
            step=step,
            raw=raw,
        )
    if record is not None and record.get("ok") and completed.returncode == 0:
        return None
    if record is None:
        if completed.returncode == 0:
            # The probe always writes its record; an interpreter that exits 0 without one did not run it.
            return LoadFailure(kind="exit", message="exited 0 without a result", raw=raw)
        line = _last_line(completed.stderr) or _last_line(completed.stdout)
        text = f"exited with status {completed.returncode}" + (f": {line}" if line else "")
        return LoadFailure(kind="exit", message=text, raw=raw)
    message = str(record.get("message", ""))
    exc_type = str(record.get("type", ""))
    failure = _classify_message(message, exc_type, step, raw)
    outer = record.get("outer")
    if isinstance(outer, list) and outer:
        said = tuple(f"{e.get('type', '')}: {e.get('message', '')}" for e in outer if isinstance(e, dict))
        if failure.kind == "missing-dependency":
            # A module the package tried and handled (pyvips' `import _libvips`, its API mode), then a
            # failure of the fallback (its ABI mode cannot dlopen libvips.so.42): the fallback's is the cause.
            for e in outer:
                if isinstance(e, dict):
                    tried = _classify_message(str(e.get("message", "")), str(e.get("type", "")), step, raw)
                    if tried.kind in _OWN_WORDS:
                        failure = tried
                        break
        failure = dataclasses.replace(failure, outer=said)
    return failure


def _classify_message(message: str, exc_type: str, step: str, raw: str) -> LoadFailure:
    if m := _UNDEFINED.search(message):
        symbol = m.group(1)
        return LoadFailure(
            kind="undefined-symbol", message=message, symbol=symbol, demangled=demangle(symbol), step=step, raw=raw
        )
    if m := _VERSION.search(message):
        return LoadFailure(
            kind="symbol-version", message=message, symbol=m.group(1), library=m.group(2), step=step, raw=raw
        )
    if m := _MISSING_LIB.search(message):
        library = m.group(1)
        if library.startswith(DRIVER_LIBS):
            return LoadFailure(kind="no-driver", message=message, library=library, step=step, raw=raw)
        return LoadFailure(
            kind="missing-library", message=message, library=library, step=step, raw=raw, cuda_mix=_cuda_mix(library)
        )
    if any(t in message for t in _NUMPY_ABI) or (exc_type == "ImportError" and any(t in raw for t in _NUMPY_ABI)):
        # The outer ImportError ("numpy.core.multiarray failed to import") is the symptom: say the break.
        return LoadFailure(kind="numpy-abi", message=_numpy_words(message, raw), library="numpy", step=step, raw=raw)
    if any(t in message.lower() for t in _DRIVER_TEXT):
        return LoadFailure(kind="no-driver", message=message, step=step, raw=raw)
    if exc_type in ("OSError", "ImportError", "ModuleNotFoundError") and (m := _NOT_FOUND.search(message)):
        return LoadFailure(kind="missing-library", message=message, library=m.group(1), step=step, raw=raw)
    text = f"{exc_type}: {message}" if exc_type else message
    if exc_type == "ModuleNotFoundError" and (m := re.search(r"No module named '([^']+)'", message)):
        wanted = m.group(1).split(".")[0]
        target = step.removeprefix("import ").removeprefix("load ").split("/")[0].split(".")[0]
        if wanted != target and not step.endswith(f"/{wanted}"):
            # Another distribution's module: the package needs something it does not declare.
            return LoadFailure(kind="missing-dependency", message=text, library=wanted, step=step, raw=raw)
    return LoadFailure(kind="import-error", message=text, step=step, raw=raw)


def _numpy_words(message: str, raw: str) -> str:
    installed = re.search(r"cannot be run in\s+NumPy (\d[\w.]*)", raw + message)
    have = f"numpy {installed.group(1).rstrip('.')}" if installed else "numpy 2.x"
    said = message.strip().splitlines()[0] if message.strip() else "ImportError"
    return f"built for NumPy 1.x, {have} installed ({said})"


def describe(target: str, failure: LoadFailure) -> str:
    """The one-line reason for a grid cell: what failed to load and why."""
    where = target
    # A prerequisite (import torch) that fails is the real story: say so.
    if failure.step.startswith("import ") and failure.step != f"import {target}":
        where = f"{target} ({failure.step} failed)"
    elif failure.step.startswith("preload "):  # a library of its own package it needs, loaded first
        lib = failure.step.removeprefix("preload ")
        where = f"{target} (it needs {Path(lib).name} of its own package, which does not load)"
    if failure.kind == "undefined-symbol":
        return f"{where}: undefined symbol {failure.demangled or failure.symbol}"
    if failure.kind == "symbol-version":
        needed = f" (required by {Path(failure.library).name})" if failure.library else ""
        return f"{where}: symbol version {failure.symbol} not found{needed}"
    if failure.kind == "missing-library":
        if failure.cuda_mix is not None:
            mix = failure.cuda_mix
            return (
                f"{where}: missing shared library {failure.library}, a CUDA {mix['library']} library in a CUDA "
                f"{mix['env']} environment (built for another CUDA major than torch's)"
            )
        return f"{where}: missing shared library {failure.library}"
    if failure.kind == "numpy-abi":
        return f"{where}: {failure.message}; fix: `numpy<2`, or a release built for NumPy 2"
    if failure.kind == "no-driver":
        return f"{where}: no NVIDIA driver ({failure.library or failure.message})"
    if failure.kind == "missing-dependency":
        return f"{where} imports {failure.library}, which is not installed: an undeclared dependency"
    if failure.kind == "signal":
        return f"{where}: crashed with {failure.signal} while loading"
    if failure.kind == "timeout":
        return f"{where}: hung while loading, {failure.message}"
    return f"{where}: {failure.message}"


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


def dynamic_symbols(path: str | os.PathLike[str]) -> DynamicSymbols | None:
    """Read .dynsym and .dynamic of a 64-bit little-endian ELF file; None if it is not one (or is broken).

    Only a regular file is opened (O_NONBLOCK, then fstat: a FIFO named ``x.so`` would block ``open``), and
    only sections that lie inside the file and are at most MAX_SECTION_BYTES are read.
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
    try:
        with os.fdopen(fd, "rb") as fh:
            return _read_dynamic(fh, st.st_size)
    except (OSError, struct.error, ValueError, IndexError, MemoryError):
        return None


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
            for at in range(step, len(data) - step + 1, step):
                st_name, _st_info, _st_other, st_shndx = struct.unpack_from("<IBBH", data, at)
                name = cstr(strtab, st_name)
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


def _module_basename(filename: str) -> str | None:
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
    base = _module_basename(name)
    if base is None:
        return None
    # One module built several ways, picked by its package at import (mpi4py's MPI.mpich and MPI.openmpi
    # both define PyInit_MPI): the module is named by what comes before the first dot.
    base = base.split(".", 1)[0]
    syms = dynamic_symbols(path)
    if syms is None:
        # Named as only an extension module is (a CPython or abi3 tag) but unreadable here (section headers
        # stripped or damaged; ld.so needs none of them): load it, so that the loader, not silence, says.
        tagged = re.search(r"\.(?:cpython-[^.]+|abi3)\.so$", name) is not None
        return base if tagged and os.path.isfile(path) and _has_elf_magic(path) else None
    return base if f"PyInit_{base}" in syms.defined else None


def _has_elf_magic(path: str | os.PathLike[str]) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        return stat.S_ISREG(os.fstat(fd).st_mode) and os.read(fd, 4) == b"\x7fELF"
    except OSError:
        return False
    finally:
        os.close(fd)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class LoadTarget:
    """One thing to load: an extension module by file path, or a top-level package by name."""

    dist: str
    label: str  # "sgl_kernel/sm100/common_ops.abi3.so" or "sgl_kernel"
    name: str  # module name handed to the loader
    path: str | None = None  # absolute path of an extension module; None for an import by name


def _regular_packages(files: Sequence[Any], top: str) -> list[str]:
    """The packages a distribution installs below the namespace package *top* (``cuda`` -> ``cuda.core``):
    the shallowest folders under it with an ``__init__.py``."""
    inits = sorted(
        (f.parts[:-1] for f in files if len(f.parts) > 2 and f.parts[0] == top and f.parts[-1] == "__init__.py"),
        key=len,
    )
    found: list[tuple[str, ...]] = []
    for parts in inits:
        if all(parts[: len(p)] != p for p in found):
            found.append(tuple(parts))
    return [".".join(p) for p in found]


def _top_level_names(dist: importlib.metadata.Distribution, files: Sequence[Any]) -> list[str]:
    text = dist.read_text("top_level.txt")
    if text:
        listed = [n.strip() for n in text.splitlines() if n.strip()]
        dirs = {f.parts[0] for f in files if len(f.parts) == 2 and f.parts[1] == "__init__.py"}
        # As below: the packages are what users import, loose modules beside them are build helpers.
        names = [n for n in listed if n in dirs] or listed
        # `import cuda` runs no code of cuda-core: a namespace package is imported by its regular packages.
        names = [
            sub
            for n in names
            for sub in (
                [n] if n in dirs or any(f.parts == (f"{n}.py",) for f in files) else _regular_packages(files, n) or [n]
            )
        ]
    else:
        packages: list[str] = []
        modules: list[str] = []
        for f in files:
            parts = f.parts
            if not parts or parts[0] in ("..", "__pycache__") or parts[0].endswith((".dist-info", ".data")):
                continue
            if len(parts) == 2 and parts[-1] == "__init__.py":
                packages.append(parts[0])
            elif len(parts) == 1 and parts[0].endswith(".py"):
                modules.append(parts[0][:-3])
            elif len(parts) == 1 and (base := _module_basename(parts[0])):
                modules.append(base)
        # Loose top-level modules beside a package are usually build helpers (flashinfer ships
        # build_backend.py): the packages are what users import.
        names = packages or modules
    where = Path(str(dist.locate_file("")))
    names = [_python_name(where.joinpath(*n.split("."))) or n for n in names]
    seen: dict[str, None] = {}
    for n in [*names, *_pth_tops(dist, files)]:
        if "/" not in n and all(part.isidentifier() for part in n.split(".")):
            seen[n] = None
    return sorted(seen)


class Installed:
    """One distribution as installed, its RECORD read once (torch's lists some 20,000 files: reading it for
    each question cost the import stage over a second a cell). Raises importlib.metadata.PackageNotFoundError
    when it is not installed."""

    def __init__(self, dist_name: str) -> None:
        self.name = dist_name
        self.dist = importlib.metadata.distribution(dist_name)
        self.problem = ""  # what is wrong with its METADATA or RECORD: it is then read as far as it can be
        try:
            self.version = self.dist.version
        except (UnicodeDecodeError, OSError, ValueError) as exc:
            self.version = "?"
            self.problem = f"its METADATA cannot be read ({type(exc).__name__}: {exc})"
        try:
            self.files = list(self.dist.files or ())
        except (UnicodeDecodeError, OSError, ValueError, TypeError) as exc:  # a blank RECORD line is a TypeError
            self.files = []
            self.problem = f"its RECORD cannot be read ({type(exc).__name__}: {exc})"

    @functools.cached_property
    def _roots(self) -> tuple[str, ...]:
        # The environment (a venv's data files live in <prefix>/lib, <prefix>/bin) and the folder the
        # distribution is installed in (a base interpreter's site-packages, seen from a venv).
        return tuple({os.path.realpath(sys.prefix), os.path.realpath(str(self.dist.locate_file("")))})

    def inside(self, path: str) -> bool:
        """Whether *path*, symlinks resolved, lies in this environment: a RECORD row naming ``/tmp/x.so``
        or ``../../../../x.so`` must never make the lab load a file from elsewhere."""
        real = os.path.realpath(path)
        return any(real == root or real.startswith(root.rstrip(os.sep) + os.sep) for root in self._roots)

    @functools.cached_property
    def outside(self) -> list[str]:
        """RECORD's shared objects that lie outside the environment (never read, never loaded)."""
        return [
            f.as_posix()
            for f in self.files
            if (f.name.endswith(".so") or ".so." in f.name) and not self.inside(str(self.dist.locate_file(f)))
        ]

    @functools.cached_property
    def elf_files(self) -> list[str]:
        """Every shared object it installed in the environment (extension modules and plain libraries)."""
        paths = (
            str(self.dist.locate_file(f))
            for f in self.files
            if (f.name.endswith(".so") or ".so." in f.name) and not (f.parts and f.parts[0] == "..")
        )
        return [p for p in paths if self.inside(p)]

    @functools.cached_property
    def _extension_modules(self) -> tuple[list[LoadTarget], list[str]]:
        """(the extension modules to load, the labels of those built for another Python)"""
        modules: list[LoadTarget] = []
        other: list[str] = []
        for f in sorted(self.files, key=str):
            if not f.name.endswith(".so") or (f.parts and f.parts[0] == ".."):
                continue
            path = Path(str(self.dist.locate_file(f)))
            if not self.inside(str(path)):
                continue
            base = is_extension_module(path)
            if base is None:
                continue
            if not importable_here(f.name):
                other.append(f.as_posix())
                continue
            dotted = _import_name(path, base) or ".".join([*f.parts[:-1], base])
            modules.append(LoadTarget(dist=self.name, label=f.as_posix(), name=dotted, path=str(path)))
        return modules, other

    @property
    def targets(self) -> list[LoadTarget]:
        """What to load of it: its extension modules, then its top-level packages."""
        return self._extension_modules[0] + [
            LoadTarget(dist=self.name, label=n, name=n) for n in _top_level_names(self.dist, self.files)
        ]

    @property
    def other_python(self) -> list[str]:
        """Extension modules built for another Python than this one (sgl-kernel 0.3.21's
        ``_mscclpp.cpython-310-x86_64-linux-gnu.so`` beside a 3.11 interpreter): ``import`` never finds them
        here, and loading one by path anyway runs code built for another C API (it crashes). Their labels."""
        return self._extension_modules[1]


def _import_name(path: Path, base: str) -> str | None:
    """The dotted name Python imports the module at *path* by: relative to the deepest ``sys.path`` entry
    that holds it (a ``.pth`` file's path entry makes ``site-packages/vendor/foo/_x.so`` the module
    ``foo._x``, not ``vendor.foo._x``); None when no entry holds it under identifiers only."""
    real = os.path.realpath(path)
    entries = sorted({os.path.realpath(e) for e in sys.path if e}, key=len, reverse=True)
    for entry in entries:
        if real.startswith(entry.rstrip(os.sep) + os.sep):
            parts = Path(real[len(entry.rstrip(os.sep)) + 1 :]).parts[:-1]
            if all(p.isidentifier() for p in parts):
                return ".".join([*parts, base])
    return None


def _python_name(folder: Path) -> str | None:
    """The dotted name Python imports the package or module at *folder* (no suffix) by, relative to the
    deepest ``sys.path`` entry that holds it: a ``.pth`` file that puts ``nvidia_cutlass_dsl/dsl_packages``
    on the path makes ``nvidia_cutlass_dsl.dsl_packages.cutlass`` the package ``cutlass``."""
    real = os.path.realpath(folder)
    for entry in sorted({os.path.realpath(e) for e in sys.path if e}, key=len, reverse=True):
        if real.startswith(entry.rstrip(os.sep) + os.sep):
            parts = Path(real[len(entry.rstrip(os.sep)) + 1 :]).parts
            return ".".join(parts) if parts and all(p.isidentifier() for p in parts) else None
    return None


def _pth_tops(dist: importlib.metadata.Distribution, files: Sequence[Any]) -> list[str]:
    """Top-level packages and modules that a distribution's ``.pth`` path entries put on ``sys.path``."""
    names: list[str] = []
    for f in files:
        if len(f.parts) != 1 or not f.name.endswith(".pth"):
            continue
        try:
            text = Path(str(dist.locate_file(f))).read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        root = Path(str(dist.locate_file(""))).resolve()
        for raw in text.splitlines():
            line = raw.strip()
            if not line or line.startswith(("#", "import ", "import\t")):
                continue
            folder = (root / line).resolve()
            prefix = folder.relative_to(root).parts if folder.is_relative_to(root) else None
            if not prefix:
                continue
            for g in files:
                rest = g.parts[len(prefix) :]
                if tuple(g.parts[: len(prefix)]) != tuple(prefix) or not rest:
                    continue
                if len(rest) == 2 and rest[1] == "__init__.py":
                    names.append(rest[0])
                elif len(rest) == 1 and rest[0].endswith(".py") and rest[0] != "__init__.py":
                    names.append(rest[0][:-3])
    return names


def package_targets(dist_name: str) -> tuple[str, list[LoadTarget]]:
    """The installed version of *dist_name* and what to load of it (:attr:`Installed.targets`)."""
    installed = Installed(dist_name)
    return installed.version, installed.targets


def importable_here(filename: str) -> bool:
    """False for a file tagged for another CPython (``.cpython-310-x86_64-linux-gnu.so`` here in 3.11): no
    import of this interpreter takes it, by name or by a package's loader. Untagged and abi3 files are taken."""
    if not re.search(r"\.cpython-[^.]+\.so$", filename):
        return True
    return any(
        filename.endswith(suffix) for suffix in importlib.machinery.EXTENSION_SUFFIXES if suffix.startswith(".cpython-")
    )


_LD_FILE = re.compile(r"^\s*\d+:\s+file=(\S+) \[\d+\];\s+(dynamically loaded by (\S+)|generating link map)")


def c_level_failures(debug_dir: Path, python: str) -> list[tuple[str, str]]:
    """From glibc's ``LD_DEBUG=files`` output (``LD_DEBUG_OUTPUT`` files under *debug_dir*), each library a
    shared object's own C code asked ``dlopen`` for and never got: (name, the object that asked). A load is
    an attempt ("file=X [0];  dynamically loaded by Y") and a success when its link map is made ("file=X [0];
    generating link map"); one already mapped is not told at all. Loads asked by Python itself (``_ctypes``,
    the interpreter importing an extension) are left out: the probe sees those with their errors."""
    failed: dict[str, str] = {}
    for file in sorted(debug_dir.glob("ld.*")):
        try:
            lines = file.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            continue
        pending: dict[str, str] = {}
        for line in lines:
            m = _LD_FILE.match(line)
            if m is None:
                continue
            name, caller = m.group(1), m.group(3)
            if caller is not None:
                pending[name] = caller
            else:
                pending.pop(name, None)
        for name, caller in pending.items():
            base = os.path.basename(caller)
            if base.startswith(("_ctypes.", "libpython")) or os.path.realpath(caller) == os.path.realpath(python):
                continue
            if caller == "" or base.startswith("python"):
                continue
            failed.setdefault(name, caller)
    return sorted(failed.items())


def c_level_failure(name: str, caller: str, *, step: str, outer: tuple[str, ...]) -> LoadFailure:
    """A library C code of the stack could not load (``c_level_failures``), as a LoadFailure: missing, or of
    another CUDA major than the environment's."""
    return LoadFailure(
        kind="missing-library",
        message=f"{name}: cannot open shared object file (dlopen by {os.path.basename(caller)}, in the loader's log)",
        library=name,
        step=step,
        outer=outer,
        cuda_mix=_cuda_mix(name),
    )


def c_level_probe(
    python: str,
    *,
    path: str | None,
    name: str,
    pre_import: Sequence[str] = (),
    timeout: float = 120.0,
    env: Mapping[str, str],
    debug_dir: Path,
) -> list[tuple[str, str]]:
    """Load module *path* as *name* (or import package *name*) once more in a fresh interpreter with the
    loader's own log on (``LD_DEBUG=files``): the libraries C code of the stack tried to load and could not,
    which no Python door sees (``c_level_failures``). The fallback for a load that failed without naming why."""
    debug_dir.mkdir(parents=True, exist_ok=True)
    watched = {**env, "LD_DEBUG": "files", "LD_DEBUG_OUTPUT": str(debug_dir / "ld")}
    load_module(python, path=path, name=name, pre_import=pre_import, timeout=timeout, env=watched)
    return c_level_failures(debug_dir, python)


def probe_command(python: str, *, path: str | None, name: str, pre_import: Sequence[str] = ()) -> InCellCommand:
    """The probe (``compatlab.incell.probe``) that loads *path* as module *name* (or imports package *name*
    when path is None) with *python*, after importing *pre_import*."""
    return module_command(python, "probe", path or "", name, ",".join(pre_import), root=HERE)


def load_module(
    python: str,
    *,
    path: str | None,
    name: str,
    pre_import: Sequence[str] = (),
    timeout: float = 120.0,
    env: Mapping[str, str] | None = None,
) -> tuple[LoadFailure | None, Completed]:
    """Load one module in a fresh interpreter with a timeout, in its own process group; classify it."""
    command = probe_command(python, path=path, name=name, pre_import=pre_import)
    done = run(command.argv, timeout=timeout, env=env if env is not None else dict(os.environ), cwd=command.cwd)
    return classify(done), done
