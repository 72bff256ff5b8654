"""The run folder, read and written here only.

Layout (``reports/`` is ``$COMPATLAB_REPORTS``):

    runs/<run-id>/run.json          RUN_SCHEMA: id, start, host, matrix and the run's owner
    runs/<run-id>/cells/<id>.json   CELL_SCHEMA: one cell's result, written as the cell finishes
    runs/<run-id>/cells/<id>/       the cell's work folder (install spec, logs): not a result
    runs/<run-id>/results.json      SCHEMA: the run and every cell, rewritten after each cell
    latest/results.json             the newest run's results.json, beside its rendered grid

Every file is written to a temporary file in its folder, fsynced, then ``os.replace``d over the old one:
a reader sees the old file or the new one, never half of one.

Reading: a ``cells/*.json`` entry that is a symbolic link, a folder or anything but a regular file is
refused without being followed, and one that cannot be read or is not a cell result of CELL_SCHEMA
(bad JSON, a list, no ``id``, an ``id`` other than its file name) becomes an ``error`` cell whose reason
is ``unreadable result: FILE: why``; it is never dropped, and summary, merge and report exit non-zero.

Ownership: one process owns a run. It holds ``flock(LOCK_EX)`` on the run folder itself (an fd of the
directory: no lock file to publish or prune) for as long as the run lasts, and run.json records it as
``owner`` (``host:pid:token``). ``nox -s matrix`` is that process: it claims the run (claim_run) and
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

latest: ``write_latest`` holds ``flock`` on the latest folder, and replaces its files only for a run at
least as new as the one its results.json shows (``RunInfo.order``: start time in ns, then id); an older
run never overwrites a newer latest. latest is the whole matrix: a run that ran some of its cells replaces
those and keeps the others, each marked with the run it came from (``whole_matrix``).

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
import shutil
import socket
import stat
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from compatlab.errors import ConfigError, LabError, Unwritable, UsageError
from compatlab.runs.atomic import write_atomic
from compatlab.runs.model import (
    CELL_SCHEMA,
    RUN_SCHEMA,
    UNREADABLE,
    CellResult,
    CellState,
    Expectation,
    Results,
    RunInfo,
    ShapeError,
)
from compatlab.runs.planned import Planned, PlannedCell
from compatlab.urls import redact_text

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
    "merge_runs",
    "now_iso",
    "prune_runs",
    "read_cell",
    "read_cells",
    "results_in",
    "run_info",
    "unsaved_dir",
    "whole_matrix",
    "write_latest",
]

log = logging.getLogger(__name__)

RESULTS = "results.json"
# Where `nox -s matrix` leaves the newest grid and every run (``$COMPATLAB_REPORTS`` is reports/).
DEFAULT_RESULTS = Path("reports/latest") / RESULTS
DEFAULT_RUNS = Path("reports/runs")
RUN_JSON = "run.json"
CELLS = "cells"
CLAIM_TRIES = 20  # a joined cell's probe holds the lock for microseconds; a claim waits that out


class NotOwner(LabError):
    """This process may not write the run: its owner died, or another process owns the run now."""


class StaleRun(LabError):
    """A folder shows a newer run than the one offered to it; it was left as it is."""


class UnsavedResult(LabError):
    """A finished cell's result could not be written into its run; ``kept`` is where it is instead."""

    def __init__(self, message: str, kept: Path | None) -> None:
        super().__init__(message)
        self.kept = kept


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def _json_bytes(data: Mapping[str, Any]) -> bytes:
    return (json.dumps(data, indent=2) + "\n").encode("utf-8")


def _read_json(path: Path) -> object:
    """Parse one file; raises ConfigError(path, [why]) with the reader's words."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(str(path), ["no such file; run `nox -s matrix` first"]) from None
    except IsADirectoryError:
        raise ConfigError(str(path), ["is a directory; give the run's results.json"]) from None
    except OSError as exc:
        raise ConfigError(str(path), [f"cannot read: {exc.strerror}"]) from None
    return _parse(raw, str(path))


def _parse(raw: bytes, where: str) -> object:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(where, [f"not UTF-8 text: {exc.reason} at byte {exc.start}"]) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(where, [f"not valid JSON: {exc}"]) from None
    except RecursionError:
        raise ConfigError(where, ["not valid JSON: arrays or objects nested too deeply to read"]) from None


def load_results(path: Path) -> Results:
    """Read and check one results.json; any problem raises ConfigError naming the file."""
    data = _read_json(path)
    try:
        return Results.from_json(data)
    except ShapeError as exc:
        raise ConfigError(str(path), exc.problems) from None


def results_in(runs_dir: Path) -> list[Path]:
    """``<run-id>/results.json`` of every run folder under *runs_dir* (symbolic links not followed)."""
    if not runs_dir.is_dir():
        return []
    found = []
    for entry in sorted(os.scandir(runs_dir), key=lambda e: e.name):
        if entry.is_dir(follow_symlinks=False) and (Path(entry.path) / RESULTS).is_file():
            found.append(Path(entry.path) / RESULTS)
    return found


def run_info(run_dir: Path) -> RunInfo:
    """A run's run.json (who, when, which matrix): what to read of a run without its results; ConfigError when
    it is missing or not one."""
    return _read_run_json(run_dir)


def _read_run_json(run_dir: Path) -> RunInfo:
    path = run_dir / RUN_JSON
    data = _read_json(path)
    if not isinstance(data, dict) or data.get("schema") != RUN_SCHEMA:
        got = data.get("schema") if isinstance(data, dict) else type(data).__name__
        raise ConfigError(str(path), [f"schema: expected {RUN_SCHEMA!r}, got {got!r}"])
    try:
        return RunInfo.from_json({k: v for k, v in data.items() if k != "schema"})
    except ShapeError as exc:
        raise ConfigError(str(path), exc.problems) from None


def _write_run_json(run_dir: Path, info: RunInfo) -> None:
    write_atomic(run_dir / RUN_JSON, _json_bytes({"schema": RUN_SCHEMA, **info.to_json()}))


def cell_file(run_dir: Path, cell_id: str) -> Path:
    if not cell_id or "/" in cell_id or "\0" in cell_id or cell_id.startswith("."):
        raise UsageError(f"{cell_id!r}: not a cell id (a cell id is one file name)")
    return run_dir / CELLS / f"{cell_id}.json"


class _Unreadable(Exception):
    pass


def _read_cell_file(path: Path) -> CellResult:
    """One ``cells/<id>.json``, never following a link; raises _Unreadable(why)."""
    try:
        st = path.lstat()
    except OSError as exc:
        raise _Unreadable(f"cannot read: {exc.strerror}") from None
    if stat.S_ISLNK(st.st_mode):
        raise _Unreadable("a symbolic link, not followed (a cell result must be a regular file)")
    if stat.S_ISDIR(st.st_mode):
        raise _Unreadable("a folder, not a cell result (a cell result must be a regular file)")
    if not stat.S_ISREG(st.st_mode):
        raise _Unreadable("not a regular file (a cell result must be a regular file)")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as fh:
            raw = fh.read()
    except OSError as exc:
        raise _Unreadable(f"cannot read: {exc.strerror}") from None
    try:
        data = _parse(raw, str(path))
    except ConfigError as exc:
        raise _Unreadable("; ".join(exc.problems)) from None
    if not isinstance(data, dict):
        kind = "a list" if isinstance(data, list) else type(data).__name__
        raise _Unreadable(f"expected a cell result (a JSON object), got {kind}")
    if data.get("schema") != CELL_SCHEMA:
        raise _Unreadable(f"schema: expected {CELL_SCHEMA!r}, got {data.get('schema')!r}")
    try:
        cell = CellResult.from_json({k: v for k, v in data.items() if k != "schema"})
    except ShapeError as exc:
        raise _Unreadable("; ".join(exc.problems)) from None
    if cell.id != path.stem:
        raise _Unreadable(f"id: {cell.id!r} is not this file's cell ({path.stem!r})")
    return cell


def _expectation(cell: PlannedCell | None) -> Expectation | None:
    if cell is None or not cell.expect:
        return None
    return Expectation(state=CellState(cell.expect), reason=cell.expect_reason or "")


def _error_cell(cell_id: str, path: Path, why: str, planned: Mapping[str, PlannedCell]) -> CellResult:
    cell = planned.get(cell_id)
    expected = _expectation(cell)
    return CellResult(
        id=cell_id,
        axes=dict(cell.axes) if cell else {},
        state=CellState.ERROR,
        unexpected=True,
        expected=expected,
        reason=f"{UNREADABLE}{path}: {why}",
    )


def read_cells(run_dir: Path, planned: Mapping[str, PlannedCell] | None = None) -> list[tuple[Path, CellResult]]:
    """Every ``cells/*.json`` of a run, as (file, result); an unreadable one as an ``error`` cell.

    *planned* (cell id -> PlannedCell) gives an unreadable cell its axes and expectation.
    """
    cells_dir = run_dir / CELLS
    try:
        entries = sorted(os.scandir(cells_dir), key=lambda e: e.name)
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise ConfigError(str(cells_dir), [f"cannot read: {exc.strerror}"]) from None
    out = []
    for entry in entries:
        if not entry.name.endswith(".json") or entry.name.startswith("."):
            continue  # the cells' work folders, and temporary files of writes in flight
        path = Path(entry.path)
        try:
            out.append((path, _read_cell_file(path)))
        except _Unreadable as exc:
            out.append((path, _error_cell(path.stem, path, str(exc), planned or {})))
    return out


def read_cell(run_dir: Path, cell_id: str) -> CellResult | None:
    """One cell's result, None when the run has none; an unreadable file raises ConfigError."""
    path = cell_file(run_dir, cell_id)
    if not path.exists() and not path.is_symlink():
        return None
    try:
        return _read_cell_file(path)
    except _Unreadable as exc:
        raise ConfigError(str(path), [str(exc)]) from None


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
            write_atomic(target, _json_bytes(data))
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


def _probe_held(fd: int) -> bool:
    """Whether another open file holds the lock (without taking it for longer than the probe)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    fcntl.flock(fd, fcntl.LOCK_UN)
    return False


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
        if not _probe_held(self._fd):
            raise NotOwner(
                f"run {self.id} has no owner any more (the process that started it, "
                f"{_owner_words(self.owner)}, exited or was killed): nothing is written into {self.path}"
            )
        try:
            now = _read_run_json(self.path).owner
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
            write_atomic(path, _json_bytes(data))
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
            _write_run_json(self.path, dataclasses.replace(_read_run_json(self.path), complete=True))
        except Unwritable as exc:
            raise exc.fixed(run_fix(self.path)) from None
        return self.aggregate(plan, latest=latest)

    def aggregate(self, plan: Planned, *, latest: Path | None) -> Results:
        """(Re)write results.json from the cell files, and offer it to *latest* (see write_latest)."""
        self.check()
        info = _read_run_json(self.path)
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
            write_atomic(self.results_path, _json_bytes(results.to_json()))
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


def _open_dir(path: Path) -> int:
    try:
        path.mkdir(parents=True, exist_ok=True)
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        raise Unwritable(path, exc.strerror or str(exc)) from None


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
        fd = _open_dir(run_dir)
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
                    who = _owner_words(_read_run_json(run_dir).owner)
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
        before = _read_run_json(run_dir) if (run_dir / RUN_JSON).exists() and not restart else None
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
        _write_run_json(run_dir, info)
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
        infos.append(_read_run_json(run_dir))
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
        info = _read_run_json(run_dir)
        folder = RunFolder(run_dir, dataclasses.replace(info, owner=owner), fd=fd, owns=False)
        folder.check()
    except BaseException:
        os.close(fd)
        raise
    return folder


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
    fd = _open_dir(folder)
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
        write_atomic(folder / RESULTS, redact_text(_json_bytes(results.to_json()).decode("utf-8")).encode("utf-8"))
        written.append(folder / RESULTS)
        return written
    finally:
        if locked:  # who holds it is said only while it is held: never left in a published folder
            with contextlib.suppress(OSError):
                (folder / _WRITER).unlink()
        os.close(fd)


def _canonical(cell: CellResult) -> str:
    return json.dumps(cell.to_json(), sort_keys=True)


def merge_runs(
    plan: Planned,
    shard_dirs: Sequence[Path],
    out_dir: Path,
    *,
    run_id: str,
    prefer: Sequence[Path] = (),
    latest: Path | None = None,
) -> Results:
    """Combine shard run folders into one run; a planned cell no shard produced is an error, never green.

    Two different results for one cell are refused (LabError naming both files) unless one of them comes
    from a folder of *prefer* (the first listed wins); identical copies are one result. Nothing is written
    before the shards are known to agree.
    """
    shard_set = {d.resolve() for d in shard_dirs}
    for p in prefer:
        if p.resolve() not in shard_set:
            raise UsageError(f"--prefer {p}: not one of the shard folders given")
    cells = plan.cells
    planned = {c.id: c for c in cells}
    hosts: list[dict[str, Any]] = []
    found: dict[str, list[tuple[Path, Path, CellResult]]] = {}
    for d in shard_dirs:
        if not (d / CELLS).is_dir():
            raise UsageError(f"{d}: not a run folder (no cells/ inside); pass reports/runs/<run-id> of each shard")
        if (d / RUN_JSON).exists():
            try:
                hosts.append(dict(_read_run_json(d).host))
            except ConfigError as exc:
                log.warning("shard host unknown: %s", exc)
        for path, result in read_cells(d, planned):
            found.setdefault(result.id, []).append((d.resolve(), path, result))
    chosen: dict[str, CellResult] = {}
    conflicts = []
    for cid, candidates in found.items():
        if len({_canonical(r) for _, _, r in candidates}) == 1:
            chosen[cid] = candidates[0][2]
            continue
        pick = next((r for p in prefer for d, _, r in candidates if d == p.resolve()), None)
        if pick is None:
            files = " and ".join(f"{path} ({r.state})" for _, path, r in candidates)
            conflicts.append(f"cell {cid}: different results in {files}")
        else:
            chosen[cid] = pick
    if conflicts:
        raise LabError("; ".join(conflicts) + "; say which shard wins with --prefer DIR")
    with claim_run(
        out_dir,
        run_id=run_id,
        plan=plan,
        restart=True,
        host=hosts[0] if hosts else {},
        shards=[str(d) for d in shard_dirs],
        hosts=hosts,
    ) as run:
        results = []
        for cell in cells:
            if cell.id in chosen:
                results.append(chosen.pop(cell.id))
            elif cell.na is not None:
                results.append(
                    CellResult(id=cell.id, axes=dict(cell.axes), state=CellState.NA, reason=cell.na, finished=now_iso())
                )
            else:
                results.append(
                    CellResult(
                        id=cell.id,
                        axes=dict(cell.axes),
                        state=CellState.ERROR,
                        unexpected=True,
                        finished=now_iso(),
                        reason="missing: no shard produced a result for this cell (lost runner or interrupted shard)",
                        expected=_expectation(cell),
                    )
                )
        results.extend(chosen.values())  # cells the matrix no longer plans: shown, not dropped
        keep = {r.id for r in results}
        for path, old in read_cells(out_dir):
            if old.id not in keep and path.is_file() and not path.is_symlink():
                path.unlink()  # a cell of an earlier merge into this folder
        for result in results:
            run.write_cell(result)
        return run.finish(plan, latest=latest)


def _in_use(run_dir: Path) -> bool:
    try:
        fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return False
    try:
        return _probe_held(fd)
    finally:
        os.close(fd)


def prune_runs(runs_dir: Path, keep: int) -> list[Path]:
    """Delete all but the newest *keep* runs (by start); a run in use is kept. Returns what was removed."""
    if keep < 1:
        raise UsageError(f"--keep: expected a positive number of runs, got {keep}")

    def order(results: Path) -> tuple[int, str]:
        try:
            return _read_run_json(results.parent).order
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
