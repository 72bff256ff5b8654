"""The CUDA major of a CUDA library and of the environment, told apart: a CUDA 12 library asked for in a CUDA 13
environment (``libcudart.so.12`` beside torch ``+cu130``) is two CUDA majors in one environment, not a library
this machine lacks (the cause ``cuda-major-mix``, not ``missing-library``).
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import os
import re
from pathlib import Path

__all__ = ["CUDA_MAJOR_LIB", "cuda_mix", "env_cuda_major"]

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


def cuda_mix(library: str) -> dict[str, int] | None:
    """{"library": 12, "env": 13} for a CUDA library of another major than the environment's."""
    m = CUDA_MAJOR_LIB.match(os.path.basename(library))
    env = env_cuda_major() if m else None
    if m is None or env is None or int(m.group(2)) == env:
        return None
    return {"library": int(m.group(2)), "env": env}
