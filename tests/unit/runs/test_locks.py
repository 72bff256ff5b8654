"""A folder's lock is flock on an fd of the folder: held by an open file, probed without being taken."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import pytest

from compatlab.errors import Unwritable
from compatlab.runs.locks import open_dir, probe_held


def test_a_probe_sees_another_open_file_hold_the_lock_and_leaves_it_free_otherwise(tmp_path: Path) -> None:
    holder, prober = open_dir(tmp_path / "run"), open_dir(tmp_path / "run")
    try:
        assert not probe_held(prober)
        # The probe took nothing: another open file still gets the lock at once.
        fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert probe_held(prober)
        assert probe_held(prober)  # asking again changes nothing
        fcntl.flock(holder, fcntl.LOCK_UN)
        assert not probe_held(prober)
    finally:
        os.close(holder)
        os.close(prober)


def test_a_lock_goes_with_the_file_that_held_it(tmp_path: Path) -> None:
    holder, prober = open_dir(tmp_path), open_dir(tmp_path)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.close(holder)  # as the kernel does for a process that is killed
        assert not probe_held(prober)
    finally:
        os.close(prober)


def test_a_folder_that_cannot_be_made_is_unwritable_naming_it(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("", encoding="utf-8")
    with pytest.raises(Unwritable) as info:
        open_dir(tmp_path / "file" / "run")
    assert str(info.value) == f"cannot write {tmp_path / 'file' / 'run'}: Not a directory"
