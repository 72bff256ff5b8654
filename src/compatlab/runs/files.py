"""The files of a run folder (its layout: runs/store.py): their names, their bytes, and how each is read.

Every file is indented JSON with a final newline (``json_bytes``), with its ``schema`` (runs/model.py). A
results.json (``load_results``) or a run.json (``run_info``) that is missing, a folder, unreadable, not
UTF-8, not valid JSON (nested too deeply included) or not its shape is a ConfigError naming the file, with
the reader's words and every shape problem by its key path. A cell id is one file name (``cell_file``).

A ``cells/*.json`` entry that is a symbolic link, a folder or anything but a regular file is refused without
being followed, and one that cannot be read or is not a cell result of CELL_SCHEMA (bad JSON, a list, no
``id``, an ``id`` other than its file name) becomes an ``error`` cell whose reason is ``unreadable result:
FILE: why`` (``read_cells``); it is never dropped, and summary, merge and report exit non-zero. Entries
starting with ``.`` (the temporary files of writes in flight) and the cells' work folders are not results.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from compatlab.errors import ConfigError, UsageError
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
from compatlab.runs.planned import PlannedCell

__all__ = [
    "CELLS",
    "RESULTS",
    "RUN_JSON",
    "cell_file",
    "expectation",
    "json_bytes",
    "load_results",
    "read_cell",
    "read_cells",
    "results_in",
    "run_info",
    "write_run_json",
]

RESULTS = "results.json"
RUN_JSON = "run.json"
CELLS = "cells"


def json_bytes(data: Mapping[str, Any]) -> bytes:
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
    path = run_dir / RUN_JSON
    data = _read_json(path)
    if not isinstance(data, dict) or data.get("schema") != RUN_SCHEMA:
        got = data.get("schema") if isinstance(data, dict) else type(data).__name__
        raise ConfigError(str(path), [f"schema: expected {RUN_SCHEMA!r}, got {got!r}"])
    try:
        return RunInfo.from_json({k: v for k, v in data.items() if k != "schema"})
    except ShapeError as exc:
        raise ConfigError(str(path), exc.problems) from None


def write_run_json(run_dir: Path, info: RunInfo) -> None:
    write_atomic(run_dir / RUN_JSON, json_bytes({"schema": RUN_SCHEMA, **info.to_json()}))


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


def expectation(cell: PlannedCell | None) -> Expectation | None:
    if cell is None or not cell.expect:
        return None
    return Expectation(state=CellState(cell.expect), reason=cell.expect_reason or "")


def _error_cell(cell_id: str, path: Path, why: str, planned: Mapping[str, PlannedCell]) -> CellResult:
    cell = planned.get(cell_id)
    expected = expectation(cell)
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
