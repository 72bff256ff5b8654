"""How the import stage names a file of the environment: its label, the path relative to site-packages.

A label is how a distribution's RECORD spells the file (``torch/lib/libtorch_cuda.so``,
``sgl_kernel/sm90/common_ops.abi3.so``); its first part is the top-level package that owns it. A path under
no entry of ``sys.path`` keeps its whole path.
"""

from __future__ import annotations

import functools
import os
import sys

from compatlab.incell.loading.installed import LoadTarget

__all__ = ["real_path", "record_label", "site_label"]


def site_label(path: str) -> str:
    """*path* relative to the longest entry of ``sys.path`` it is under, else *path*."""
    for entry in sorted((e for e in sys.path if e), key=len, reverse=True):
        if path.startswith(entry.rstrip("/") + "/"):
            return path[len(entry.rstrip("/")) + 1 :]
    return path


def record_label(path: str, targets: list[LoadTarget]) -> str:
    """A shared object's label as its distribution's RECORD spells it (relative to site-packages): that of
    the target that is the same file, else *path* relative to the first entry of ``sys.path`` it is under."""
    real = real_path(path)
    for t in targets:
        if t.path is not None and real_path(t.path) == real:
            return t.label
    for entry in sys.path:
        if entry and path.startswith(entry.rstrip("/") + "/"):
            return path[len(entry.rstrip("/")) + 1 :]
    return path


@functools.lru_cache(maxsize=65536)
def real_path(path: str) -> str:
    """``os.path.realpath``, each path resolved once in this process: the stage asks of the same files again
    and again (record_label compares each shared object of a distribution with each of its targets, 37,000
    calls for 1,400 paths in sglang's environment, 1.8 s; and each package import's mapped files), and
    within one stage the links of an environment do not move."""
    return os.path.realpath(path)
