"""Cells side by side: ``nox -s matrix -- -j N`` runs up to N ``compatlab cell`` processes at once.

nox runs its sessions one after another, and that stays so: each ``matrix(cell)`` session still stands for
its cell, ends with its cell's exit status and shows its cell's output, in the order nox lists them. What
changes is when the cells start: the first session starts the first N queued cells, and each session, while
it waits for its own cell, starts the next queued one as soon as a slot is free. The cells write the run
folder as they always do (one JSON per cell, atomically; ``results.json`` under its lock), so the run is the
same as with ``-j 1``. CPU stages overlap freely; GPU stages take leases (``gpulease.py``), so two cells
never share a GPU.

Each cell's stdout and stderr go to files of a private folder while it runs in the background; its session
replays them and follows them to the end, every line prefixed with the cell's id. A cell started here dies
with the lab (SIGTERM on its parent's death, ``kill -9`` included); an interrupted session stops every cell
it started.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO

from compatlab.errors import UsageError

__all__ = ["MAX_JOBS", "CellPool", "auto_jobs", "parse_jobs"]

MAX_JOBS = 64  # more cells at once than any box has cores for: a typo, refused
_POLL = 0.2


def auto_jobs(cells: int) -> int:
    """``-j auto``: what the machine fits. A cell's CPU stages keep about two cores busy (the import stage's
    children) and its venv's imports hold up to ~6 GiB; GPU stages queue on their leases, so GPUs do not
    limit it."""
    cores = os.cpu_count() or 1
    try:
        mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        mem_gib = 8.0
    return max(1, min(cells, cores // 2, int(mem_gib // 6), MAX_JOBS))


def parse_jobs(value: str, cells: int) -> int:
    """The ``-j`` value: a count from 1 to MAX_JOBS, or ``auto``; UsageError naming the fix otherwise."""
    if value == "auto":
        return auto_jobs(cells)
    if not value.isdigit() or not 1 <= int(value) <= MAX_JOBS:
        raise UsageError(
            f"-j {value}: the number of cells to run at once is a count from 1 to {MAX_JOBS}, or auto "
            "(what the machine fits)"
        )
    return int(value)


@dataclasses.dataclass
class _Job:
    cell: str
    proc: subprocess.Popen[bytes]
    out: Path
    err: Path
    shown: dict[str, int] = dataclasses.field(default_factory=lambda: {"out": 0, "err": 0})


class CellPool:
    """Up to *jobs* cell processes at once, started in the order of *cells*; ``wait(cell)`` shows one cell's
    output and returns its exit status. *argv_of* gives a cell's command, *env* its environment."""

    def __init__(
        self,
        jobs: int,
        cells: Sequence[str],
        argv_of: Callable[[str], list[str]],
        env: Mapping[str, str],
        *,
        stdout: IO[str] | None = None,
        stderr: IO[str] | None = None,
    ) -> None:
        self.jobs = jobs
        self.queue = list(cells)
        self.argv_of = argv_of
        self.env = dict(env)
        self.folder = Path(tempfile.mkdtemp(prefix="compatlab-jobs-"))
        self.running: dict[str, _Job] = {}
        self.done: dict[str, _Job] = {}
        self.stdout = stdout or sys.stdout
        self.stderr = stderr or sys.stderr

    def _start(self, cell: str) -> None:
        n = len(self.running) + len(self.done)
        out, err = self.folder / f"{n}.out", self.folder / f"{n}.err"
        with open(out, "wb") as o, open(err, "wb") as e:
            proc = subprocess.Popen(self.argv_of(cell), stdout=o, stderr=e, stdin=subprocess.DEVNULL, env=self.env)
        self.running[cell] = _Job(cell=cell, proc=proc, out=out, err=err)

    def _fill(self) -> None:
        for cell, job in list(self.running.items()):
            if job.proc.poll() is not None:
                self.done[cell] = self.running.pop(cell)
        while self.queue and len(self.running) < self.jobs:
            self._start(self.queue.pop(0))

    def _show(self, job: _Job, *, final: bool) -> None:
        for key, path, stream in (("out", job.out, self.stdout), ("err", job.err, self.stderr)):
            try:
                with open(path, "rb") as f:
                    f.seek(job.shown[key])
                    data = f.read()
            except OSError:
                continue
            if not final:
                data = data[: data.rfind(b"\n") + 1]  # whole lines only, until the end
            if not data:
                continue
            job.shown[key] += len(data)
            for line in data.decode("utf-8", "replace").splitlines():
                stream.write(f"[{job.cell}] {line}\n")
            stream.flush()

    def wait(self, cell: str) -> int:
        """Show *cell*'s output as it comes and return its exit status; starts it (and others) as slots free."""
        if cell not in self.running and cell not in self.done:
            if cell in self.queue:
                self.queue.remove(cell)
            self.queue.insert(0, cell)
        try:
            while True:
                self._fill()
                job = self.running.get(cell) or self.done.get(cell)
                if job is None:  # queued behind full slots: wait for one
                    time.sleep(_POLL)
                    continue
                finished = job.proc.poll() is not None
                self._show(job, final=finished)
                if finished:
                    self._fill()  # its slot goes to the next cell at once
                    for path in (job.out, job.err):  # shown whole: nothing of it is kept
                        path.unlink(missing_ok=True)
                    if not self.queue and not self.running:
                        with contextlib.suppress(OSError):
                            self.folder.rmdir()
                    return int(job.proc.returncode)
                time.sleep(_POLL)
        except BaseException:
            self.stop()
            raise

    def stop(self, grace: float = 30.0) -> None:
        """SIGTERM every running cell (each writes what it has), then SIGKILL what is left after *grace*."""
        self.queue.clear()
        for job in self.running.values():
            with contextlib.suppress(OSError):
                job.proc.terminate()
        end = time.monotonic() + grace
        for job in self.running.values():
            try:
                job.proc.wait(timeout=max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                job.proc.kill()
                job.proc.wait()
