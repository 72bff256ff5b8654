"""The import stage's progress line: written to the descriptor the lab passed, once for each change."""

from __future__ import annotations

import os
import select
import time

import pytest

from compatlab.incell.entries import ImportEntry
from compatlab.incell.imports.progress import Progress


def test_a_line_says_the_modules_done_and_the_slowest_once(monkeypatch: pytest.MonkeyPatch) -> None:
    read, write = os.pipe()
    monkeypatch.setenv("COMPATLAB_PROGRESS_FD", str(write))
    monkeypatch.setenv("COMPATLAB_PROGRESS_SECONDS", "0.01")
    progress = Progress(3)
    for module, seconds in (("pkg/_fast.so", 0.5), ("pkg/_slow.so", 9.75)):
        loaded = (ImportEntry(module=module, dist="pkg", ok=True, seconds=seconds), None)
        assert progress.tick(loaded) is loaded
    with progress:
        assert select.select([read], [], [], 30) == ([read], [], [])
        time.sleep(0.2)  # some twenty ticks more, none of which moved
    os.close(write)
    with os.fdopen(read, "rb") as said:
        assert said.read() == b"2/3 modules loaded, slowest so far pkg/_slow.so 9.8 s\n"


def test_a_first_load_too_fast_to_time_is_still_the_slowest_so_far(monkeypatch: pytest.MonkeyPatch) -> None:
    read, write = os.pipe()
    monkeypatch.setenv("COMPATLAB_PROGRESS_FD", str(write))
    monkeypatch.setenv("COMPATLAB_PROGRESS_SECONDS", "0.01")
    progress = Progress(2)
    progress.tick((ImportEntry(module="pkg/_fast.so", dist="pkg", ok=True, seconds=0.0), None))
    with progress:
        assert select.select([read], [], [], 30) == ([read], [], [])
    os.close(write)
    with os.fdopen(read, "rb") as said:
        assert said.read() == b"1/2 modules loaded, slowest so far pkg/_fast.so 0.0 s\n"


def test_nothing_is_written_without_a_descriptor(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COMPATLAB_PROGRESS_FD", raising=False)
    with Progress(1) as progress:
        assert progress.fd is None
