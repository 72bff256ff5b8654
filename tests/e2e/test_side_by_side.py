"""Cells side by side (issue 35): a real `nox -s matrix -- -j 3` over a local index of tiny real wheels gives the
same run as `-j 1` (every cell's verdict, reason and stages), its cells ran at the same time, and every line a
cell printed says which cell it came from. That GPU stages never share a GPU is test_gpu_lease.py's."""

from __future__ import annotations

import datetime as dt
import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from fixtures.labutil import nox
from fixtures.matrices import EXPECTED_ONLY
from fixtures.shared_run import SharedRun, nox_expected_only


def _cells(folder: Path, run_id: str) -> dict[str, Any]:
    cells = {}
    for path in sorted((folder / "reports" / "runs" / run_id / "cells").glob("*.json")):
        cell = json.loads(path.read_text())
        cells[cell["id"]] = cell
    return cells


def _run(folder: Path, url: str, *posargs: str, run_id: str) -> tuple[dict[str, Any], str]:
    done = nox_expected_only(folder, url, "-s", "matrix", "--", *posargs, run_id=run_id)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return _cells(folder, run_id), done.stdout + done.stderr


def _said(cell: dict[str, Any], folder: Path) -> tuple[Any, ...]:
    stages = tuple((s["name"], s["state"], s.get("reason", "").replace(str(folder), "DIR")) for s in cell["stages"])
    return cell["state"], cell.get("reason", "").replace(str(folder), "DIR"), stages


def _span(cell: dict[str, Any]) -> tuple[float, float]:
    start = dt.datetime.fromisoformat(cell["started"]).timestamp()
    return start, start + float(cell["seconds"])


@pytest.mark.long
def test_j3_gives_the_run_of_j1_with_its_cells_at_once(
    tmp_path: Path, index_url: str, expected_only_run: SharedRun
) -> None:
    assert expected_only_run.returncode == 0, expected_only_run.said  # `-j 1`, the default
    one = _cells(expected_only_run.folder, "r1")
    three, out = _run(tmp_path / "j3", index_url, "-j", "3", run_id="r3")
    assert sorted(one) == sorted(three)
    assert len(one) == 4  # the live cells; n/a cells write no file
    assert {c: _said(one[c], expected_only_run.folder) for c in one} == {
        c: _said(three[c], tmp_path / "j3") for c in three
    }
    spans = sorted(_span(c) for c in three.values())
    assert any(b[0] < a[1] for a, b in itertools.pairwise(spans)), spans  # one began before another ended
    for cid in three:
        assert f"[{cid}] " in out, cid
    assert not list((tmp_path / "j3" / "tmp").glob("compatlab-jobs-*"))  # the cells' output files are gone
    # Every line of a cell's own (its start, each stage) carries its id in front.
    cell_lines = [
        line for line in out.splitlines() for cid in three if f"[compatlab] {cid}: " in line or f"start {cid} (" in line
    ]
    assert len(cell_lines) >= 4 * 7, out[-3000:]
    assert all(any(line.startswith(f"[{cid}] [compatlab] ") for cid in three) for line in cell_lines), out[-3000:]


def test_a_bad_j_is_one_line_and_exit_2(tmp_path: Path, index_url: str) -> None:
    for bad in ("0", "100000", "many"):
        done = nox(tmp_path, EXPECTED_ONLY.format(url=index_url), "-s", "matrix", "--", "-j", bad)
        assert done.returncode == 2, done.stderr
        assert f"error: -j {bad}: the number of cells to run at once is a count from 1 to 64, or auto" in done.stderr
        assert not (tmp_path / "reports" / "runs").exists()
