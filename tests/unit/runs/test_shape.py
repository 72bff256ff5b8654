"""The strict reader of a result's JSON: every problem at once, each with its key path and the value found."""

from __future__ import annotations

import pytest

from compatlab.runs.shape import Shape, ShapeError, show, whole


def test_a_table_names_missing_and_unknown_keys_with_the_nearest_known_one() -> None:
    problems: list[str] = []
    sh = Shape({"named": "x", "zzz": 1}, "cells[0]", problems, required=("name",), optional=("state",))
    assert sh.ok
    assert problems == [
        "cells[0]: missing key 'name'",
        "cells[0]: unknown key 'named'; perhaps you meant 'name'?",
        "cells[0]: unknown key 'zzz'",
    ]


def test_what_is_not_a_table_is_one_problem_naming_what_was_expected() -> None:
    problems: list[str] = []
    sh = Shape([1], "", problems, required=("id",), optional=(), what="a table of run metadata")
    assert (sh.ok, sh.data, problems) == (False, {}, ["expected a table of run metadata, got a list"])


def test_each_value_of_the_wrong_type_is_named_by_its_key_path_and_read_as_its_default() -> None:
    data = {
        "text": 3,
        "flag": "yes",
        "number": float("inf"),
        "integer": 0,
        "choice": "green",
        "table": [],
        "strings": ["a", 1],
        "string_table": {"a": 1},
    }
    problems: list[str] = []
    sh = Shape(data, "run", problems, required=(), optional=tuple(data))
    read = (
        sh.text("text", "d"),
        sh.flag("flag", True),
        sh.number("number", 1.5),
        sh.integer("integer", 1, minimum=1),
        sh.choice("choice", ("pass", "fail")),
        sh.table("table"),
        sh.strings("strings"),
        sh.string_table("string_table"),
    )
    assert read == ("d", True, 1.5, 1, "pass", {}, [], {})
    assert problems == [
        "run.text: expected a string, got 3",
        "run.flag: expected true or false, got 'yes'",
        "run.number: expected a finite number, got inf",
        "run.integer: expected a whole number >= 1, got 0",
        "run.choice: expected one of pass, fail, got 'green'",
        "run.table: expected a table, got a list",
        "run.strings: expected a list of strings, got a list",
        "run.string_table: expected a table of strings, got a table",
    ]


def test_a_key_left_out_is_its_default_and_no_problem() -> None:
    problems: list[str] = []
    sh = Shape({}, "", problems, required=(), optional=("n", "b", "state"))
    assert (sh.number("n"), sh.flag("b", False), sh.choice("state", ("pass", "fail")), sh.integer("n", 2)) == (
        0.0,
        False,
        "pass",
        2,
    )
    assert (problems, sh.path("n"), sh.has("n")) == ([], "n", False)


def test_a_boolean_is_not_a_number() -> None:
    problems: list[str] = []
    sh = Shape({"seconds": True, "attempts": False}, "", problems, required=(), optional=("seconds", "attempts"))
    assert (sh.number("seconds"), sh.integer("attempts", 1)) == (0.0, 1)
    assert problems == [
        "seconds: expected a finite number, got True",
        "attempts: expected a whole number >= 0, got False",
    ]


def test_a_value_found_is_shown_short_and_containers_by_kind() -> None:
    assert [show({}), show([]), show(None), show("ok"), show(1.5)] == ["a table", "a list", "null", "'ok'", "1.5"]
    long = show("x" * 100)
    assert (len(long), long) == (60, "'" + "x" * 56 + "...")


def test_whole_raises_every_problem_the_reader_found() -> None:
    def read(data: object, where: str, problems: list[str]) -> str | None:
        sh = Shape(data, where, problems, required=("a", "b"), optional=())
        return sh.text("a") if sh.ok else None

    assert whole(read, {"a": "x", "b": 1}, "") == "x"
    with pytest.raises(ShapeError) as info:
        whole(read, {"c": 1}, "t")
    assert info.value.problems == ["t: missing key 'a'", "t: missing key 'b'", "t: unknown key 'c'"]
    assert str(info.value) == "t: missing key 'a'; t: missing key 'b'; t: unknown key 'c'"
    with pytest.raises(ShapeError) as info:
        whole(read, "text", "")
    assert info.value.problems == ["expected a table, got 'text'"]
