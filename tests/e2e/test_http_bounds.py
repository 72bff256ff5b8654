"""Every HTTP client of the lab against real loopback servers that misbehave on purpose: the SGLang stand-in
(``fixtures.standin_server``: ``--drip``, ``--huge-body``, ``--huge-line``, ``--wrong-shape``,
``--token-factor``), the serve stage on the SGLang stand-in (``fixtures.fakesglang``), and the index that
misbehaves (``fixtures.badindex``). Each request is bounded as a whole (``compatlab.net``): these tests
assert the error and its message, and that the time taken stays under three times the limit, never a
precise duration.
"""

from __future__ import annotations

import os
import re
import sys
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from compatlab.cells import expand
from compatlab.config.matrix import parse_matrix
from compatlab.config.perf import Protocol, ServerSpec
from compatlab.index import client
from compatlab.runs.model import StageState
from compatlab.stages.base import CellContext
from compatlab.stages.serve.stage import run_serve_stage
from compatlab.stages.sglang.client import Target, run_level
from compatlab.stages.sglang.server import ServerFailure, ServerProcess, group_members
from fixtures.badindex import BadIndex, serve_bad
from fixtures.fakesglang import fake_sglang_venv
from fixtures.hostile import hard_deadline
from fixtures.wheels import build_wheel

TESTS = str(Path(__file__).resolve().parents[1])  # where fixtures lives
STANDIN = [
    sys.executable,
    "-c",
    f"import sys; sys.path.insert(0, {TESTS!r}); from fixtures.standin_server import main; sys.exit(main())",
    "--port",
    "{port}",
    "--ttft-ms",
    "1",
]


def _server(tmp_path: Path, *flags: str, startup: float = 20.0) -> ServerProcess:
    spec = ServerSpec(name="baseline", argv=(), startup_timeout=startup, stop_timeout=5.0, release_timeout=10.0)
    return ServerProcess(spec, [*STANDIN, *flags], dict(os.environ), tmp_path / "standin.log")


def _gone(server: ServerProcess) -> None:
    assert server.proc is not None
    assert group_members(server.pid) == []


# -- the readiness polls: /health_generate, then /model_info -----------------------------------------------


def test_a_server_that_drips_is_cut_off_at_the_start_up_limit(tmp_path: Path) -> None:
    # A byte every 0.2 s: each read is quick, so a limit per read never fires. Before, a 15 s start-up limit
    # held 138 s against a byte every 0.5 s (then took the answer); here the 2 s limit is the whole wait.
    server = _server(tmp_path, "--drip", "0.2", startup=2)
    start = time.monotonic()
    drips = "a start-up poll against a server that drips"
    with hard_deadline(20, drips), server, pytest.raises(ServerFailure) as info:
        server.wait_ready()
    elapsed = time.monotonic() - start
    _gone(server)
    assert info.value.state == StageState.ERROR
    port = server.port
    assert re.fullmatch(
        rf"baseline server did not become healthy within 2 s \(/health_generate on port {port}\); the last "
        rf"poll: http://127\.0\.0\.1:{port}/health_generate: no complete answer within [0-9.]+ s",
        str(info.value),
    ), str(info.value)
    assert elapsed < 3 * 2


def test_a_huge_json_answer_is_refused_at_the_cap(tmp_path: Path) -> None:
    # /model_info answers 64 MiB of valid JSON, chunked (no Content-Length to refuse it by).
    server = _server(tmp_path, "--huge-body", "64")
    with hard_deadline(60, "a huge /model_info"), server, pytest.raises(ServerFailure) as info:
        server.wait_ready()
    _gone(server)
    assert (info.value.state, str(info.value)) == (
        StageState.ERROR,
        f"baseline server: http://127.0.0.1:{server.port}/model_info: the answer is larger than the 8 MiB this "
        "lab reads of one answer",
    )


# -- JSON of the wrong shape -----------------------------------------------------------------------------


def test_model_info_of_the_wrong_shape_is_an_error_not_a_wait(tmp_path: Path) -> None:
    server = _server(tmp_path, "--wrong-shape", "model-info", startup=5)
    with hard_deadline(20, "a /model_info of the wrong shape"), server, pytest.raises(ServerFailure) as info:
        server.wait_ready()
    _gone(server)
    assert (info.value.state, str(info.value)) == (
        StageState.ERROR,
        f"baseline server: http://127.0.0.1:{server.port}/model_info: expected an object, got an array",
    )


def test_server_info_of_the_wrong_shape_is_an_error_not_a_figure_taken_for_absent(tmp_path: Path) -> None:
    # internal_states an object, not SGLang's array: read as "not logged yet" before, the figure lost.
    server = _server(tmp_path, "--wrong-shape", "server-info", "--accept-length", "3")
    with hard_deadline(30, "a /server_info of the wrong shape"), server:
        server.wait_ready()
        with pytest.raises(ServerFailure) as info:
            server.server_accept_length()
    _gone(server)
    assert (info.value.state, str(info.value)) == (
        StageState.ERROR,
        f"baseline server: http://127.0.0.1:{server.port}/server_info: internal_states: expected an array, "
        "got an object",
    )


def _stream(
    tmp_path: Path, flags: list[str], protocol: Protocol = "generate", output_len: int = 8
) -> tuple[int, str, bool]:
    """One request streamed from a stand-in with *flags*: (port, the error, whether it is untrusted)."""
    server = _server(tmp_path, "--tok-s", "0", *flags)
    with hard_deadline(60, f"a stream from a stand-in with {flags}"), server:
        server.wait_ready()
        level = run_level(
            Target(port=server.port, protocol=protocol, model="standin/model"),
            ["a b c"],
            concurrency=1,
            requests=1,
            output_len=output_len,
            timeout=30,
        )
    _gone(server)
    (result,) = level.requests
    assert not result.ok
    assert level.tokens == 0  # a failed request counts for no figure
    return server.port, result.error, result.untrusted


@pytest.mark.parametrize(
    ("protocol", "flag", "problem"),
    [
        # Before: TypeError (int() of an array), KeyError (choices[0] of an object), AttributeError
        # (.get of a string), each a traceback out of run_level.
        ("generate", "stream", "meta_info.spec_verify_ct: expected an integer or null, got an array"),
        ("openai", "stream", "choices: expected an array or null, got an object"),
        ("openai", "stream-strings", 'choices[0]: expected an object, got a string (" fast")'),
    ],
)
def test_a_stream_event_of_the_wrong_shape_fails_the_request_with_the_key(
    tmp_path: Path, protocol: Protocol, flag: str, problem: str
) -> None:
    port, error, untrusted = _stream(tmp_path, ["--wrong-shape", flag], protocol)
    path = "/v1/completions" if protocol == "openai" else "/generate"
    assert error == f"http://127.0.0.1:{port}{path}: an event of the wrong shape after 0 tokens: {problem}"
    assert untrusted


def test_a_huge_stream_line_is_refused_at_the_cap(tmp_path: Path) -> None:
    # The first event is valid JSON on one 64 MiB line: before, it was buffered whole and believed.
    port, error, untrusted = _stream(tmp_path, ["--huge-line", "64"])
    assert re.fullmatch(
        rf"http://127\.0\.0\.1:{port}/generate: a line of the stream is longer than the 8 MiB this lab reads of "
        r"one line \(\d+ bytes had arrived without its end\)",
        error,
    ), error
    assert untrusted


# -- token counts: what the server reports against what was asked ------------------------------------------


@pytest.mark.parametrize("protocol", ["generate", "openai"])
@pytest.mark.parametrize("factor", [50, 0])
def test_a_token_count_other_than_asked_is_the_servers_error(tmp_path: Path, protocol: Protocol, factor: int) -> None:
    port, error, untrusted = _stream(tmp_path, ["--token-factor", str(factor)], protocol, output_len=8)
    path, field = ("/v1/completions", "max_tokens") if protocol == "openai" else ("/generate", "max_new_tokens")
    assert error == (
        f"http://127.0.0.1:{port}{path}: the server reported {8 * factor} output tokens for a request of 8 "
        f"({field} with ignore_eos): its token counts cannot be believed"
    )
    assert untrusted


SERVE_MATRIX = """
[[axes.torch]]
version = "2.11.0"
[[axes.sglang]]
version = "0.5.17"
[[axes.cuda]]
version = "13.0"
[serve]
output-len = 24
requests = 1
concurrency = [1]
startup-timeout = 60
"""


@pytest.fixture(scope="module")
def gpu_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fake_sglang_venv(tmp_path_factory.mktemp("bounds"))


@pytest.mark.parametrize(("fault", "reported"), [("tokens-50x", 1200), ("tokens-0x", 0)])
def test_the_serve_stage_calls_a_miscounting_server_an_error_not_a_fail(
    tmp_path: Path, gpu_venv: Path, monkeypatch: pytest.MonkeyPatch, fault: str, reported: int
) -> None:
    monkeypatch.setenv("STANDIN_SGLANG_FAULT", fault)
    matrix = parse_matrix(tomllib.loads(SERVE_MATRIX), str(tmp_path / "matrix.toml"))
    context = CellContext(
        matrix=matrix,
        cell=expand(matrix)[0],
        venv=gpu_venv,
        python=gpu_venv / "bin" / "python",
        site_packages=next(gpu_venv.glob("lib/python3*/site-packages")),
        work_dir=tmp_path / "cell",
    )
    stage = run_serve_stage(context)
    assert stage.state == StageState.ERROR, stage.reason
    assert re.fullmatch(
        r"baseline server failed a request at concurrency 1: http://127\.0\.0\.1:\d+/generate: the server "
        rf"reported {reported} output tokens for a request of 24 \(max_new_tokens with ignore_eos\): its token "
        r"counts cannot be believed",
        stage.reason,
    ), stage.reason


# -- the package index ---------------------------------------------------------------------------------


@pytest.fixture
def bad(tmp_path: Path) -> Iterator[BadIndex]:
    with serve_bad(build_wheel(tmp_path, "hostpkg", "1.0")) as server:
        yield server


def test_an_index_that_drips_its_headers_is_let_go_at_the_deadline(bad: BadIndex) -> None:
    # Before, the request ran on in a thread the caller stopped waiting for: the connection stayed open,
    # read a byte every 0.2 s, for as long as the server dripped. Now it is closed at the deadline.
    start = time.monotonic()
    with hard_deadline(20, "an index that drips its headers"), pytest.raises(client.IndexUnavailable) as info:
        client.releases(f"{bad.url}/driphead/simple", "hostpkg", timeout=1)
    assert time.monotonic() - start < 3 * 1
    assert str(info.value) == f"{bad.url}/driphead/simple is unreachable: no complete answer within 1 s"
    assert bad.hangups.acquire(timeout=5), "the lab still holds the connection after its deadline"


def test_an_index_page_of_the_wrong_shape_is_no_answer(bad: BadIndex) -> None:
    # Before, the file whose filename is a number was left out in silence: "no releases".
    with pytest.raises(client.IndexUnavailable) as info:
        client.releases(f"{bad.url}/shape/simple", "hostpkg", timeout=5)
    assert str(info.value) == (
        f"{bad.url}/shape/simple answered PEP 691 JSON of the wrong shape for hostpkg's page: "
        "files[0].filename: expected a string, got an integer (7)"
    )
