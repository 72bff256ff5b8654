"""The run folder: its layout, its one owner, and the writing of its cells and results.

Layout (``reports/`` is ``$COMPATLAB_REPORTS``):

    runs/<run-id>/run.json          RUN_SCHEMA: id, start, host, matrix and the run's owner
    runs/<run-id>/cells/<id>.json   CELL_SCHEMA: one cell's result, written as the cell finishes
    runs/<run-id>/cells/<id>/       the cell's work folder (install spec, logs): not a result
    runs/<run-id>/results.json      SCHEMA: the run and every cell, rewritten after each cell
    latest/results.json             the newest run's results.json, beside its rendered grid

Every file is written to a temporary file in its folder, fsynced, then ``os.replace``d over the old one:
a reader sees the old file or the new one, never half of one. The files are read in runs/files.py (a cell
file that cannot be read is an ``error`` cell, never dropped), latest/ is written in runs/latest.py, shards
are merged into a run in runs/merge.py and old runs pruned in runs/prune.py; this module keeps their public
names but the merge's and the prune's.

Ownership: one process owns a run. It holds ``flock(LOCK_EX)`` on the run folder itself (an fd of the
directory: no lock file to publish or prune, runs/locks.py) for as long as the run lasts, and run.json records
it as ``owner`` (``host:pid:token``). ``nox -s matrix`` is that process: it claims the run (claim_run) and
passes the owner string to every cell process (``compatlab cell --owner``), which joins it (join_run).
Before each write a joined process checks that the lock is still held (a ``LOCK_SH|LOCK_NB`` probe that
must fail) and that run.json still names its owner. So ``kill -9`` of nox frees the lock at once (the
kernel drops it with the process) and its orphaned cells stop writing; a second run of the same id
cannot claim a folder that is held, and once it holds one, a cell of the dead run sees another owner.
A cell started without ``--owner`` (by hand) claims the run itself for its duration.

Finished: run.json's ``complete`` is false from the claim until the owner finishes the run (``RunFolder.finish``:
the end of ``nox -s matrix``, of a cell run by hand, of a merge or a check); a run killed or interrupted stays
incomplete. History compares only with finished runs of the same matrix (``RunInfo.done``, ``same_matrix``),
and a merge never writes into another run (finished, or interrupted with cells of its own).

A failed write (read-only or full disk, no permission) is a LabError naming the path. A finished cell's
result is never lost with it: write_cell then keeps it in
``$XDG_STATE_HOME/compatlab/unsaved/<run-id>/cells/<id>.json`` (``~/.local/state`` by default, else the
temporary folder) and the error says where; where nothing can be written, the error carries the JSON.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import fcntl
import json
import logging
import os
import secrets
import socket
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from compatlab.errors import ConfigError, LabError, Unwritable, UsageError
from compatlab.runs.atomic import write_atomic
from compatlab.runs.files import (
    CELLS,
    RESULTS,
    RUN_JSON,
    cell_file,
    json_bytes,
    load_results,
    read_cell,
    read_cells,
    results_in,
    run_info,
    write_run_json,
)
from compatlab.runs.latest import StaleRun, whole_matrix, write_latest
from compatlab.runs.locks import open_dir, probe_held
from compatlab.runs.model import CELL_SCHEMA, CellResult, CellState, Results, RunInfo
from compatlab.runs.planned import Planned

__all__ = [
    "DEFAULT_RESULTS",
    "DEFAULT_RUNS",
    "NotOwner",
    "RunFolder",
    "StaleRun",
    "UnsavedResult",
    "cell_file",
    "claim_run",
    "join_run",
    "load_results",
    "now_iso",
    "read_cell",
    "read_cells",
    "results_in",
    "run_info",
    "unsaved_dir",
    "whole_matrix",
    "write_latest",
]

log = logging.getLogger(__name__)

# Where `nox -s matrix` leaves the newest grid and every run (``$COMPATLAB_REPORTS`` is reports/).
DEFAULT_RESULTS = Path("reports/latest") / RESULTS
DEFAULT_RUNS = Path("reports/runs")
CLAIM_TRIES = 20  # a joined cell's probe holds the lock for microseconds; a claim waits that out


class NotOwner(LabError):
    """This process may not write the run: its owner died, or another process owns the run now."""


class UnsavedResult(LabError):
    """A finished cell's result could not be written into its run; ``kept`` is where it is instead."""

    def __init__(self, message: str, kept: Path | None) -> None:
        super().__init__(message)
        self.kept = kept


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def unsaved_dir(run_id: str) -> Path:
    """Where a cell result goes that its run folder cannot take (see the module docstring)."""
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "compatlab" / "unsaved" / run_id


def _keep(run_id: str, result: CellResult, data: Mapping[str, Any]) -> tuple[Path | None, str]:
    """Save a result that its run cannot take; returns where and the sentence that says so."""
    tried = []
    candidates = []
    with contextlib.suppress(RuntimeError):  # no home folder to put ~/.local/state in
        candidates.append(unsaved_dir(run_id))
    candidates.append(Path(tempfile.gettempdir()) / f"compatlab-unsaved-{os.getuid()}" / run_id)
    for folder in candidates:
        target = folder / CELLS / f"{result.id}.json"
        try:
            write_atomic(target, json_bytes(data))
        except LabError as exc:
            tried.append(str(exc))
            continue
        return target, (
            f"the result is kept in {target}; to bring it back: compatlab merge <run folder> {folder} "
            "--out <new run folder>"
        )
    return None, (
        "it could not be kept anywhere else either (" + "; ".join(tried) + "); here it is: " + json.dumps(data)
    )


def _owner_words(owner: str) -> str:
    host, _, rest = owner.partition(":")
    pid = rest.partition(":")[0]
    return f"pid {pid} on {host}" if pid else "another process"


class RunFolder:
    """The right to write one run folder: held as its owner, or checked before each write as its cell.

    Use as a context manager, or close(); closing an owner releases the run's lock.
    """

    def __init__(self, path: Path, info: RunInfo, *, fd: int, owns: bool) -> None:
        self.path = path
        self.id = info.id
        self.owner = info.owner
        self._fd: int | None = fd
        self._owns = owns

    def __enter__(self) -> RunFolder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the fd drops the flock
            self._fd = None

    @property
    def results_path(self) -> Path:
        return self.path / RESULTS

    def check(self) -> None:
        """Raise NotOwner unless this process may write the run now."""
        if self._fd is None:
            raise NotOwner(f"{self.path}: this handle on run {self.id} is closed")
        if self._owns:
            return
        if not probe_held(self._fd):
            raise NotOwner(
                f"run {self.id} has no owner any more (the process that started it, "
                f"{_owner_words(self.owner)}, exited or was killed): nothing is written into {self.path}"
            )
        try:
            now = run_info(self.path).owner
        except ConfigError as exc:
            raise NotOwner(f"run {self.id}: cannot tell who owns it: {exc}") from None
        if now != self.owner:
            raise NotOwner(
                f"run {self.id} now belongs to another process ({_owner_words(now)}): "
                f"nothing is written into {self.path}"
            )

    def work_dir(self, cell_id: str) -> Path:
        """The cell's work folder ``cells/<id>/``, made; LabError naming it when it cannot be.

        Absolute: the stages hand it to processes that run in it (a relative one would name itself twice).
        """
        path = self.path.absolute() / CELLS / cell_file(self.path, cell_id).stem
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise Unwritable(path, exc.strerror or str(exc), run_fix(self.path)) from None
        return path

    def read_cell(self, cell_id: str) -> CellResult | None:
        return read_cell(self.path, cell_id)

    def write_cell(self, result: CellResult) -> Path:
        """Write ``cells/<id>.json``; when that fails the result is kept elsewhere (UnsavedResult says where)."""
        path = cell_file(self.path, result.id)
        data = {"schema": CELL_SCHEMA, **result.to_json()}
        try:
            self.check()
            write_atomic(path, json_bytes(data))
        except LabError as exc:
            kept, words = _keep(self.id, result, data)
            raise UnsavedResult(f"{exc}; {words}", kept) from None
        return path

    def finish(self, plan: Planned, *, latest: Path | None) -> Results:
        """The owner's end of the run: run.json says it is complete (RunInfo.done), then ``aggregate``. A run whose
        owner never gets here (killed, interrupted) stays incomplete: history never compares with it."""
        if not self._owns:
            raise NotOwner(f"run {self.id}: only its owner finishes it")
        try:
            write_run_json(self.path, dataclasses.replace(run_info(self.path), complete=True))
        except Unwritable as exc:
            raise exc.fixed(run_fix(self.path)) from None
        return self.aggregate(plan, latest=latest)

    def aggregate(self, plan: Planned, *, latest: Path | None) -> Results:
        """(Re)write results.json from the cell files, and offer it to *latest* (see write_latest)."""
        self.check()
        info = run_info(self.path)
        cells = plan.cells
        planned = {c.id: c for c in cells}
        order = {c.id: i for i, c in enumerate(cells)}
        found = [r for _, r in read_cells(self.path, planned)]
        # An n/a cell is a fact of the matrix, not of a run: no process is started for it, it is written here.
        have = {c.id for c in found}
        found += [
            CellResult(id=c.id, axes=dict(c.axes), state=CellState.NA, reason=c.na)
            for c in cells
            if c.na is not None and c.id not in have
        ]
        found.sort(key=lambda c: (order.get(c.id, len(order)), c.id))
        run = dataclasses.replace(
            info,
            owner="",
            finished=max((c.finished for c in found if c.finished), default=None),
            report={part: tuple(plan.report.get(part, ())) for part in ("rows", "columns", "tables")},
            axes={name: tuple(values) for name, values in plan.axes.items()},
            planned=tuple(c.id for c in cells),
        )
        results = Results(run=run, cells=tuple(found))
        self.check()
        try:
            write_atomic(self.results_path, json_bytes(results.to_json()))
        except Unwritable as exc:
            raise exc.fixed(run_fix(self.path)) from None
        if latest is not None:
            try:
                write_latest(latest, results)
            except StaleRun as exc:
                log.warning("%s", exc)
        return results


def run_fix(run_dir: Path) -> str:
    """What to do about a run folder that cannot be written: the folder named is the one that is there (a
    run folder not made yet lies in a folder that is: the mount or permission to fix)."""
    there = run_dir
    while not there.exists() and there.parent != there:
        there = there.parent
    return f"make {there} writable, or write the run elsewhere (COMPATLAB_REPORTS for nox, --run-dir, --out)"


def claim_run(
    run_dir: Path,
    *,
    run_id: str,
    plan: Planned,
    restart: bool = False,
    host: Mapping[str, Any] | Callable[[], Mapping[str, Any]],
    shards: Sequence[str] = (),
    hosts: Sequence[Mapping[str, Any]] = (),
) -> RunFolder:
    """Own *run_dir* until the returned folder is closed; writes run.json naming this process.

    *host* is the machine's facts for run.json, or a function that finds them (``host.host_facts``), called
    only for a new run. An existing run keeps its start and host (more stages added to it later), unless
    *restart* (a merge writes a new run: UsageError when the folder holds another run, see _refuse_a_run). The
    run is incomplete until ``RunFolder.finish``. LabError when another process owns the run or the folder cannot
    be written.
    """
    from compatlab.runs.names import check_name

    check_name(run_id, "run id")  # before anything is written
    try:
        fd = open_dir(run_dir)
    except Unwritable as exc:
        raise exc.fixed(run_fix(run_dir)) from None
    for attempt in range(CLAIM_TRIES):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if attempt == CLAIM_TRIES - 1:
                os.close(fd)
                try:
                    who = _owner_words(run_info(run_dir).owner)
                except ConfigError:
                    who = "another process"
                raise LabError(
                    f"{run_dir}: run {run_id} is in use by {who}; one run belongs to one process at a "
                    "time: wait for it to finish, or choose another run id (COMPATLAB_RUN_ID)"
                ) from None
            time.sleep(0.05)
    try:
        if restart:
            _refuse_a_run(run_dir)
        owner = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(8)}"
        before = run_info(run_dir) if (run_dir / RUN_JSON).exists() and not restart else None
        if before is not None:
            # Written again: not finished until this owner finishes it (an interrupted addition is no end).
            info = dataclasses.replace(before, owner=owner, complete=False)
        else:
            info = RunInfo(
                id=run_id,
                started=now_iso(),
                started_ns=time.time_ns(),
                matrix=plan.path,
                matrix_name=plan.name,
                host=dict(host() if callable(host) else host),
                owner=owner,
                complete=False,
                shards=tuple(shards),
                hosts=tuple(dict(h) for h in hosts),
            )
        write_run_json(run_dir, info)
    except Unwritable as exc:
        os.close(fd)
        raise exc.fixed(run_fix(run_dir)) from None
    except BaseException:
        os.close(fd)
        raise
    return RunFolder(run_dir, info, fd=fd, owns=True)


def _refuse_a_run(run_dir: Path) -> None:
    """UsageError when *run_dir* holds a run that a merge would replace: a finished one (RunInfo.done), or an
    interrupted one whose cells are its own. Only an interrupted merge (it lists its shards) is written again."""
    infos: list[RunInfo] = []
    with contextlib.suppress(ConfigError):  # none there, or unreadable: no result of its own to lose
        infos.append(run_info(run_dir))
    with contextlib.suppress(ConfigError):
        infos.append(load_results(run_dir / RESULTS).run)
    if not infos:
        return
    info, done = infos[-1], any(i.done for i in infos)
    if not done and any(i.shards for i in infos):
        return
    when = (f", finished {info.finished}" if info.finished else ", finished") if done else ", interrupted"
    raise UsageError(
        f"{run_dir}: holds run {info.id} (started {info.started}{when}); a merge writes a new run, never into "
        "another one: give --out a new folder"
    )


def join_run(run_dir: Path, *, owner: str) -> RunFolder:
    """Write into a run that *owner* (claim_run's ``owner`` string, handed down) holds; NotOwner if not."""
    try:
        fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        raise NotOwner(f"{run_dir}: no run to join ({exc.strerror}); its owner creates it") from None
    try:
        info = run_info(run_dir)
        folder = RunFolder(run_dir, dataclasses.replace(info, owner=owner), fd=fd, owns=False)
        folder.check()
    except BaseException:
        os.close(fd)
        raise
    return folder
