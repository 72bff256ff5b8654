"""A folder's lock: ``flock`` on an fd of the folder itself, so no lock file is published, pruned or left
behind, and the kernel drops it with the process that holds it (``kill -9`` frees it at once).

A run's owner holds its run folder's lock (``LOCK_EX``) for as long as the run lasts (runs/store.py); a writer
of reports/latest holds that folder's for one write (runs/latest.py). The lock belongs to the open file, not
to the process: another ``open_dir`` of the same folder, in this process or any other, does not hold it.
``probe_held`` asks through such an fd, without waiting, whether the lock is held (a ``LOCK_SH|LOCK_NB`` that
fails); never ask through the holder's own fd, whose lock the probe would turn shared and then drop.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from compatlab.errors import Unwritable

__all__ = ["open_dir", "probe_held"]


def open_dir(path: Path) -> int:
    """An fd of the folder *path* (made if missing) to lock; Unwritable naming it when it cannot be."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        raise Unwritable(path, exc.strerror or str(exc)) from None


def probe_held(fd: int) -> bool:
    """Whether another open file holds the lock (without taking it for longer than the probe)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    fcntl.flock(fd, fcntl.LOCK_UN)
    return False
