"""Pruning keeps the newest runs by their start, and any run whose owner still holds it."""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

import pytest

from compatlab.errors import UsageError
from compatlab.runs.files import write_run_json
from compatlab.runs.model import SCHEMA, RunInfo
from compatlab.runs.prune import prune_runs

NS = 1_772_330_400_000_000_000  # 2026-03-01T02:00:00Z in nanoseconds


def _run(runs: Path, run_id: str, started_ns: int) -> Path:
    folder = runs / run_id
    folder.mkdir(parents=True)
    info = RunInfo(id=run_id, started_ns=started_ns)
    write_run_json(folder, info)
    (folder / "results.json").write_text(json.dumps({"schema": SCHEMA, "run": info.to_json(), "cells": []}))
    return folder


def test_all_but_the_newest_runs_are_removed_by_start_not_by_name(tmp_path: Path) -> None:
    new, old, mid = _run(tmp_path, "a", NS + 3), _run(tmp_path, "b", NS + 1), _run(tmp_path, "c", NS + 2)
    # A run.json of a lab before schemas orders by its start; one that cannot be read is oldest.
    legacy = _run(tmp_path, "d", 0)
    (legacy / "run.json").write_text(json.dumps({"id": "d", "started": "2000-01-01T00:00:00"}), encoding="utf-8")
    (legacy / "results.json").write_text("{}", encoding="utf-8")
    broken = _run(tmp_path, "e", 0)
    (broken / "run.json").unlink()
    (broken / "results.json").write_text("[", encoding="utf-8")
    assert prune_runs(tmp_path, 2) == [broken, legacy, old]
    assert sorted(p.name for p in tmp_path.iterdir()) == [new.name, mid.name]
    assert prune_runs(tmp_path, 2) == []


def test_a_run_in_use_is_kept(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    held, _ = _run(tmp_path, "held", 1), _run(tmp_path, "new", 2)
    fd = os.open(held, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        assert prune_runs(tmp_path, 1) == []
    finally:
        os.close(fd)
    assert [(r.name, r.levelname, r.getMessage()) for r in caplog.records] == [
        ("compatlab.runs.store", "WARNING", f"{held}: in use by a running process; kept")
    ]
    assert prune_runs(tmp_path, 1) == [held]


def test_keep_is_at_least_one(tmp_path: Path) -> None:
    _run(tmp_path, "r1", NS)
    with pytest.raises(UsageError) as info:
        prune_runs(tmp_path, 0)
    assert [p.name for p in tmp_path.iterdir()] == ["r1"]
    assert str(info.value) == "--keep: expected a positive number of runs, got 0"
