"""A run folder's files: their bytes, and the strict reading that never follows a link nor drops a cell."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from compatlab.errors import ConfigError, UsageError
from compatlab.runs.files import (
    cell_file,
    json_bytes,
    load_results,
    read_cell,
    read_cells,
    results_in,
    run_info,
    write_run_json,
)
from compatlab.runs.model import CELL_SCHEMA, RUN_SCHEMA, CellResult, CellState, RunInfo
from compatlab.runs.planned import PlannedCell


def _cell(cid: str) -> CellResult:
    return CellResult(id=cid, axes={"torch": "2.9.1"}, state=CellState.PASS)


def _write(run: Path, name: str, data: object) -> Path:
    path = run / "cells" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def test_every_file_is_indented_json_with_a_final_newline() -> None:
    assert json_bytes({"a": [1], "é": "ü"}) == b'{\n  "a": [\n    1\n  ],\n  "\\u00e9": "\\u00fc"\n}\n'


def test_run_json_carries_its_schema_and_reads_back(tmp_path: Path) -> None:
    info = RunInfo(id="r1", started="2026-03-01T02:00:00+00:00", owner="box:1:ab", complete=False)
    write_run_json(tmp_path, info)
    assert json.loads((tmp_path / "run.json").read_text(encoding="utf-8")) == {"schema": RUN_SCHEMA, **info.to_json()}
    assert run_info(tmp_path) == info


def test_a_run_json_of_another_schema_or_shape_is_one_error_naming_it(tmp_path: Path) -> None:
    (tmp_path / "run.json").write_text('{"id": "r1"}', encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        run_info(tmp_path)
    assert str(info.value) == f"{tmp_path / 'run.json'}: schema: expected {RUN_SCHEMA!r}, got None"
    (tmp_path / "run.json").write_text(json.dumps({"schema": RUN_SCHEMA, "id": "r1", "owner": 1}), encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        run_info(tmp_path)
    assert str(info.value) == f"{tmp_path / 'run.json'}: owner: expected a string, got 1"


def test_a_results_file_that_is_not_there_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_results(tmp_path / "results.json")
    assert str(info.value) == f"{tmp_path / 'results.json'}: no such file; run `nox -s matrix` first"
    with pytest.raises(ConfigError) as info:
        load_results(tmp_path)
    assert str(info.value) == f"{tmp_path}: is a directory; give the run's results.json"
    (tmp_path / "results.json").write_bytes(b"\xff{}")
    with pytest.raises(ConfigError) as info:
        load_results(tmp_path / "results.json")
    assert str(info.value) == f"{tmp_path / 'results.json'}: not UTF-8 text: invalid start byte at byte 0"


def test_a_cell_id_is_one_file_name() -> None:
    assert cell_file(Path("run"), "c1") == Path("run/cells/c1.json")
    for bad in ("", "a/b", ".hidden", "a\0b"):
        with pytest.raises(UsageError) as info:
            cell_file(Path("run"), bad)
        assert str(info.value) == f"{bad!r}: not a cell id (a cell id is one file name)"


def test_an_unreadable_cell_file_is_an_error_cell_never_a_dropped_one(tmp_path: Path) -> None:
    good = _write(tmp_path, "c1.json", {"schema": CELL_SCHEMA, **_cell("c1").to_json()})
    _write(tmp_path, "c2.json", {"schema": CELL_SCHEMA, **_cell("c9").to_json()})
    _write(tmp_path, "c3.json", [1])
    _write(tmp_path, "c4.json", _cell("c4").to_json())
    _write(tmp_path, "c5.json", {"schema": CELL_SCHEMA, **_cell("c5").to_json(), "state": "green"})
    (tmp_path / "cells" / "c6.json").symlink_to(good)
    (tmp_path / "cells" / "c7.json").mkdir()
    os.mkfifo(tmp_path / "cells" / "c8.json")
    # Not results: a cell's work folder, and a write in flight.
    (tmp_path / "cells" / "c1").mkdir()
    _write(tmp_path, ".c1.json.x.tmp", {})
    planned = {"c3": PlannedCell(id="c3", axes={"torch": "2.9.1"}, expect="fail", expect_reason="known")}
    cells = {p.name: c for p, c in read_cells(tmp_path, planned)}
    assert cells.pop("c1.json") == _cell("c1")
    assert all(c.state == CellState.ERROR and c.unexpected and c.unreadable for c in cells.values())
    where = tmp_path / "cells"
    assert {name: c.reason for name, c in cells.items()} == {
        "c2.json": f"unreadable result: {where / 'c2.json'}: id: 'c9' is not this file's cell ('c2')",
        "c3.json": f"unreadable result: {where / 'c3.json'}: expected a cell result (a JSON object), got a list",
        "c4.json": f"unreadable result: {where / 'c4.json'}: schema: expected {CELL_SCHEMA!r}, got None",
        "c5.json": f"unreadable result: {where / 'c5.json'}: "
        "state: expected one of pass, fail, partial, error, n/a, got 'green'",
        "c6.json": f"unreadable result: {where / 'c6.json'}: "
        "a symbolic link, not followed (a cell result must be a regular file)",
        "c7.json": f"unreadable result: {where / 'c7.json'}: "
        "a folder, not a cell result (a cell result must be a regular file)",
        "c8.json": f"unreadable result: {where / 'c8.json'}: not a regular file (a cell result must be a regular file)",
    }
    # The plan gives an unreadable cell its axes and its expectation.
    assert cells["c3.json"].axes == {"torch": "2.9.1"}
    assert cells["c3.json"].expected is not None
    assert (cells["c3.json"].expected.state, cells["c3.json"].expected.reason) == (CellState.FAIL, "known")
    assert (cells["c2.json"].axes, cells["c2.json"].expected) == ({}, None)


def test_one_cell_is_none_when_the_run_has_none_and_an_error_when_unreadable(tmp_path: Path) -> None:
    assert read_cells(tmp_path) == []
    assert read_cell(tmp_path, "c1") is None
    _write(tmp_path, "c1.json", {"schema": CELL_SCHEMA, **_cell("c1").to_json()})
    assert read_cell(tmp_path, "c1") == _cell("c1")
    (tmp_path / "cells" / "c2.json").symlink_to(tmp_path / "nowhere")
    with pytest.raises(ConfigError) as info:
        read_cell(tmp_path, "c2")
    assert str(info.value) == (
        f"{tmp_path / 'cells' / 'c2.json'}: a symbolic link, not followed (a cell result must be a regular file)"
    )


def test_the_runs_of_a_folder_are_its_run_folders_with_results_links_not_followed(tmp_path: Path) -> None:
    assert results_in(tmp_path / "none") == []
    for name in ("b", "a", "empty"):
        (tmp_path / name).mkdir()
    for name in ("b", "a"):
        (tmp_path / name / "results.json").write_text("{}", encoding="utf-8")
    (tmp_path / "linked").symlink_to(tmp_path / "a")
    assert results_in(tmp_path) == [tmp_path / "a" / "results.json", tmp_path / "b" / "results.json"]
