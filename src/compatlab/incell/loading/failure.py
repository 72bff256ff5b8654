"""Why a module did not load, in one line: the failure's kind, read from what the loader and Python said, and
its code in the one table of causes (``incell/causes.py``).

The probe's record (``probe.steps``: the step it was on, the innermost exception's type and message, the
exceptions around it) and the process's end (a signal, a timeout, an exit without a record) are classified the
same way whichever path loaded the module (a fresh interpreter, or a fork server's child). The loader's own
words come first (``undefined symbol: X``, ``version `X' not found``, ``X.so: cannot open shared object
file``), then NumPy's C API's, then the driver's, then a package's own "library not found"; an undefined symbol
is refined by whose it is (CPython's C API, torch's C++ namespaces), a missing CUDA library by its major.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from compatlab.incell.loading.cudamajor import cuda_mix
from compatlab.incell.loading.demangle import demangle
from compatlab.incell.loading.observed import result_record
from compatlab.incell.probe import RESULT_TAG
from compatlab.incell.proc import Completed

__all__ = [
    "DRIVER_LIBS",
    "STACK_KINDS",
    "LoadFailure",
    "c_level_failure",
    "classify",
    "classify_attempt",
    "classify_record",
    "describe",
]

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


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith(RESULT_TAG)]
    return lines[-1] if lines else ""


def classify_attempt(attempt: Mapping[str, Any], step: str = "") -> LoadFailure | None:
    """A failed load attempt (probe.attempts) classified as a failed load is; None for one that loaded."""
    if attempt.get("ok"):
        return None
    exc_type, _, message = str(attempt.get("error", "")).partition(": ")
    return _classify_message(message, exc_type, step or f"load {attempt.get('name', '')}", "")


def classify(completed: Completed) -> LoadFailure | None:
    """Classify a finished probe (``probe_command``); None when the module loaded."""
    return classify_record(completed, result_record(completed.stderr))


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
            kind="missing-library", message=message, library=library, step=step, raw=raw, cuda_mix=cuda_mix(library)
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


def c_level_failure(name: str, caller: str, *, step: str, outer: tuple[str, ...]) -> LoadFailure:
    """A library C code of the stack could not load (``c_level_failures``), as a LoadFailure: missing, or of
    another CUDA major than the environment's."""
    return LoadFailure(
        kind="missing-library",
        message=f"{name}: cannot open shared object file (dlopen by {os.path.basename(caller)}, in the loader's log)",
        library=name,
        step=step,
        outer=outer,
        cuda_mix=cuda_mix(name),
    )
