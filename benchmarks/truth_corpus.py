"""A truth corpus for ``compatlab check``: real broken (and working) environments, each judged twice.

Every case is an environment built from the public package index (PyPI) with uv: ``uv venv -p python3.11``,
then one or more ``uv pip install --exclude-newer 2026-12-01 …`` steps (a second step with ``--no-deps``
breaks a pin on purpose), then pytest, so that the lab never installs anything into it itself. The torch
cases all share one torch, 2.14.1 from PyPI (a CUDA 13.0 build, ``+cu130``, about 3 GB; the uv cache
hard-links it into every env, so only the first costs the download).

The ground truth is measured **without the lab** (nothing of compatlab is imported for it):

* every top-level module of every distribution (``top_level.txt``, else the first part of each RECORD
  path; ``tests``/``docs``-style folders skipped; and what a ``.pth`` file's folder on sys.path holds,
  such as nvidia-cutlass-dsl's ``cutlass``; and the modules a case's users import below the top level,
  its ``uses``: ``xformers.ops``) is imported in a fresh ``ENV/bin/python -c "import X"``
  with a timeout, from an empty folder, with PYTHONPATH and LD_LIBRARY_PATH unset;
* every shared library inside the folders of the distributions a case is *about* is loaded with
  ``ctypes.CDLL(path, os.RTLD_NOW)`` in a fresh process: bare, then after ``import torch`` and the
  distribution's own top-level modules (the way its code loads it); the first load that works decides,
  else the failure of the fullest attempt (a torch extension loaded bare only says ``libc10.so: cannot
  open``, which torch's import provides);
* ``uv pip check`` lists the broken pins; the RECORDs give files that two distributions both install with
  different hashes.

This machine has no NVIDIA driver: there is no ``libcuda.so.1``. An import or load that fails for want of
it (``libcuda.so.1: cannot open``, ``Found no NVIDIA driver``, ``no CUDA-capable device``) is run once more
with a stand-in driver: a ``libcuda.so.1`` compiled here (gcc) that exports every ``cu*`` entry point the
env's libraries import, each returning CUDA_ERROR_NO_DEVICE (100), put first on LD_LIBRARY_PATH. What then
fails is the stack's fault (sgl_kernel 0.4.5's ``common_ops`` needs a c10 symbol torch 2.14.1 lacks); what
then loads only wanted a GPU.

The truth of a case, from those measurements:

* ``fail``: a top-level import fails for a reason of the stack;
* ``needs-gpu``: an import fails, but only for want of a driver or a GPU;
* ``warn``: every import works, but a shipped library of the case's distributions cannot load;
* ``pass``: everything imports and loads.

and a cause code: torch-abi (an undefined symbol of torch's C++ namespaces c10::, at::, torch::, caffe2::;
such a case counts abi-symbol right too), abi-symbol (another undefined symbol), python-abi (an undefined
``Py…`` symbol), numpy-abi (a wheel built for NumPy 1.x beside NumPy 2: ``_ARRAY_API not found``,
``numpy.dtype size changed``), cuda-major-mix (a CUDA library of another major than the env's torch, e.g.
``libcudart.so.12`` beside torch ``+cu130``), missing-library (a system library this machine lacks),
file-clash (two distributions own the module's files), pin-broken (a version check or pin the stack
breaks), import-error, needs-gpu, none. Each case declares the truth and code it was built to have; they
are measured again on every run and a case whose measured truth differs is reported BROKEN (the case is
wrong, not the lab) and left out of the score; a measured code the case does not declare is flagged
(``code≠``).

Then the lab: ``python -m compatlab check --venv ENV --out OUT -q`` with ``PYTHONPATH=LAB/src``, one
case at a time, and its ``results.json`` (one cell) is judged:

* truth pass, needs-gpu or warn is right when the cell is ``pass`` or ``partial`` (here, without a GPU,
  a sound cell is partial: its cuda stage cannot run); for warn, a warning of the lab (a stage reason of a
  warn stage, a ``warnings`` list, a finding of severity warn) must also name the case's package;
* truth fail is right when the cell is ``fail`` and names the cause: a ``causes`` entry (or a stage's
  ``cause``) with the case's code when the lab writes codes, else one of the case's keywords in the cell's
  or a failing stage's reason.

A fail for a not-fail truth is a false red, a pass/partial for a fail truth a false green, a fail that
names another cause a wrong cause; an ``error`` cell is wrong too. The lab runs with this environment less
PYTHONPATH/LD_*/VIRTUAL_ENV/PYTHONWARNINGS (the probes' ``PYTHONWARNINGS=ignore`` is theirs alone).

At the end it prints one row per case (truth, what was measured, the lab's state and cause codes, its wall
time, right or WRONG and why, the lab's reason), then per class (the second column of ``--list``) the
score right/scored (BROKEN cases left out) with the false reds, false greens, wrong causes, missing
warnings and lab errors, and the totals.

This is a benchmark that prints figures, not a test: it takes real packages from PyPI (many GB) and an hour
of a machine; it is never run by CI, nox or pytest.

    python benchmarks/truth_corpus.py --lab /work/lab-base [-k SUBSTR] [--envs /work/truth-envs]
        [--lab-out DIR] [--json FILE] [--list] [--truth-only] [--remeasure] [--rejudge]

Envs are kept under ``--envs`` (default /work/truth-envs), each with the spec it was built from
(``.truth-spec.json``) and its measured truth (``.truth-measure.json``): an env whose spec matches is
reused and not measured again (``--remeasure`` forces it), so a second run costs only the lab's checks;
``--rejudge`` judges the lab's outputs of an earlier run again (its times are kept beside them) without
running the lab.
The lab's outputs go to ``--lab-out`` (default ``ENVS/_lab/<the lab folder's name>``), one folder a
case. Exit 0 when every case is right and none is broken, 1 otherwise, 2 on bad usage. Installs run one
at a time; the probes of one env run two at a time (the machine has two cores); the lab's checks run one
at a time.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import csv
import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

REPO_ROOT = Path(__file__).resolve().parents[1]
EXCLUDE_NEWER = "2026-12-01"
PYTHON = "python3.11"
TORCH = "torch==2.14.1"
SPEC_VERSION = 1
MEASURE_VERSION = 6

INSTALL_TIMEOUT_S = 3600.0
IMPORT_TIMEOUT_S = 240.0
LOAD_TIMEOUT_S = 180.0
LAB_TIMEOUT_S = 3600.0
TOOL_TIMEOUT_S = 300.0
WORKERS = 2

Truth = Literal["pass", "fail", "needs-gpu", "warn"]
Code = Literal[
    "torch-abi",
    "abi-symbol",
    "missing-library",
    "cuda-major-mix",
    "numpy-abi",
    "python-abi",
    "file-clash",
    "pin-broken",
    "import-error",
    "needs-gpu",
    "none",
]
Status = Literal["ok", "fail", "gpu"]

# Folders some wheels install at the top of site-packages that are not libraries anyone imports.
NOT_LIBRARIES = frozenset(
    {
        "test",
        "tests",
        "testing",
        "doc",
        "docs",
        "example",
        "examples",
        "benchmark",
        "benchmarks",
        "scripts",
        "bin",
        "__pycache__",
    }
)

GPU_PATTERNS = (
    "libcuda.so.1: cannot open",
    "Found no NVIDIA driver",
    "no CUDA-capable device",
    "NVIDIA driver on your system",
    "No CUDA GPUs are available",
    "CUDA_ERROR_NO_DEVICE",
    "cudaErrorNoDevice",
    "CUDA driver version is insufficient",
    "Could not find libcuda",
    "libnvidia-ml.so.1: cannot open",
    "does not expose a usable CUDA device",
)
NUMPY_PATTERNS = (
    "_ARRAY_API not found",
    "compiled using NumPy 1.x",
    "numpy.dtype size changed",
    "numpy.core.multiarray failed to import",
    "numpy.core._multiarray_umath failed to import",
    "module compiled against ABI version",
    "module compiled against API version",
)
PIN_PATTERNS = (
    "is incompatible with the current",
    "is required for a normal functioning",
    "but this version of",
    "requires version",
    "version mismatch",
    "please upgrade",
    "Please upgrade",
)
MISSING_LIBRARY_PATTERNS = (
    "cannot open shared object file",
    "library not found",
    "Unable to find",
    "Couldn't locate",
    "cannot load library",
    "could not find",
)
# CUDA libraries whose soname major follows the CUDA major (cuFFT, cuRAND, cuSPARSE, cuSOLVER, cuDNN, NCCL and
# cuSPARSELt number theirs by their own releases).
CUDA_LIBRARIES = frozenset(
    {"libcudart", "libcublas", "libcublasLt", "libnvrtc", "libnvJitLink", "libcupti", "libnvblas"}
)
_CANNOT_OPEN = re.compile(r"(lib[\w+.-]+?)\.so\.(\d+)[\w.]*: cannot open shared object file")
_UNDEFINED = re.compile(r"undefined symbol: (\S+)")
# A mangled C++ name in a namespace of torch's (c10::, at::, torch::, caffe2::), its typeinfo/vtable too.
_TORCH_SYMBOL = re.compile(r"_Z(?:T[IVS])?N?[KVrRO]*(?:3c10|2at|5torch|6caffe2)(?=\d|[A-Z])")


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Case:
    """One environment to build, what it was built to be, and how to tell that the lab said why."""

    name: str
    category: str
    steps: tuple[tuple[str, ...], ...]
    truth: Truth
    code: Code
    about: tuple[str, ...]
    keywords: tuple[str, ...] = ()
    alt_codes: tuple[Code, ...] = ()
    warn_package: str = ""
    note: str = ""
    # Modules below the top level that the case's users import (xformers' memory_efficient_attention lives
    # in xformers.ops): imported for the truth like a top-level module, owned by the case's first `about`.
    uses: tuple[str, ...] = ()

    def codes(self) -> frozenset[str]:
        return frozenset({self.code, *self.alt_codes})


# What a reason must say to name a cause when the lab writes no codes (the baseline): the mechanism, not the
# symptom ("operator torchvision::nms does not exist" says that the extension did not load, not why). A torch
# pin the reason cites ("torchvision 0.28.0 requires torch==2.13.0") does say "built for another torch".
TORCH_ABI_WORDS = ("undefined symbol", "another torch", "c10::", "requires torch==")
CUDA12_WORDS = ("libcudart.so.12", "CUDA 12", "cu12")


def _nodeps(*reqs: str) -> tuple[str, ...]:
    return ("--no-deps", *reqs)


CASES: tuple[Case, ...] = (
    # --- torch extensions (one torch for all: 2.14.1+cu130 from PyPI) ---
    Case(
        name="torch-torchvision-match",
        category="torch-ext",
        steps=((TORCH, "torchvision==0.29.2", "numpy"),),
        truth="pass",
        code="none",
        about=("torchvision",),
        note="control: the torchvision uv picks for torch 2.14.1",
    ),
    Case(
        name="torchvision-0.28-on-torch-2.14",
        category="torch-ext",
        steps=((TORCH, "numpy", "pillow"), _nodeps("torchvision==0.28.0")),
        truth="fail",
        code="torch-abi",
        alt_codes=("abi-symbol",),
        about=("torchvision",),
        keywords=TORCH_ABI_WORDS,
        note="built for torch 2.13: _C.so lacks a symbol, then 'operator torchvision::nms does not exist'",
    ),
    Case(
        name="torchvision-0.26-on-torch-2.14",
        category="torch-ext",
        steps=((TORCH, "numpy", "pillow"), _nodeps("torchvision==0.26.0")),
        truth="fail",
        code="torch-abi",
        alt_codes=("abi-symbol",),
        about=("torchvision",),
        keywords=TORCH_ABI_WORDS,
        note="torchvision built for torch 2.11",
    ),
    Case(
        name="torchvision-0.24-cu12-on-torch-2.14",
        category="torch-ext",
        steps=((TORCH, "numpy", "pillow"), _nodeps("torchvision==0.24.1")),
        truth="fail",
        code="cuda-major-mix",
        alt_codes=("torch-abi", "abi-symbol"),
        about=("torchvision",),
        keywords=CUDA12_WORDS + TORCH_ABI_WORDS,
        note="torchvision for torch 2.9.1+cu128: _C.so needs libcudart.so.12, image.so a c10 symbol",
    ),
    Case(
        name="torch-torchaudio-match",
        category="torch-ext",
        steps=((TORCH, "torchaudio==2.11.1", "numpy"),),
        truth="pass",
        code="none",
        about=("torchaudio",),
        note="control: the torchaudio uv picks (no torch pin)",
    ),
    Case(
        name="torchaudio-2.10-on-torch-2.14",
        category="torch-ext",
        steps=((TORCH, "numpy"), _nodeps("torchaudio==2.10.0")),
        truth="fail",
        code="cuda-major-mix",
        about=("torchaudio",),
        keywords=CUDA12_WORDS,
        note="torchaudio 2.10.0 on PyPI is a CUDA 12.8 build: import torchaudio fails on libcudart.so.12 (every "
        "torch symbol libtorchaudio.so imports is in 2.14.1: no ABI break)",
    ),
    Case(
        name="torchaudio-2.9-cu12-on-torch-2.14",
        category="torch-ext",
        steps=((TORCH, "numpy"), _nodeps("torchaudio==2.9.1")),
        truth="fail",
        code="cuda-major-mix",
        alt_codes=("torch-abi", "abi-symbol"),
        about=("torchaudio",),
        keywords=CUDA12_WORDS + TORCH_ABI_WORDS,
        note="torchaudio for torch 2.9.1+cu128: libtorchaudio.so needs libcudart.so.12",
    ),
    Case(
        name="sglang-kernel-0.4.10-match",
        category="torch-ext",
        steps=((TORCH, "sglang-kernel==0.4.10", "numpy"),),
        truth="needs-gpu",
        code="needs-gpu",
        about=("sglang-kernel",),
        note="control: import sgl_kernel wants libcuda.so.1; with a stand-in driver it imports",
    ),
    Case(
        name="sglang-kernel-0.4.5-on-torch-2.14",
        category="torch-ext",
        steps=((TORCH, "sglang-kernel==0.4.5", "numpy"),),
        truth="fail",
        code="torch-abi",
        alt_codes=("abi-symbol",),
        about=("sglang-kernel",),
        keywords=("c10_cuda_check_implementation", *TORCH_ABI_WORDS),
        note="sglang-kernel 0.4.5 (built for torch 2.11) has no torch pin: uv installs it beside 2.14.1",
    ),
    Case(
        name="xformers-0.0.35-match",
        category="torch-ext",
        steps=((TORCH, "xformers==0.0.35", "numpy"),),
        truth="warn",
        code="cuda-major-mix",
        about=("xformers",),
        warn_package="xformers",
        note="the xformers that requires torch==2.14.1, yet its _C.so needs libcudart.so.12; import xformers works",
        uses=("xformers.ops",),
    ),
    Case(
        name="xformers-0.0.33-cu12-on-torch-2.14",
        category="torch-ext",
        steps=((TORCH, "numpy"), _nodeps("xformers==0.0.33.post2")),
        truth="fail",
        code="cuda-major-mix",
        alt_codes=("torch-abi", "abi-symbol"),
        about=("xformers",),
        note="xformers for torch 2.9.1 forced beside torch 2.14.1: import xformers works, but import xformers.ops "
        "(memory_efficient_attention) fails, its flash_attn_3/_C.so needing libcudart.so.12",
        uses=("xformers.ops",),
    ),
    Case(
        name="onnxruntime-gpu-cu12-beside-torch-cu13",
        category="cuda-mix",
        steps=((TORCH, "onnxruntime-gpu==1.23.2"),),
        truth="warn",
        code="cuda-major-mix",
        about=("onnxruntime-gpu",),
        warn_package="onnxruntime",
        note="imports; its CUDA and TensorRT providers need libcublasLt.so.12 / libcublas.so.12",
    ),
    Case(
        name="onnxruntime-gpu-cu13-beside-torch-cu13",
        category="cuda-mix",
        steps=((TORCH, "onnxruntime-gpu==1.31.1"),),
        truth="warn",
        code="missing-library",
        about=("onnxruntime-gpu",),
        warn_package="onnxruntime",
        note="CUDA 13 like torch: its CUDA provider loads once torch is imported; TensorRT's needs libnvinfer.so.10",
    ),
    Case(
        name="sglang-0.5.23-target",
        category="target",
        steps=(("sglang==0.5.23",),),
        truth="needs-gpu",
        code="needs-gpu",
        about=("sglang-kernel", "flashinfer-python"),
        note="the lab's own target: torch 2.14.1, sglang-kernel 0.4.10, flashinfer-python 0.7.2",
    ),
    # --- NumPy C-API breaks: wheels built for NumPy 1.x beside NumPy 2.2 ---
    Case(
        name="pandas-2.1-numpy2",
        category="numpy-abi",
        steps=(("numpy==2.2.6", "python-dateutil", "pytz", "tzdata"), _nodeps("pandas==2.1.4")),
        truth="fail",
        code="numpy-abi",
        about=("pandas",),
        keywords=("numpy",),
    ),
    Case(
        name="opencv-4.9-numpy2",
        category="numpy-abi",
        steps=(("numpy==2.2.6",), _nodeps("opencv-python==4.9.0.80")),
        truth="fail",
        code="numpy-abi",
        about=("opencv-python",),
        keywords=("numpy",),
    ),
    Case(
        name="numexpr-2.8-numpy2",
        category="numpy-abi",
        steps=(("numpy==2.2.6",), _nodeps("numexpr==2.8.7")),
        truth="fail",
        code="numpy-abi",
        about=("numexpr",),
        keywords=("numpy",),
    ),
    Case(
        name="h5py-3.10-numpy2",
        category="numpy-abi",
        steps=(("numpy==2.2.6",), _nodeps("h5py==3.10.0")),
        truth="fail",
        code="numpy-abi",
        about=("h5py",),
        keywords=("numpy",),
    ),
    Case(
        name="matplotlib-3.8-numpy2",
        category="numpy-abi",
        steps=(
            (
                "numpy==2.2.6",
                "contourpy",
                "cycler",
                "fonttools",
                "kiwisolver",
                "packaging",
                "pillow",
                "pyparsing",
                "python-dateutil",
            ),
            _nodeps("matplotlib==3.8.2"),
        ),
        truth="fail",
        code="numpy-abi",
        about=("matplotlib",),
        keywords=("numpy",),
    ),
    Case(
        name="pyarrow-14-numpy2",
        category="numpy-abi",
        steps=(("numpy==2.2.6",), _nodeps("pyarrow==14.0.2")),
        truth="fail",
        code="numpy-abi",
        about=("pyarrow",),
        keywords=("numpy",),
    ),
    # --- pure-Python pins broken ---
    Case(
        name="pydantic-core-mismatch",
        category="pin",
        steps=(("pydantic==2.12.5",), _nodeps("pydantic-core==2.33.2")),
        truth="fail",
        code="pin-broken",
        about=("pydantic", "pydantic-core"),
        keywords=("pydantic-core", "pydantic_core"),
        note="import pydantic raises SystemError",
    ),
    Case(
        name="transformers-old-tokenizers",
        category="pin",
        steps=(("transformers==4.46.3",), _nodeps("tokenizers==0.13.3")),
        truth="fail",
        code="pin-broken",
        about=("transformers", "tokenizers"),
        keywords=("tokenizers",),
    ),
    Case(
        name="jax-old-jaxlib",
        category="pin",
        steps=(("jax==0.4.30",), _nodeps("jaxlib==0.4.20")),
        truth="fail",
        code="pin-broken",
        about=("jax", "jaxlib"),
        keywords=("jaxlib",),
    ),
    Case(
        name="requests-old-idna",
        category="pin",
        steps=(("requests==2.32.3",), _nodeps("idna==2.4")),
        truth="pass",
        code="none",
        about=("requests",),
        note="a broken pin that breaks nothing: idna 2.4 < 2.5",
    ),
    # --- system libraries this machine lacks ---
    Case(
        name="sounddevice-no-portaudio",
        category="system-lib",
        steps=(("sounddevice==0.5.1",),),
        truth="fail",
        code="missing-library",
        about=("sounddevice",),
        keywords=("portaudio",),
    ),
    Case(
        name="pyvips-no-libvips",
        category="system-lib",
        steps=(("pyvips==2.2.3",),),
        truth="fail",
        code="missing-library",
        about=("pyvips",),
        keywords=("libvips", "vips"),
    ),
    Case(
        name="openslide-no-libopenslide",
        category="system-lib",
        steps=(("openslide-python==1.4.1",),),
        truth="fail",
        code="missing-library",
        about=("openslide-python",),
        keywords=("openslide",),
    ),
    Case(
        name="numba-no-tbb",
        category="system-lib",
        steps=(("numba==0.60.0",),),
        truth="warn",
        code="missing-library",
        about=("numba",),
        warn_package="numba",
        note="numba/np/ufunc/tbbpool.so needs libtbb.so.12; import numba does not",
    ),
    Case(
        name="cupy-no-cutensor",
        category="system-lib",
        steps=(("cupy-cuda13x==14.2.0",),),
        truth="warn",
        code="missing-library",
        about=("cupy-cuda13x",),
        warn_package="cupy",
        note="import cupy tries cupy_backends/cuda/libs/cutensor.so (it needs libcutensor.so.2, absent) and goes on "
        "without it: found red on the device's own environment",
    ),
    # --- two copies of one library ---
    Case(
        name="opencv-python-and-headless",
        category="file-clash",
        steps=(("opencv-python==4.10.0.84",), _nodeps("opencv-python-headless==4.12.0.88")),
        truth="pass",
        code="none",
        about=("opencv-python", "opencv-python-headless"),
        note="cv2/ from two wheels of two versions; import cv2 works (4.12.0's bytes win)",
    ),
    Case(
        name="pymongo-and-bson",
        category="file-clash",
        steps=(("pymongo==4.10.1",), ("bson==0.5.10",)),
        truth="fail",
        code="file-clash",
        alt_codes=("import-error",),
        about=("pymongo", "bson"),
        keywords=("bson",),
        note="the bson package overwrites pymongo's bson/: cannot import name 'SON'",
    ),
    Case(
        name="pyjwt-and-jwt",
        category="file-clash",
        steps=(("PyJWT==2.10.1",), ("jwt==1.3.1",)),
        truth="pass",
        code="none",
        about=("pyjwt", "jwt"),
        note="two jwt/ packages (pure Python): import jwt works, its API is the later one's",
    ),
    # --- working controls ---
    Case(
        name="numpy-pandas-current",
        category="control",
        steps=(("numpy", "pandas"),),
        truth="pass",
        code="none",
        about=("numpy", "pandas"),
    ),
    Case(
        name="pydantic-matching",
        category="control",
        steps=(("pydantic==2.12.5",),),
        truth="pass",
        code="none",
        about=("pydantic", "pydantic-core"),
    ),
    Case(name="scipy-current", category="control", steps=(("scipy",),), truth="pass", code="none", about=("scipy",)),
    Case(
        name="requests-current",
        category="control",
        steps=(("requests",),),
        truth="pass",
        code="none",
        about=("requests",),
    ),
    Case(
        name="python-magic-with-libmagic",
        category="control",
        steps=(("python-magic==0.4.27",),),
        truth="pass",
        code="none",
        about=("python-magic",),
        note="libmagic.so.1 is on this machine",
    ),
    Case(
        name="cairocffi-with-libcairo",
        category="control",
        steps=(("cairocffi==1.7.1",),),
        truth="pass",
        code="none",
        about=("cairocffi",),
        note="libcairo.so.2 is on this machine",
    ),
)


# ----------------------------------------------------------------------------------------------------
# processes


@dataclasses.dataclass(frozen=True, slots=True)
class Done:
    rc: int
    stdout: str
    stderr: str


def run(argv: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None, cwd: Path | None = None) -> Done:
    """Run argv in its own process group; on time-out the whole group is killed (rc 124)."""
    with subprocess.Popen(
        list(argv),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        env=dict(env) if env is not None else None,
        cwd=cwd,
        text=True,
        errors="replace",
        start_new_session=True,
    ) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            return Done(124, out, err + f"\ntimed out after {timeout:.0f} s")
        return Done(proc.returncode, out, err)


def clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"PYTHONPATH", "LD_LIBRARY_PATH", "LD_PRELOAD", "VIRTUAL_ENV", "PYTHONHOME"}
    }
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["PYTHONWARNINGS"] = "ignore"
    env.update(extra or {})
    return env


def find_uv() -> str:
    found = shutil.which("uv") or shutil.which("uv", path=str(Path(sys.executable).parent))
    if found is None:
        raise SystemExit("truth_corpus: uv not found on PATH nor beside this interpreter")
    return found


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def key_line(text: str) -> str:
    """The line of a failure that says why: the last one naming a known cause, else the last error line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    telling = ("undefined symbol", *GPU_PATTERNS, *NUMPY_PATTERNS, *PIN_PATTERNS, *MISSING_LIBRARY_PATTERNS)
    for line in reversed(lines):
        if any(p in line for p in telling):
            return line
    for line in reversed(lines):
        if re.match(r"[\w.]*(Error|Exception)\b", line):
            return line
    return lines[-1] if lines else ""


# ----------------------------------------------------------------------------------------------------
# building


def spec_of(case: Case) -> dict[str, Any]:
    steps = [list(step) for step in case.steps] + [["pytest"]]
    return {"version": SPEC_VERSION, "python": PYTHON, "exclude_newer": EXCLUDE_NEWER, "steps": steps}


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def build(case: Case, envs: Path, uv: str, log: Path) -> tuple[Path, bool]:
    """The case's env, built unless one with the same spec is there; True when it was built now."""
    env = envs / case.name
    spec = spec_of(case)
    if read_json(env / ".truth-spec.json") == spec and (env / "bin" / "python").exists():
        return env, False
    if env.exists():
        shutil.rmtree(env)
    uv_env = clean_env({"UV_PYTHON_DOWNLOADS": "never"})
    steps: list[list[str]] = [[uv, "venv", "-q", "-p", PYTHON, str(env)]]
    steps += [
        [uv, "pip", "install", "--python", str(env / "bin" / "python"), "--exclude-newer", EXCLUDE_NEWER, *step]
        for step in spec["steps"]
    ]
    with log.open("a") as out:
        for argv in steps:
            out.write("$ " + " ".join(argv) + "\n")
            done = run(argv, timeout=INSTALL_TIMEOUT_S, env=uv_env)
            out.write(done.stdout + done.stderr)
            if done.rc != 0:
                raise RuntimeError(f"{case.name}: {' '.join(argv[:3])} … failed: {last_line(done.stderr)}")
    (env / ".truth-spec.json").write_text(json.dumps(spec, indent=1))
    return env, True


# ----------------------------------------------------------------------------------------------------
# what is installed


@dataclasses.dataclass(frozen=True, slots=True)
class Dist:
    name: str  # canonical
    version: str
    files: tuple[tuple[str, str], ...]  # (RECORD path, hash)
    top_level: tuple[str, ...]
    requires: tuple[str, ...]  # canonical names of its Requires-Dist without an extra


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def site_packages(env: Path) -> Path:
    found = sorted((env / "lib").glob("python3*/site-packages"))
    if not found:
        raise RuntimeError(f"{env}: no site-packages")
    return found[0]


def _metadata(path: Path) -> tuple[str, str, tuple[str, ...]]:
    name = version = ""
    requires: list[str] = []
    for line in path.read_text(errors="replace").splitlines():
        if not line.strip():
            break
        if line.startswith("Name:"):
            name = line[5:].strip()
        elif line.startswith("Version:"):
            version = line[8:].strip()
        elif line.startswith("Requires-Dist:") and "extra" not in line.partition(";")[2]:
            found = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", line[14:])
            if found:
                requires.append(canonical(found.group(1)))
    return name, version, tuple(requires)


def _exists(site: Path, module: str) -> bool:
    """Whether site-packages holds an importable module of that name: a package, a .py file, or a shared
    object that is an extension module (exports ``PyInit_<name>``; torch-memory-saver installs preload
    libraries at the top of site-packages that are not)."""
    if (site / module).is_dir() or (site / f"{module}.py").exists():
        return True
    marker = f"PyInit_{module}".encode()
    for lib in [*site.glob(f"{module}.*.so"), *site.glob(f"{module}.so")]:
        try:
            if marker in lib.read_bytes():
                return True
        except OSError:
            continue
    return False


def distributions(site: Path) -> list[Dist]:
    out: list[Dist] = []
    for info in sorted(site.glob("*.dist-info")):
        try:
            name, version, requires = _metadata(info / "METADATA")
            rows = list(csv.reader((info / "RECORD").read_text(errors="replace").splitlines()))
        except OSError:
            continue
        files = tuple((row[0], row[1] if len(row) > 1 else "") for row in rows if row)
        tops: set[str] = set()
        top_txt = info / "top_level.txt"
        if top_txt.exists():
            tops = {line.strip() for line in top_txt.read_text().splitlines() if line.strip()}
        else:
            for path, _ in files:
                parts = path.split("/")
                first = parts[0]
                if first.startswith("..") or first.endswith((".dist-info", ".data")):
                    continue
                if len(parts) > 1:
                    tops.add(first)
                elif first.endswith(".py"):
                    tops.add(first[:-3])
                elif ".so" in first:
                    tops.add(first.split(".")[0])
        good = sorted(t for t in tops if t.isidentifier() and t not in NOT_LIBRARIES and _exists(site, t))
        out.append(Dist(canonical(name), version, files, tuple(good), requires))
    return out


def path_modules(python: Path, site: Path, dists: Sequence[Dist]) -> dict[str, str]:
    """Top-level modules that a ``.pth`` file makes importable from a folder inside site-packages
    (nvidia-cutlass-dsl puts ``nvidia_cutlass_dsl/dsl_packages`` on sys.path: ``import cutlass``), each
    with the distribution whose RECORD holds that folder. Read from the env's own ``sys.path``."""
    done = run(
        [str(python), "-c", "import json, sys; print(json.dumps(sys.path))"], timeout=TOOL_TIMEOUT_S, env=clean_env()
    )
    try:
        entries = [Path(e) for e in json.loads(done.stdout)] if done.rc == 0 else []
    except ValueError:
        entries = []
    out: dict[str, str] = {}
    for entry in entries:
        if not entry.is_dir() or entry.resolve() == site.resolve() or site.resolve() not in entry.resolve().parents:
            continue
        rel = entry.resolve().relative_to(site.resolve()).as_posix() + "/"
        owner = next((d.name for d in dists if any(path.startswith(rel) for path, _ in d.files)), "")
        for child in sorted(entry.iterdir()):
            name = child.name.split(".")[0] if child.is_file() else child.name
            if child.is_file() and not child.name.endswith(".py") and ".so" not in child.name:
                continue
            if name.isidentifier() and name not in NOT_LIBRARIES and _exists(entry, name):
                out.setdefault(name, owner or rel.rstrip("/"))
    return out


def clashes(dists: Sequence[Dist]) -> list[dict[str, Any]]:
    """Files that two distributions' RECORDs both list with different hashes."""
    owners: dict[str, list[tuple[str, str]]] = {}
    for dist in dists:
        for path, digest in dist.files:
            if digest and not path.startswith("..") and ".dist-info/" not in path:
                owners.setdefault(path, []).append((dist.name, digest))
    return [
        {"path": path, "dists": sorted({d for d, _ in who})}
        for path, who in sorted(owners.items())
        if len({h for _, h in who}) > 1
    ]


def is_shared_library(path: str) -> bool:
    name = path.rsplit("/", 1)[-1]
    return name.endswith(".so") or ".so." in name


def vendored(path: str) -> bool:
    """A library auditwheel copied into ``<dist>.libs/``: it is loaded through the modules that need it
    (their RPATH finds its own vendored siblings), never alone, so it is not probed alone."""
    return path.split("/", maxsplit=1)[0].endswith(".libs")


def env_cuda_major(dists: Sequence[Dist]) -> int | None:
    """The CUDA major of the env's torch (+cu130 → 13), else of its nvidia-cuda-runtime wheel."""
    by_name = {d.name: d for d in dists}
    torch = by_name.get("torch")
    if torch is not None:
        found = re.search(r"\+cu(\d+)", torch.version)
        if found:
            return int(found.group(1)[:-1])
    for dist in dists:
        match = re.fullmatch(r"nvidia-cuda-runtime(?:-cu(\d+))?", dist.name)
        if match:
            return int(match.group(1) or dist.version.split(".")[0])
    return None


# ----------------------------------------------------------------------------------------------------
# probes


def gpu_only(text: str) -> bool:
    return any(p in text for p in GPU_PATTERNS)


def stand_in_driver(env: Path, site: Path) -> Path | None:
    """A libcuda.so.1 exporting every cu* entry point the env's libraries import, each returning 100."""
    folder = env / ".truth-stub"
    lib = folder / "libcuda.so.1"
    if lib.exists():
        return folder
    nm, gcc = shutil.which("nm"), shutil.which("gcc")
    if nm is None or gcc is None:
        return None
    libs = [str(p) for p in site.rglob("*.so*") if p.is_file() and is_shared_library(p.name)]
    names: set[str] = set()
    for start in range(0, len(libs), 64):
        done = run([nm, "-D", "--undefined-only", *libs[start : start + 64]], timeout=TOOL_TIMEOUT_S)
        for line in done.stdout.splitlines():
            symbol = line.split()[-1].split("@")[0] if line.split() else ""
            if re.fullmatch(r"cu[A-Z]\w*", symbol):
                names.add(symbol)
    names |= {"cuInit", "cuDriverGetVersion", "cuDeviceGetCount", "cuGetProcAddress", "cuGetProcAddress_v2"}
    folder.mkdir(exist_ok=True)
    source = folder / "libcuda.c"
    source.write_text("".join(f"int {n}(void) {{ return 100; }}\n" for n in sorted(names)))
    done = run(
        [gcc, "-shared", "-fPIC", "-o", str(lib), str(source), "-Wl,-soname,libcuda.so.1"], timeout=TOOL_TIMEOUT_S
    )
    return folder if done.rc == 0 else None


@dataclasses.dataclass(frozen=True, slots=True)
class Probe:
    what: str  # a module name or a library's RECORD path
    dist: str
    status: Status
    message: str  # the last stderr line of the decisive attempt
    text: str  # the tail of its stderr, for the classifier
    stand_in: bool = False  # the decisive attempt ran with the stand-in driver


def _attempt(argv: Sequence[str], timeout: float, cwd: Path, stub: Path | None) -> Done:
    extra = {"LD_LIBRARY_PATH": str(stub)} if stub is not None else None
    return run(argv, timeout=timeout, env=clean_env(extra), cwd=cwd)


def probe_import(python: Path, module: str, dist: str, cwd: Path, stub: _Stub) -> Probe:
    argv = [str(python), "-c", f"import {module}"]
    done = _attempt(argv, IMPORT_TIMEOUT_S, cwd, None)
    if done.rc == 0:
        return Probe(module, dist, "ok", "", "")
    if not gpu_only(done.stderr):
        return Probe(module, dist, "fail", key_line(done.stderr), done.stderr[-6000:])
    folder = stub()
    if folder is None:
        return Probe(module, dist, "gpu", key_line(done.stderr), done.stderr[-6000:])
    again = _attempt(argv, IMPORT_TIMEOUT_S, cwd, folder)
    if again.rc == 0:
        return Probe(module, dist, "gpu", key_line(done.stderr), done.stderr[-6000:])
    status: Status = "gpu" if gpu_only(again.stderr) else "fail"
    return Probe(module, dist, status, key_line(again.stderr), again.stderr[-6000:], stand_in=True)


_LOAD = (
    "import ctypes, importlib, os, sys\n"
    "for name in sys.argv[2:]:\n"
    "    try:\n"
    "        importlib.import_module(name)\n"
    "    except Exception:\n"
    "        pass\n"
    "ctypes.CDLL(sys.argv[1], os.RTLD_NOW)\n"
)


@dataclasses.dataclass(frozen=True, slots=True)
class Load:
    """A shared library to load: its path, its RECORD path, its distribution, what to import first."""

    path: Path
    rel: str
    dist: str
    preload: tuple[str, ...]


def probe_load(python: Path, load: Load, cwd: Path, stub: _Stub) -> Probe:
    """Load one library: bare, after ``import torch``, after its own package too; then the same with the
    stand-in driver if only the driver was missing. The first success decides (with the stand-in: gpu);
    else the failure that is not the driver's of the fullest attempt (the way the package's code loads it:
    a torch extension loaded bare fails only because ``libc10.so`` is found through torch's own import,
    which says nothing of the extension), else the driver's."""
    preloads: list[tuple[str, ...]] = [()]
    if load.preload[:1] == ("torch",):
        preloads.append(("torch",))
    if load.preload and load.preload not in preloads:
        preloads.append(load.preload)
    failures: list[tuple[Done, bool]] = []
    for with_stub in (False, True):
        folder = stub() if with_stub else None
        if with_stub and (folder is None or not any(gpu_only(d.stderr) for d, _ in failures)):
            break
        for preload in preloads:
            done = _attempt([str(python), "-c", _LOAD, str(load.path), *preload], LOAD_TIMEOUT_S, cwd, folder)
            if done.rc == 0:
                return Probe(load.rel, load.dist, "gpu" if with_stub else "ok", "", "", stand_in=with_stub)
            failures.append((done, with_stub))
    real = [(d, w) for d, w in failures if not gpu_only(d.stderr)]
    done, with_stub = real[-1] if real else failures[-1]
    status: Status = "fail" if real else "gpu"
    return Probe(load.rel, load.dist, status, key_line(done.stderr), done.stderr[-3000:], stand_in=with_stub)


class _Stub:
    """Builds the stand-in driver once, the first time a probe needs it (thread-safe enough: one lock)."""

    def __init__(self, env: Path, site: Path) -> None:
        self._env, self._site = env, site
        self._lock = threading.Lock()
        self._done = False
        self._folder: Path | None = None

    def __call__(self) -> Path | None:
        with self._lock:
            if not self._done:
                self._folder = stand_in_driver(self._env, self._site)
                self._done = True
            return self._folder


def measure(case: Case, env: Path, uv: str) -> dict[str, Any]:
    """Imports, library loads, pip check and file clashes of one env, without the lab."""
    site = site_packages(env)
    python = env / "bin" / "python"
    dists = distributions(site)
    by_name = {d.name: d for d in dists}
    missing = [a for a in case.about if a not in by_name]
    if missing:
        raise RuntimeError(f"{case.name}: not installed: {', '.join(missing)}")
    stub = _Stub(env, site)
    modules: dict[str, str] = {}
    for dist in dists:
        for top in dist.top_level:
            modules.setdefault(top, dist.name)
    for top, owner in path_modules(python, site, dists).items():
        modules.setdefault(top, owner)
    for used in case.uses:
        modules.setdefault(used, case.about[0])
    torch_there = "torch" in by_name
    loads: list[Load] = []
    for name in case.about:
        dist = by_name[name]
        preload = (("torch",) if torch_there else ()) + dist.top_level
        for rel, _ in dist.files:
            if not rel.startswith("..") and is_shared_library(rel) and not vendored(rel) and (site / rel).is_file():
                loads.append(Load(site / rel, rel, name, preload))
    with (
        tempfile.TemporaryDirectory(prefix="truth-") as tmp,
        concurrent.futures.ThreadPoolExecutor(max_workers=WORKERS) as pool,
    ):
        cwd = Path(tmp)
        import_futures = [pool.submit(probe_import, python, m, d, cwd, stub) for m, d in sorted(modules.items())]
        load_futures = [pool.submit(probe_load, python, load, cwd, stub) for load in loads]
        imports = [f.result() for f in import_futures]
        libraries = [f.result() for f in load_futures]
    check = run([uv, "pip", "check", "--python", str(python)], timeout=TOOL_TIMEOUT_S, env=clean_env())
    broken = [line.strip() for line in (check.stdout + check.stderr).splitlines() if "requires" in line]
    return {
        "version": MEASURE_VERSION,
        "dists": {d.name: d.version for d in dists},
        "cuda_major": env_cuda_major(dists),
        "modules": sorted(modules),
        "requires": {d.name: list(d.requires) for d in dists},
        "imports": [dataclasses.asdict(p) for p in imports],
        "libraries": [dataclasses.asdict(p) for p in libraries],
        "pip_check": broken,
        "clashes": clashes(dists),
    }


def measured(case: Case, env: Path, uv: str, *, fresh: bool) -> dict[str, Any]:
    cache = env / ".truth-measure.json"
    old = read_json(cache)
    if (
        not fresh
        and isinstance(old, dict)
        and old.get("version") == MEASURE_VERSION
        and old.get("uses") == list(case.uses)
    ):
        return old
    data = {**measure(case, env, uv), "uses": list(case.uses)}
    cache.write_text(json.dumps(data, indent=1))
    return data


# ----------------------------------------------------------------------------------------------------
# truth


@dataclasses.dataclass(frozen=True, slots=True)
class Verdict:
    truth: Truth
    code: Code
    evidence: str


def _probes(items: Iterable[Mapping[str, Any]]) -> list[Probe]:
    return [Probe(**item) for item in items]


def classify(probe: Probe, data: Mapping[str, Any]) -> Code:
    text = probe.text or probe.message
    if any(p in text for p in NUMPY_PATTERNS):
        return "numpy-abi"
    undefined = _UNDEFINED.search(text)
    if undefined:
        symbol = undefined.group(1)
        if re.match(r"_?Py", symbol):
            return "python-abi"
        return "torch-abi" if _TORCH_SYMBOL.match(symbol) else "abi-symbol"
    opened = _CANNOT_OPEN.search(text)
    if opened:
        lib, major = opened.group(1), int(opened.group(2))
        cuda = data.get("cuda_major")
        if lib in CUDA_LIBRARIES and isinstance(cuda, int) and major != cuda:
            return "cuda-major-mix"
        return "missing-library"
    if any(p in text for p in MISSING_LIBRARY_PATTERNS):
        return "missing-library"
    if any(p in text for p in PIN_PATTERNS):
        return "pin-broken"
    clash_tops = {c["path"].split("/")[0].removesuffix(".py") for c in data.get("clashes", [])}
    own = probe.what.split("/")[0].removesuffix(".py")
    if own in clash_tops or any(f"'{t}'" in text or f"/{t}/" in text for t in clash_tops):
        return "file-clash"
    return "import-error"


def undeclared_module(probe: Probe, data: Mapping[str, Any]) -> str:
    """The module a failed import wanted that is not installed and that its distribution does not require
    (matplotlib-inline without matplotlib): an optional plugin's host, not a break of the stack."""
    found = re.search(r"No module named '([\w]+)", probe.message)
    if not found or found.group(1) in data.get("modules", []):
        return ""
    wanted = canonical(found.group(1))
    return "" if wanted in data.get("requires", {}).get(probe.dist, []) else found.group(1)


def _pinned(probe: Probe, data: Mapping[str, Any]) -> bool:
    return any(line.startswith(f"The package `{probe.dist}` requires") for line in data.get("pip_check", []))


def derive(case: Case, data: Mapping[str, Any]) -> Verdict:
    imports = _probes(data["imports"])
    libraries = _probes(data["libraries"])
    failed = [p for p in imports if p.status == "fail" and not undeclared_module(p, data)]
    lib_failed = [p for p in libraries if p.status == "fail"]
    if failed:
        primary = next((p for p in failed if p.dist in case.about), failed[0])
        code = classify(primary, data)
        if code == "import-error" and lib_failed:
            codes = [classify(p, data) for p in lib_failed]
            code = next(
                (
                    c
                    for c in ("cuda-major-mix", "torch-abi", "abi-symbol", "python-abi", "missing-library")
                    if c in codes
                ),
                code,
            )
        if code == "import-error" and _pinned(primary, data):
            code = "pin-broken"
        more = f" (+{len(failed) - 1} more)" if len(failed) > 1 else ""
        return Verdict("fail", code, f"import {primary.what}: {primary.message}{more}")
    gpu = [p for p in imports if p.status == "gpu"]
    if gpu:
        return Verdict("needs-gpu", "needs-gpu", f"import {gpu[0].what}: {gpu[0].message}")
    if lib_failed:
        first = lib_failed[0]
        return Verdict("warn", classify(first, data), f"{first.what}: {first.message}")
    return Verdict("pass", "none", f"{len(imports)} imports, {len(libraries)} libraries load")


# ----------------------------------------------------------------------------------------------------
# the lab


def lab_env(lab: Path, uv: str) -> dict[str, str]:
    """The lab's environment: this one, less what would point it elsewhere, with LAB/src first. Not the
    probes' ``clean_env``: its ``PYTHONWARNINGS=ignore`` would hide from the lab the warnings it reads."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"PYTHONPATH", "LD_LIBRARY_PATH", "LD_PRELOAD", "VIRTUAL_ENV", "PYTHONHOME", "PYTHONWARNINGS"}
    }
    env["PYTHONPATH"] = str(lab / "src")
    env["PATH"] = os.pathsep.join([str(Path(uv).parent), os.environ.get("PATH", "")])
    return env


def run_lab(lab: Path, env: Path, out: Path, uv: str) -> tuple[dict[str, Any] | None, str, float]:
    if out.exists():
        shutil.rmtree(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    done = run(
        [sys.executable, "-m", "compatlab", "check", "--venv", str(env), "--out", str(out), "-q"],
        timeout=LAB_TIMEOUT_S,
        env=lab_env(lab, uv),
        cwd=lab,
    )
    seconds = time.monotonic() - start
    (out.parent / f"{out.name}.log").write_text(done.stdout + done.stderr)
    ran = {"seconds": round(seconds, 1), "rc": done.rc, "stderr": last_line(done.stderr)}
    (out.parent / f"{out.name}.run.json").write_text(json.dumps(ran))
    return read_lab(out)


def read_lab(out: Path) -> tuple[dict[str, Any] | None, str, float]:
    """The cell of a lab run's results.json, why there is none, and how long the run took."""
    ran = read_json(out.parent / f"{out.name}.run.json")
    ran = ran if isinstance(ran, dict) else {}
    seconds = float(ran.get("seconds", 0.0))
    results = read_json(out / "results.json")
    if not isinstance(results, dict) or not results.get("cells"):
        return None, f"no results.json (exit {ran.get('rc', '?')}): {ran.get('stderr', '')}", seconds
    cell = results["cells"][0]
    return (cell if isinstance(cell, dict) else None), "", seconds


def _walk(value: Any, *, warned: bool = False) -> Iterator[str]:
    """The strings of a stage's details that are warnings: the items of a ``warnings`` list, and the
    ``module`` and ``message`` of a finding whose ``severity`` (or ``level``) is warn. Nothing else: a
    details table's own ``state`` says nothing of which of its strings warn (the static stage's lists every
    module of every distribution)."""
    if isinstance(value, dict):
        if value.get("severity") in ("warn", "warning") or value.get("level") in ("warn", "warning"):
            yield from (str(value[k]) for k in ("module", "message", "name", "reason") if value.get(k))
        for key, item in value.items():
            yield from _walk(item, warned=warned or key in ("warnings", "warn"))
    elif isinstance(value, list):
        for item in value:
            yield from _walk(item, warned=warned)
    elif isinstance(value, str) and warned:
        yield value


def lab_warnings(cell: Mapping[str, Any]) -> list[str]:
    texts: list[str] = []
    for stage in cell.get("stages", []):
        if stage.get("state") == "warn":
            texts.append(str(stage.get("reason", "")))
        texts.extend(_walk(stage.get("details", {})))
    return texts


def lab_causes(cell: Mapping[str, Any]) -> set[str]:
    codes = {str(c.get("code")) for c in cell.get("causes", []) or [] if isinstance(c, dict)}
    codes |= {str(s["cause"]) for s in cell.get("stages", []) if s.get("cause") and s.get("state") == "fail"}
    return codes


def lab_stages(cell: Mapping[str, Any]) -> str:
    """The stages that did not pass, as ``name=state[:cause]`` (a skipped serve stage left out)."""
    out = []
    for stage in cell.get("stages", []):
        state, cause = str(stage.get("state")), str(stage.get("cause") or "")
        if state != "pass" and not (stage.get("name") == "serve" and state == "skip" and not cause):
            out.append(f"{stage.get('name')}={state}" + (f":{cause}" if cause else ""))
    return " ".join(out)


def lab_reason(cell: Mapping[str, Any]) -> str:
    parts = [str(cell.get("reason") or "")]
    parts += [str(s.get("reason") or "") for s in cell.get("stages", []) if s.get("state") in ("fail", "error")]
    parts += [str(c.get("reason") or "") for c in cell.get("causes", []) or [] if isinstance(c, dict)]
    out: list[str] = []
    for part in parts:
        if part and part not in out:
            out.append(part)
    return " | ".join(out)


@dataclasses.dataclass(kw_only=True, slots=True)
class Row:
    case: str
    category: str
    truth: str
    code: str
    measured: str
    broken: bool
    evidence: str
    code_differs: bool = False
    lab_state: str = ""
    lab_causes: list[str] = dataclasses.field(default_factory=list)
    lab_stages: str = ""
    lab_reason: str = ""
    lab_seconds: float = 0.0
    right: bool = False
    why: str = ""


WRONG_KINDS = ("false red", "false green", "wrong cause", "no warning", "lab error", "lab state")


def judge(case: Case, cell: Mapping[str, Any] | None, problem: str) -> tuple[bool, str]:
    """Right or wrong, and why in a few words (a wrong one's why starts with one of WRONG_KINDS)."""
    if cell is None:
        return False, "lab error: " + problem
    state = str(cell.get("state"))
    if state == "error":
        return False, "lab error: the cell is error"
    if case.truth != "fail":
        if state == "fail":
            return False, "false red"
        if state not in ("pass", "partial"):
            return False, f"lab state {state}"
        if case.truth == "warn":
            named = [t for t in lab_warnings(cell) if case.warn_package.lower() in t.lower()]
            if not named:
                return False, f"no warning names {case.warn_package}"
            return True, f"{state}, a warning names {case.warn_package}"
        return True, state
    if state != "fail":
        return False, "false green"
    codes = lab_causes(cell)
    if codes:
        hit = sorted(codes & case.codes())
        if hit:
            return True, "fail, cause " + ", ".join(hit)
        return False, "wrong cause: " + ", ".join(sorted(codes))
    reason = lab_reason(cell).lower()
    hit = [k for k in case.keywords if k.lower() in reason]
    if hit:
        return True, f"fail, reason says {hit[0]!r}"
    return False, "wrong cause: the reason names none of " + ", ".join(repr(k) for k in case.keywords)


# ----------------------------------------------------------------------------------------------------
# main


def _cut(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _print_columns(table: Sequence[Sequence[str]], *, last_free: bool = True) -> None:
    fixed = len(table[0]) - 1 if last_free else len(table[0])
    widths = [max(len(row[i]) for row in table) for i in range(fixed)]
    for row in table:
        print("  ".join([*(row[i].ljust(widths[i]) for i in range(fixed)), *row[fixed:]]).rstrip())


def print_table(rows: Sequence[Row], *, lab: bool) -> None:
    head = ["case", "class", "truth (code)", "measured"]
    if lab:
        head += ["lab [causes]", "stages not passed", "s", "verdict", "lab reason"]
    table = [head]
    for r in rows:
        line = [
            r.case,
            r.category,
            f"{r.truth} ({r.code})",
            ("BROKEN " if r.broken else "") + r.measured + (" code≠" if r.code_differs and not r.broken else ""),
        ]
        if lab:
            verdict = "broken: not scored" if r.broken else ("right: " if r.right else "WRONG: ") + r.why
            line += [
                (r.lab_state or "-") + (f" [{','.join(r.lab_causes)}]" if r.lab_causes else ""),
                r.lab_stages,
                f"{r.lab_seconds:.0f}",
                _cut(verdict, 60),
                _cut(r.lab_reason, 140),
            ]
        table.append(line)
    _print_columns(table, last_free=lab)


def _counts(rows: Sequence[Row]) -> dict[str, int]:
    counted = {w: sum(r.why.startswith(w) and not r.right for r in rows) for w in WRONG_KINDS}
    counted["lab error"] += counted.pop("lab state")
    return counted


def print_scores(rows: Sequence[Row]) -> tuple[int, int]:
    """Per class, then in all: right/scored (BROKEN cases left out) and the wrong ones by kind."""
    classes = list(dict.fromkeys(r.category for r in rows))
    head = ["class", "score", "false red", "false green", "wrong cause", "no warning", "lab error", "broken"]
    table = [head]
    for name in [*classes, "ALL"]:
        mine = [r for r in rows if name in ("ALL", r.category)]
        scored = [r for r in mine if not r.broken]
        c = _counts(scored)
        table.append(
            [
                name,
                f"{sum(r.right for r in scored)}/{len(scored)}",
                *(str(c[k]) for k in ("false red", "false green", "wrong cause", "no warning", "lab error")),
                str(len(mine) - len(scored)),
            ]
        )
    print()
    _print_columns(table, last_free=False)
    scored = [r for r in rows if not r.broken]
    return sum(r.right for r in scored), len(scored)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "-k", dest="select", action="append", default=[], help="only the cases whose name contains SUBSTR (repeatable)"
    )
    parser.add_argument("--envs", type=Path, default=Path("/work/truth-envs"), help="where the envs are kept")
    parser.add_argument("--lab", type=Path, default=REPO_ROOT, help="the lab's source tree (its src/ is used)")
    parser.add_argument("--lab-out", type=Path, help="where the lab's outputs go (default ENVS/_lab/<lab's name>)")
    parser.add_argument("--json", type=Path, help="write the table to this file")
    parser.add_argument("--list", action="store_true", help="list the cases and exit")
    parser.add_argument("--truth-only", action="store_true", help="build and measure; do not run the lab")
    parser.add_argument("--remeasure", action="store_true", help="measure the truth again even if recorded")
    parser.add_argument(
        "--rejudge", action="store_true", help="judge the lab's outputs already in --lab-out; do not run the lab"
    )
    args = parser.parse_args(argv)
    cases = [c for c in CASES if not args.select or any(k in c.name for k in args.select)]
    if args.list:
        for c in cases:
            print(f"{c.name:42} {c.category:11} {c.truth:9} {c.code:16} {' ; '.join(' '.join(s) for s in c.steps)}")
        return 0
    if not cases:
        parser.error(f"no case matches {' or '.join(map(repr, args.select))}")
    lab = args.lab.resolve()
    if not args.truth_only and not (lab / "src" / "compatlab").is_dir():
        parser.error(f"{lab}: no src/compatlab there")
    lab_out = args.lab_out or args.envs / "_lab" / lab.name
    uv = find_uv()
    args.envs.mkdir(parents=True, exist_ok=True)
    log = args.envs / "build.log"
    start = time.monotonic()
    rows: list[Row] = []
    for case in cases:
        t0 = time.monotonic()
        try:
            env, built = build(case, args.envs, uv, log)
            data = measured(case, env, uv, fresh=args.remeasure or built)
        except (RuntimeError, OSError) as exc:
            print(f"!!! {case.name}: cannot build or measure: {exc}", file=sys.stderr)
            rows.append(
                Row(
                    case=case.name,
                    category=case.category,
                    truth=case.truth,
                    code=case.code,
                    measured="?",
                    broken=True,
                    evidence=str(exc),
                    why="not built",
                )
            )
            continue
        verdict = derive(case, data)
        broken = verdict.truth != case.truth
        differs = not broken and case.truth != "pass" and verdict.code not in case.codes()
        if broken:
            print(
                f"!!! BROKEN CASE {case.name}: declared {case.truth} ({case.code}), measured {verdict.truth} "
                f"({verdict.code}): {verdict.evidence}",
                file=sys.stderr,
            )
        elif differs:
            print(
                f"!!! {case.name}: declared cause {case.code}, measured {verdict.code}: {verdict.evidence}",
                file=sys.stderr,
            )
        row = Row(
            case=case.name,
            category=case.category,
            truth=case.truth,
            code=case.code,
            measured=f"{verdict.truth} ({verdict.code})",
            broken=broken,
            evidence=verdict.evidence,
            code_differs=differs,
        )
        if not args.truth_only:
            out = lab_out / case.name
            cell, problem, row.lab_seconds = read_lab(out) if args.rejudge else run_lab(lab, env, out, uv)
            row.right, row.why = judge(case, cell, problem)
            if cell is not None:
                row.lab_state = str(cell.get("state"))
                row.lab_causes = sorted(lab_causes(cell))
                row.lab_stages = lab_stages(cell)
                row.lab_reason = lab_reason(cell)
            else:
                row.lab_reason = problem
        print(
            f"... {case.name}: truth {row.measured} — {_cut(verdict.evidence, 100)}; lab {row.lab_state or '-'} "
            f"({time.monotonic() - t0:.0f} s)",
            file=sys.stderr,
            flush=True,
        )
        rows.append(row)
    seconds = time.monotonic() - start
    print_table(rows, lab=not args.truth_only)
    scored = [r for r in rows if not r.broken]
    broken_n = len(rows) - len(scored)
    if args.truth_only:
        differ = sum(r.code_differs for r in rows)
        print(
            f"\ntruth only: {len(scored)}/{len(rows)} cases measured as declared (causes differ: {differ}); "
            f"{seconds:.0f} s"
        )
        ok = broken_n == 0
    else:
        right, total = print_scores(rows)
        tally = _counts(scored)
        lab_s = sum(r.lab_seconds for r in rows)
        recorded = " as recorded (rejudged)" if args.rejudge else ""
        print(
            f"\nscore {right}/{total} right (broken cases left out: {broken_n}); false red {tally['false red']}, "
            f"false green {tally['false green']}, wrong cause {tally['wrong cause']}, "
            f"warning missing {tally['no warning']}, "
            f"lab error {tally['lab error']}; lab checks {lab_s:.0f} s{recorded}, "
            f"all {seconds:.0f} s (lab {lab}, outputs {lab_out})"
        )
        ok = broken_n == 0 and right == total
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                {
                    "lab": str(lab),
                    "lab_commit": _commit(lab),
                    "seconds": round(seconds, 1),
                    "rows": [dataclasses.asdict(r) for r in rows],
                },
                indent=1,
            )
        )
    return 0 if ok else 1


def _commit(lab: Path) -> str:
    done = run(["git", "-C", str(lab), "rev-parse", "HEAD"], timeout=TOOL_TIMEOUT_S)
    return done.stdout.strip() if done.rc == 0 else ""


if __name__ == "__main__":
    sys.exit(main())
