"""compatlab.net's parts that need no server: the JSON shape checker, the capped line splitter, the messages.

Its requests against real misbehaving loopback servers are tests/e2e/test_http_bounds.py.
"""

from __future__ import annotations

from email.message import Message
from typing import Any

import pytest

from compatlab import net
from compatlab.net import ListOf, Obj, check_shape

STATES = ListOf(Obj(optional={"avg_spec_accept_length": (float, type(None))}))
SERVER_INFO = Obj(required={"speculative_algorithm": (str, type(None))}, optional={"internal_states": STATES})


@pytest.mark.parametrize(
    ("value", "shape"),
    [
        ("x", str),
        (3, int),
        (3, float),  # a JSON number may be written without a point
        (2.5, float),
        (True, bool),
        (None, type(None)),
        ({}, dict),
        ([1, "a"], list),
        ({"speculative_algorithm": None}, SERVER_INFO),
        ({"speculative_algorithm": "EAGLE3", "internal_states": [{"avg_spec_accept_length": 3}]}, SERVER_INFO),
        ({"speculative_algorithm": "EAGLE3", "internal_states": [{}], "other": [1, {"x": None}]}, SERVER_INFO),
        ([], ListOf(int)),
    ],
)
def test_what_has_the_shape_passes(value: Any, shape: net.Shape) -> None:
    assert check_shape(value, shape) is None


@pytest.mark.parametrize(
    ("value", "shape", "problem"),
    [
        ("7", int, 'expected an integer, got a string ("7")'),
        (True, int, "expected an integer, got true"),  # a bool is an int to Python, never to JSON
        (1.5, int, "expected an integer, got a number (1.5)"),
        (float("nan"), float, "expected a finite number, got nan"),
        (float("inf"), float, "expected a finite number, got inf"),
        (None, str, "expected a string, got null"),
        ([1], Obj(), "expected an object, got an array"),
        ({"a": 1}, ListOf(int), "expected an array, got an object"),
        ({}, SERVER_INFO, "expected an object with 'speculative_algorithm', got one without"),
        (
            {"speculative_algorithm": 5},
            SERVER_INFO,
            "speculative_algorithm: expected a string or null, got an integer (5)",
        ),
        (
            {"speculative_algorithm": None, "internal_states": {"avg_spec_accept_length": 3.1}},
            SERVER_INFO,
            "internal_states: expected an array, got an object",
        ),
        (
            {"speculative_algorithm": None, "internal_states": [{}, {"avg_spec_accept_length": "2.5"}]},
            SERVER_INFO,
            'internal_states[1].avg_spec_accept_length: expected a number or null, got a string ("2.5")',
        ),
        ([1, 2, "3"], ListOf(int), '[2]: expected an integer, got a string ("3")'),
        ("x" * 100, int, f'expected an integer, got a string ("{"x" * 39}…)'),
    ],
)
def test_the_first_problem_names_the_key_path_and_the_type_found(value: Any, shape: net.Shape, problem: str) -> None:
    assert check_shape(value, shape) == problem


def test_an_alternative_of_the_right_kind_says_the_deeper_problem() -> None:
    finish = (Obj(required={"type": str}), str, type(None))
    assert check_shape({"type": 3}, finish, "meta_info.finish_reason") == (
        "meta_info.finish_reason.type: expected a string, got an integer (3)"
    )
    assert check_shape(3, finish, "finish_reason") == (
        "finish_reason: expected an object or a string or null, got an integer (3)"
    )


def _answer(body: bytes, url: str = "http://127.0.0.1:30000/server_info") -> net.Answer:
    return net.Answer(status=200, headers=Message(), body=body, url=url)


def test_answer_json_names_the_url_and_the_key() -> None:
    with pytest.raises(net.BadShape) as info:
        _answer(b'{"speculative_algorithm": null, "internal_states": {}}').json(SERVER_INFO)
    assert str(info.value) == "http://127.0.0.1:30000/server_info: internal_states: expected an array, got an object"
    assert info.value.reason == "internal_states: expected an array, got an object"
    assert _answer(b'{"speculative_algorithm": "EAGLE3"}').json(SERVER_INFO) == {"speculative_algorithm": "EAGLE3"}


def test_answer_json_that_does_not_parse_is_bad_json_with_the_url() -> None:
    with pytest.raises(net.BadJson) as info:
        _answer(b"<html>").json()
    assert str(info.value) == (
        "http://127.0.0.1:30000/server_info: the answer is not JSON (6 bytes): Expecting value: line 1 column 1 (char 0)"
    )


def test_an_error_never_shows_the_credentials_of_its_url() -> None:
    error = net.Expired("https://alice:s3cret@index.example/simple/torch/", "no complete answer within 30 s")
    assert str(error) == "https://***@index.example/simple/torch/: no complete answer within 30 s"
    assert "s3cret" not in repr(error.args) + error.url


def test_lines_are_cut_at_their_end_across_reads() -> None:
    lines = net.Lines("http://127.0.0.1:1/generate", limit=16)
    assert lines.feed(b"data: 1\n\nda") == [b"data: 1", b""]
    assert lines.feed(b"ta: 2") == []
    assert lines.feed(b"\n") == [b"data: 2"]


@pytest.mark.parametrize(
    ("reads", "arrived"),
    [
        ([b"x" * 10, b"x" * 7], "17 bytes had arrived without its end"),  # refused as soon as it passes the cap
        ([b"x" * 17 + b"\ndata: ok\n"], "17 bytes"),  # a whole line over the cap, ended in the same read
    ],
)
def test_a_line_over_the_cap_is_refused_with_the_url_the_cap_and_what_arrived(reads: list[bytes], arrived: str) -> None:
    lines = net.Lines("http://127.0.0.1:1/generate", limit=16)
    *before, last = reads
    for data in before:
        assert lines.feed(data) == []
    with pytest.raises(net.TooLarge) as info:
        lines.feed(last)
    assert str(info.value) == (
        "http://127.0.0.1:1/generate: a line of the stream is longer than the 16 bytes this lab reads of one "
        f"line ({arrived})"
    )


def test_sizes_are_exact() -> None:
    assert [net.size(n) for n in (8 << 20, (8 << 20) + 1, 256 << 10, 3 << 30, 0)] == [
        "8 MiB",
        "8388609 bytes",
        "256 KiB",
        "3 GiB",
        "0 bytes",
    ]
