"""The fast loop stays fast: a test under tests/unit cannot start a process (tests/fixtures/in_process.py)."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys

import pytest


def test_a_unit_test_that_runs_a_program_fails_saying_where_it_belongs() -> None:
    with pytest.raises(AssertionError) as refused:
        subprocess.run([sys.executable, "-c", "pass"], check=False, timeout=10)
    assert str(refused.value) == (
        f"tests/unit runs in-process only, and this test started {os.path.basename(sys.executable)!r}: "
        "move it to tests/e2e (same path below tests/)"
    )


def test_forks_and_multiprocessing_are_refused_too() -> None:
    with pytest.raises(AssertionError, match="started a forked process"):
        os.fork()
    with pytest.raises(AssertionError, match="started"):
        multiprocessing.get_context("spawn").Process(target=print).start()
