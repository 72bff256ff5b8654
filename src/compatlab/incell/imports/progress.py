"""The import stage's progress while its loads run: a line every few seconds to the lab, which shows it.

The lab passes a file descriptor as ``COMPATLAB_PROGRESS_FD`` (and may set ``COMPATLAB_PROGRESS_SECONDS``,
10 by default); without it nothing is written. A line says the modules done of all and the slowest load so
far (``12/40 modules loaded, slowest so far torch 9.8 s``); one that says what the last did is not written.
"""

from __future__ import annotations

import os
import threading

from compatlab.incell.entries import ImportEntry

__all__ = ["Progress"]


class Progress:
    """Every COMPATLAB_PROGRESS_SECONDS (10) while the loads run, a line on the file descriptor the lab
    passed as COMPATLAB_PROGRESS_FD: modules done of all, and the slowest load so far. Nothing without it."""

    def __init__(self, total: int) -> None:
        fd = os.environ.get("COMPATLAB_PROGRESS_FD", "")
        self.fd = int(fd) if fd.isdigit() else None
        try:
            self.every = float(os.environ.get("COMPATLAB_PROGRESS_SECONDS", "10"))
        except ValueError:
            self.every = 10.0
        self.total, self.done, self.slowest = total, 0, ("", 0.0)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> Progress:
        if self.fd is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def tick(self, loaded: tuple[ImportEntry, list[str] | None]) -> tuple[ImportEntry, list[str] | None]:
        entry = loaded[0]
        with self._lock:
            self.done += 1
            if not self.slowest[0] or entry.seconds > self.slowest[1]:  # a first load of 0.0 s is the slowest
                self.slowest = (entry.module, entry.seconds)
        return loaded

    def _loop(self) -> None:
        last = ""
        while not self._stop.wait(self.every):
            with self._lock:
                line = f"{self.done}/{self.total} modules loaded"
                if self.slowest[0]:
                    line += f", slowest so far {self.slowest[0]} {self.slowest[1]:.1f} s"
            if line == last:
                continue  # nothing moved: a line repeated says nothing
            last = line
            try:
                os.write(self.fd, (line + "\n").encode())  # type: ignore[arg-type]
            except OSError:
                return  # the lab stopped listening
