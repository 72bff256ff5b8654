"""reports/latest: the newest run of a matrix, the whole matrix, beside its rendered grid (a site root).

``write_latest`` holds ``flock`` on the latest folder (runs/locks.py), waiting at most LATEST_WAIT seconds
for another writer (StaleRun naming who holds it, from its ``.writer`` file, said only while it is held), and
replaces its files only for a run at least as new as the one its results.json shows (``RunInfo.order``:
start time in ns, then id); an older run never overwrites a newer latest. One folder shows one matrix: a run
of another matrix leaves it as it is. Each file is replaced atomically, results.json last, and redacted again
(a run written before the lab kept credentials out must not publish them).

latest is the whole matrix (``whole_matrix``): a run that ran some of its cells replaces those and keeps the
others, each marked with the run it came from; a cell the run only preflighted (``--until``) keeps the
fuller verdict shown. A run's own folder (``report`` without ``--out``) gets the rendered files only: its
results.json and its lock belong to its owner.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import logging
import os
import socket
import time
from collections.abc import Mapping
from pathlib import Path

from compatlab.errors import ConfigError, LabError, Unwritable
from compatlab.runs.atomic import write_atomic
from compatlab.runs.files import RESULTS, RUN_JSON, json_bytes, load_results
from compatlab.runs.locks import open_dir
from compatlab.runs.model import CellState, Results, RunInfo
from compatlab.urls import redact_text

__all__ = ["LATEST_WAIT", "StaleRun", "whole_matrix", "write_latest"]

# The name these records always had, before reports/latest moved out of compatlab.runs.store.
log = logging.getLogger("compatlab.runs.store")


class StaleRun(LabError):
    """A folder shows a newer run than the one offered to it; it was left as it is."""


def _shown_results(folder: Path) -> Results | None:
    path = folder / RESULTS
    if not path.exists():
        return None
    try:
        return load_results(path)
    except ConfigError as exc:
        log.warning("replacing an unreadable %s", exc)
        return None


def _shown(folder: Path) -> RunInfo | None:
    shown = _shown_results(folder)
    return shown.run if shown is not None else None


def whole_matrix(folder: Path, results: Results) -> Results:
    """*results* as *folder* (reports/latest) shows them: the whole matrix, not only what the run ran.

    A run of one cell or of a ``-k``/``-t`` subset brings its cells; every other cell of its matrix that the
    folder showed (from an older run of a matrix of the same name) stays, marked with the run it came from.
    A cell the run only preflighted (`--until`) keeps the fuller verdict the folder showed. A folder showing
    another matrix, or a newer run, is not merged with.
    """
    shown = _shown_results(folder)
    if shown is None or shown.run.matrix_name != results.run.matrix_name or shown.run.order > results.run.order:
        return results
    # A preflight's verdict (`--until`) never replaces a fuller one of the same cell: the fuller stays.
    fuller = {c.id: c for c in shown.cells if not c.preflight and c.state != CellState.NA}
    thin = {c.id for c in results.cells if c.preflight and c.id in fuller}
    have = {c.id for c in results.cells} - thin
    older = {c.id: c for c in shown.cells if c.id not in have}
    if not older:
        return results
    results = dataclasses.replace(results, cells=tuple(c for c in results.cells if c.id not in thin))
    kept = []
    for cid in results.run.planned:
        cell = older.get(cid)
        if cell is not None:
            origin = cell.run or shown.run.id
            kept.append(dataclasses.replace(cell, run="" if origin == results.run.id else origin))
    order = {cid: i for i, cid in enumerate(results.run.planned)}
    cells = sorted([*results.cells, *kept], key=lambda c: (order.get(c.id, len(order)), c.id))
    return dataclasses.replace(results, cells=tuple(cells))


LATEST_WAIT = 120.0  # seconds a writer of reports/latest waits for another one before leaving it as it is
_WRITER = ".writer"  # who holds the folder's lock: "pid host run", written when the lock is taken


def _lock_latest(fd: int, folder: Path, run_id: str) -> None:
    """flock *folder* (reports/latest) within LATEST_WAIT seconds, then say who holds it in its .writer file;
    StaleRun naming the holder when the wait runs out (the run's own folder still has every result)."""
    deadline = time.monotonic() + LATEST_WAIT
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() >= deadline:
                try:
                    who = (folder / _WRITER).read_text(encoding="utf-8").strip() or "another process"
                except OSError:
                    who = "another process"
                raise StaleRun(
                    f"{folder} is being written by {who} and stayed locked for {LATEST_WAIT:.0f} s: left as it is; "
                    f"run {run_id}'s results are in its run folder (`compatlab report` shows them later)"
                ) from None
            time.sleep(0.2)
    with contextlib.suppress(OSError):
        (folder / _WRITER).write_text(f"pid {os.getpid()} on {socket.gethostname()} (run {run_id})\n", encoding="utf-8")


def write_latest(folder: Path, results: Results, *, files: Mapping[str, str] | None = None) -> list[Path]:
    """Show *results* in *folder* (reports/latest, a site root): its results.json plus *files* (name -> text).

    Each file is replaced atomically, results.json last, under an flock of the folder; StaleRun (nothing
    written) when the folder shows another run that started later. Returns the files written.
    """
    try:
        return _write_latest(folder, results, files=files)
    except Unwritable as exc:
        raise exc.fixed(
            f"make {folder} writable, or render elsewhere (--out; the run folder keeps every result)"
        ) from None


def _write_latest(folder: Path, results: Results, *, files: Mapping[str, str] | None) -> list[Path]:
    if (folder / RUN_JSON).is_file():
        # A run's own folder (`report` without --out): its results.json and its lock belong to its owner.
        shown = _shown(folder)
        if shown is not None and shown.id != results.run.id:
            raise StaleRun(f"{folder} is the folder of run {shown.id}, not of run {results.run.id}: left as it is")
        for name, text in (files or {}).items():
            write_atomic(folder / name, text.encode("utf-8"))
        return [folder / name for name in files or {}]
    fd = open_dir(folder)
    locked = False
    try:
        _lock_latest(fd, folder, results.run.id)
        locked = True
        shown = _shown(folder)
        if shown is not None and shown.matrix_name and shown.matrix_name != results.run.matrix_name:
            # One folder, one matrix: another matrix's run would replace its whole grid.
            raise StaleRun(
                f"{folder} shows the grid of matrix {shown.matrix_name!r}, not of {results.run.matrix_name!r}: "
                "left as it is; give each matrix its own reports folder (COMPATLAB_REPORTS, or --out)"
            )
        if shown is not None and shown.id != results.run.id and shown.order > results.run.order:
            raise StaleRun(
                f"{folder} shows run {shown.id} (started {shown.started}), newer than run "
                f"{results.run.id} (started {results.run.started}): left as it is"
            )
        results = whole_matrix(folder, results)
        written = []
        for name, text in (files or {}).items():
            write_atomic(folder / name, text.encode("utf-8"))
            written.append(folder / name)
        # Redacted again: a run written before the lab kept credentials out must not publish them.
        write_atomic(folder / RESULTS, redact_text(json_bytes(results.to_json()).decode("utf-8")).encode("utf-8"))
        written.append(folder / RESULTS)
        return written
    finally:
        if locked:  # who holds it is said only while it is held: never left in a published folder
            with contextlib.suppress(OSError):
                (folder / _WRITER).unlink()
        os.close(fd)
