"""What a load tried, as the probe (``probe.steps``) and the loader recorded it.

The probe ends its stderr with one line, ``RESULT_TAG`` and its record as JSON (a fork server's child sends
the same record over a pipe, and the client appends it to stderr the same way): a package import's record says
which shared objects were mapped when it finished (``mapped``) and every shared object it tried to load, in
order (``attempts``). What C code asked ``dlopen`` for no Python door sees: glibc's ``LD_DEBUG=files`` log does.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from compatlab.incell.probe import RESULT_TAG
from compatlab.incell.proc import Completed

__all__ = ["attempts_of", "c_level_failures", "mapped_of", "result_record"]


def result_record(stderr: str) -> dict[str, Any] | None:
    """The probe's record: the last line of *stderr* that starts with RESULT_TAG (None: none, or not a dict)."""
    for line in reversed(stderr.splitlines()):
        if line.startswith(RESULT_TAG):
            try:
                data = json.loads(line[len(RESULT_TAG) :])
            except json.JSONDecodeError:
                return None
            return data if isinstance(data, dict) else None
    return None


def mapped_of(completed: Completed) -> list[str] | None:
    """The shared objects a package import had mapped when it finished (None: not recorded)."""
    record = result_record(completed.stderr)
    mapped = record.get("mapped") if record else None
    return [str(p) for p in mapped] if isinstance(mapped, list) else None


def attempts_of(completed: Completed) -> list[dict[str, Any]] | None:
    """Every shared object a probe's import tried to load, in order (probe.attempts); None: not recorded."""
    record = result_record(completed.stderr)
    tried = record.get("attempts") if record else None
    return [a for a in tried if isinstance(a, dict)] if isinstance(tried, list) else None


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
