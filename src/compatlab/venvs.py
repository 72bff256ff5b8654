"""The venvs of a run's cells: each cell's venv is owned by one run, held under a lock while its stages run,
and the same cell's venvs of earlier runs are swept away beside them."""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

from compatlab.cells import Cell
from compatlab.errors import Unwritable

__all__ = ["TRASH", "cell_venv", "own_venv"]


def cell_venv(venv_root: Path, run_id: str, cell: Cell) -> Path:
    """The cell's venv, owned by its run: two runs at once never share one."""
    return venv_root / run_id / cell.id


# Venvs of earlier runs wait here to be removed: a rename on the venvs' own filesystem is instant, the removal
# (tens of thousands of hard links for a torch stack: 9-27 s) runs beside the cell's stages.
TRASH = ".trash"


@contextlib.contextmanager
def own_venv(venv_root: Path, run_id: str, cell: Cell) -> Iterator[Path]:
    """Hold the cell's venv of this run, and drop the same cell's venvs of runs that no longer hold theirs.

    The lock (flock on ``<venv>.lock``) is held while the cell's stages run. Another run's venv of this
    cell is set aside (renamed into ``<venvs>/.trash/``) only when its lock can be taken, so a concurrent
    run keeps its own; a thread removes what is set aside while the stages run, and the cell waits for it
    at its end. The disk holds about one venv per cell, and `nox -s gpu8_perf` finds the latest run's venvs.
    """
    venv = cell_venv(venv_root, run_id, cell)
    try:
        venv.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=venv.parent, prefix=".compatlab-write-"):
            pass  # a folder that is there but read-only passes mkdir; the venv and its lock file need a write
    except OSError as exc:
        raise Unwritable(
            exc.filename or venv.parent,
            exc.strerror or str(exc),
            f"make {venv_root} writable, or keep the venvs elsewhere (COMPATLAB_VENVS for nox, --venvs)",
        ) from None
    with _flock(venv.with_name(venv.name + ".lock"), wait=True):
        for other in sorted(venv_root.glob(f"*/{cell.id}")):
            if other == venv or not other.is_dir():
                continue
            with _flock(other.with_name(other.name + ".lock"), wait=False) as got:
                if got:
                    _set_aside(other, venv_root / TRASH)
        sweeper = threading.Thread(target=_sweep, args=(venv_root / TRASH,), name="old-venvs", daemon=True)
        sweeper.start()
        try:
            yield venv
        except BaseException:
            raise  # interrupted: what is left in .trash goes with the next cell
        else:
            sweeper.join()


def _set_aside(old: Path, trash: Path) -> None:
    trash.mkdir(exist_ok=True)
    try:
        old.rename(trash / f"{old.parent.name}-{old.name}-{secrets.token_hex(4)}")
    except OSError:
        shutil.rmtree(old, ignore_errors=True)  # cannot be renamed (another filesystem): removed here


def _sweep(trash: Path) -> None:
    """Remove everything set aside, this cell's and what an interrupted cell left."""
    if trash.is_dir():
        for entry in trash.iterdir():
            shutil.rmtree(entry, ignore_errors=True)


@contextlib.contextmanager
def _flock(path: Path, *, wait: bool) -> Iterator[bool]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)
