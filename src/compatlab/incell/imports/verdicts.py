"""The import stage's verdict on each failed entry, by what the failure says of the stack.

- ``undeclared``: a failure for want of another distribution's module that the package does not declare
  (``missing-dependency``), or a module its package's import does not need (``needed=False``): a warning;
- ``ignored``: a failure of the stack (STACK_KINDS) in a module every target says need not run
  there (its ``not_needed`` globs: sm100/ builds on an H100 box): said, not failed;
- ``broken``: any other failure of the stack: the stage fails, each with its cause code (incell/causes.py;
  ``unclassified`` where none was named);
- ``unjudged``: the loader found no ``libcuda.so.1`` (no driver, and no stand-in): nothing could be judged,
  the lab's error;
- ``needs_gpu``: the module linked and its initialisation wants a GPU (the stand-in said
  CUDA_ERROR_NO_DEVICE): a warning, to be judged on a GPU.
"""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Sequence

from compatlab.incell.context import TargetInfo
from compatlab.incell.entries import ImportEntry
from compatlab.incell.loading.failure import STACK_KINDS

__all__ = ["Verdicts", "and_more", "ignored"]


def ignored(label: str, targets: Sequence[TargetInfo]) -> bool:
    """True when every target says this module need not run there (e.g. sm100/ builds on an H100 box)."""
    if not targets:
        return False
    return all(any(fnmatch.fnmatch(label, g) for g in t.not_needed) for t in targets)


def and_more(items: Sequence[str]) -> str:
    """What follows the first of *items* in a one-line reason: `` (and 2 more)``, or nothing for one."""
    return f" (and {len(items) - 1} more)" if len(items) > 1 else ""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Verdicts:
    """The failed entries' reasons (their verdicts, for those not needed), sorted by verdict in the entries'
    order; ``codes`` the cause code of each of ``broken``."""

    broken: list[str]
    codes: list[str]
    ignored: list[str]
    unjudged: list[str]
    needs_gpu: list[str]
    undeclared: list[str]

    @classmethod
    def of(cls, entries: Sequence[ImportEntry], targets: Sequence[TargetInfo]) -> Verdicts:
        v = cls(broken=[], codes=[], ignored=[], unjudged=[], needs_gpu=[], undeclared=[])
        for entry in entries:
            failure, reason = entry.failure, entry.reason or entry.module
            if failure is None:
                continue
            if failure["kind"] == "missing-dependency" or entry.needed is False:
                v.undeclared.append(entry.verdict or reason)
            elif failure["kind"] in STACK_KINDS:
                if ignored(entry.module, targets):
                    v.ignored.append(reason)
                else:
                    v.broken.append(reason)
                    v.codes.append(entry.cause or "unclassified")
            elif failure.get("library"):  # the loader found no libcuda.so.1: nothing could be judged
                v.unjudged.append(reason)
            else:  # linked fine; its initialisation wants a GPU (the stand-in said CUDA_ERROR_NO_DEVICE)
                v.needs_gpu.append(reason)
        return v
