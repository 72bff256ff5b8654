"""A run's metadata: which of two runs is newer, whether it ran to its end, its matrix and its grid's layout."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from compatlab.runs.info import REPORT_DEFAULTS, RunInfo, parse_time
from compatlab.runs.shape import ShapeError


def test_a_time_without_a_zone_is_utc_and_what_is_not_a_time_is_none() -> None:
    assert parse_time("2026-03-01T02:00:00") == datetime(2026, 3, 1, 2, tzinfo=UTC)
    assert parse_time("2026-03-01T04:00:00+02:00") == datetime(2026, 3, 1, 4, tzinfo=timezone(timedelta(hours=2)))
    assert (parse_time("yesterday"), parse_time("")) == (None, None)


def test_newer_is_the_later_start_then_the_larger_id() -> None:
    # The start in ns wins over the ISO second; without ns the second orders; an unknown start is oldest.
    assert RunInfo(id="a", started_ns=2).order > RunInfo(id="b", started_ns=1).order
    assert (
        RunInfo(id="a", started="2026-03-01T02:00:01+00:00").order
        > RunInfo(id="z", started="2026-03-01T02:00:00").order
    )
    assert RunInfo(id="b", started="2026-03-01T02:00:00").order > RunInfo(id="a", started="2026-03-01T02:00:00Z").order
    assert RunInfo(id="x", started="not a time").order == (0, "x")


def test_a_run_is_done_when_its_owner_says_so_else_in_an_old_run_once_a_cell_ended() -> None:
    assert not RunInfo(id="r", complete=False, finished="2026-03-01T02:00:00+00:00").done
    assert RunInfo(id="r", complete=True).done
    assert RunInfo(id="r", finished="2026-03-01T02:00:00+00:00").done
    assert not RunInfo(id="r").done


def test_one_matrix_by_name_where_both_record_one_else_by_file() -> None:
    assert RunInfo(id="a", matrix_name="box", matrix="a.toml").same_matrix(RunInfo(id="b", matrix_name="box"))
    assert not RunInfo(id="a", matrix_name="box").same_matrix(RunInfo(id="b", matrix_name="other"))
    assert not RunInfo(id="a", matrix="a.toml").same_matrix(RunInfo(id="b", matrix="b.toml"))
    assert RunInfo(id="a", matrix="a.toml").same_matrix(RunInfo(id="b"))


def test_a_run_without_a_layout_has_the_default_one() -> None:
    default = RunInfo(id="r")
    assert {"rows": default.rows, "columns": default.columns, "tables": default.tables} == REPORT_DEFAULTS
    own = RunInfo(id="r", report={"rows": ("flashinfer",), "tables": ()})
    assert (own.rows, own.columns, own.tables) == (("flashinfer",), (), ())


def test_json_leaves_defaults_out_and_reads_back() -> None:
    info = RunInfo(id="r", complete=False, shards=("s1",), hosts=({"hostname": "a"},), planned=("c1",))
    data = info.to_json()
    assert data == {"id": "r", "complete": False, "shards": ["s1"], "hosts": [{"hostname": "a"}], "planned": ["c1"]}
    assert RunInfo.from_json(data) == info
    # An old run.json's one axis name for a part of the layout is read as a list of one.
    assert RunInfo.from_json({"id": "r", "report": {"rows": "torch"}}).rows == ("torch",)


def test_bad_metadata_names_every_problem() -> None:
    with pytest.raises(ShapeError) as info:
        RunInfo.from_json({"id": 1, "hosts": "box", "report": {"row": []}, "complete": "no"}, where="run")
    assert info.value.problems == [
        "run.report: unknown key 'row'; perhaps you meant 'rows'?",
        "run.hosts: expected a list of tables, got 'box'",
        "run.id: expected a string, got 1",
        "run.complete: expected true or false, got 'no'",
    ]
    problems: list[str] = []
    assert RunInfo.read([], "run", problems) is None
    assert problems == ["run: expected a table of run metadata, got a list"]
