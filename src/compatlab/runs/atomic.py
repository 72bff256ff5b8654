"""The one atomic writer: a temporary file in the same folder, fsynced, then ``os.replace``d over the old one,
so that a reader (a web server, the next run, a person) sees the old file or the new one, never half of one.

Every file the lab writes whole goes through it: the run folder's (runs/store.py), the stages' own reports
(perf.json, benchmark.json, rehearsal.json), the published pages and matrix.lock. A failure is a LabError
(``Unwritable``) naming the file, with the temporary file removed.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from compatlab.errors import Unwritable

__all__ = ["write_atomic", "write_json_atomic"]


def write_atomic(path: Path, payload: bytes | str, *, mode: int = 0o644) -> None:
    """Write *payload* (text as UTF-8) to *path* atomically, readable as *mode* (default: by everyone, as a
    static host must read results; mkstemp alone makes 0600)."""
    data = payload.encode("utf-8") if isinstance(payload, str) else payload
    tmp: str | None = None
    if path.parent.exists() and not path.parent.is_dir():
        raise Unwritable(path, f"{path.parent} is not a folder")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except OSError as exc:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        raise Unwritable(path, exc.strerror or str(exc)) from None
    except BaseException:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(path: Path, data: Any, *, mode: int = 0o644) -> None:
    """*data* as indented JSON with a final newline, through ``write_atomic``."""
    write_atomic(path, json.dumps(data, indent=2, sort_keys=False) + "\n", mode=mode)
