"""Pruning a runs folder (``compatlab prune --keep N``): all but the newest N runs are removed.

Newest by ``RunInfo.order`` (the start in ns, then the id), read from run.json, else results.json, else the
start of a run.json of a lab before schemas, else oldest. A run whose folder lock is held (its owner still
runs, runs/locks.py) is kept, with a warning.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

from compatlab.errors import ConfigError, LabError, UsageError
from compatlab.runs.files import RESULTS, RUN_JSON, load_results, results_in, run_info
from compatlab.runs.locks import probe_held
from compatlab.runs.model import RunInfo

__all__ = ["prune_runs"]

# The name these records always had, before pruning moved out of compatlab.runs.store.
log = logging.getLogger("compatlab.runs.store")


def _in_use(run_dir: Path) -> bool:
    try:
        fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return False
    try:
        return probe_held(fd)
    finally:
        os.close(fd)


def prune_runs(runs_dir: Path, keep: int) -> list[Path]:
    """Delete all but the newest *keep* runs (by start); a run in use is kept. Returns what was removed."""
    if keep < 1:
        raise UsageError(f"--keep: expected a positive number of runs, got {keep}")

    def order(results: Path) -> tuple[int, str]:
        try:
            return run_info(results.parent).order
        except ConfigError as exc:
            log.debug("%s", exc)
        try:
            return load_results(results).run.order
        except ConfigError as exc:
            log.debug("%s", exc)
        try:  # a run.json of a lab before schemas: only its start matters here
            legacy = json.loads((results.parent / RUN_JSON).read_text(encoding="utf-8"))
            return RunInfo(id=results.parent.name, started=str(legacy["started"])).order
        except (OSError, ValueError, TypeError, KeyError, RecursionError):
            return (0, results.parent.name)

    runs = sorted((p.parent for p in results_in(runs_dir)), key=lambda d: order(d / RESULTS))
    doomed = []
    for path in runs[:-keep]:
        if _in_use(path):
            log.warning("%s: in use by a running process; kept", path)
            continue
        try:
            shutil.rmtree(path)
        except OSError as exc:
            raise LabError(f"cannot remove {exc.filename or path}: {exc.strerror or exc}") from None
        doomed.append(path)
    return doomed
