"""The install plan keeps credentials out of its files and argv; uv's failures are told fail or error.

Everything runs against a real index on loopback that demands basic auth (fixtures.authindex), with
real uv for the installs.
"""

from __future__ import annotations

import dataclasses
import json
import os
import textwrap
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from compatlab import envs, uv_failures
from compatlab.cells import Cell, expand
from compatlab.config.matrix import Matrix, load_matrix
from compatlab.index import probe
from compatlab.proc import Completed
from fixtures.authindex import AuthIndex, serve_auth
from fixtures.labutil import closed_port, uv_dir
from fixtures.wheels import build_wheel, write_simple_index

USER, PASSWORD = "alice", "s3cr:t/pw"
QUOTED = "s3cr%3At%2Fpw"


@pytest.fixture(scope="module")
def auth_index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AuthIndex]:
    root = tmp_path_factory.mktemp("authindex")
    w = root / "wheels"
    wheels = [build_wheel(w, "torch", v) for v in ("2.9.0", "2.9.1", "2.10.0")]
    wheels += [build_wheel(w, "sgl-kernel", "0.3.21"), build_wheel(w, "flashinfer-python", "0.6.4")]
    write_simple_index(root / "priv", wheels)
    with serve_auth(root, username=USER, password=PASSWORD) as server:
        yield server


@pytest.fixture(autouse=True)
def uv_on_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", f"{uv_dir()}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))


def with_creds(url: str) -> str:
    return url.replace("http://", f"http://{USER}:{QUOTED}@")


def matrix_of(
    tmp_path: Path, *, torch: str = "2.9.1", torch_index: str, default_index: str, find_links: str = ""
) -> tuple[Matrix, Cell]:
    path = tmp_path / "matrix.toml"
    path.write_text(
        textwrap.dedent(f"""
        [[axes.torch]]
        version = "{torch}"
        index = "{torch_index}"
        [[axes.sgl-kernel]]
        version = "0.3.21"
        {find_links}
        [[axes.flashinfer]]
        version = "0.6.4"
        [[axes.cuda]]
        version = "12.8"
        [install]
        index-url = "{default_index}"
        """)
    )
    matrix = load_matrix(path)
    return matrix, expand(matrix)[0]


def test_the_plan_writes_no_credential_and_hands_them_to_uv_by_index_name(
    tmp_path: Path, auth_index: AuthIndex
) -> None:
    url = auth_index.url
    matrix, cell = matrix_of(
        tmp_path, torch_index=with_creds(f"{url}/priv/simple"), default_index=with_creds(f"{url}/priv/simple/")
    )
    spec = tmp_path / "spec"
    plan = envs.install_plan(matrix, cell, python=Path("/venv/bin/python"), spec_dir=spec)
    assert tomllib.loads(plan.files["pyproject.toml"])["tool"]["uv"] == {
        "index": [{"name": "index-1", "url": f"{url}/priv/simple", "explicit": True}],
        "sources": {"torch": {"index": "index-1"}},
    }
    assert plan.argv[1:] == [
        "pip",
        "install",
        "--python",
        "/venv/bin/python",
        "-r",
        str(spec / "pyproject.toml"),
        "--default-index",
        f"default={url}/priv/simple/",
    ]
    written = json.dumps(plan.record().to_json()) + repr(plan)
    assert PASSWORD not in written
    assert QUOTED not in written
    env = plan.env()
    assert {k: v for k, v in env.items() if k.startswith("UV_INDEX_")} == {
        "UV_INDEX_INDEX_1_USERNAME": USER,
        "UV_INDEX_INDEX_1_PASSWORD": PASSWORD,
        "UV_INDEX_DEFAULT_USERNAME": USER,
        "UV_INDEX_DEFAULT_PASSWORD": PASSWORD,
    }
    assert [ix.shown for ix in plan.indexes] == [
        f"http://***@{url[7:]}/priv/simple",
        f"http://***@{url[7:]}/priv/simple/",
    ]


def test_uv_index_variable_names_follow_uvs_normalisation() -> None:
    assert envs.credential_variable("index-1", "USERNAME") == "UV_INDEX_INDEX_1_USERNAME"
    assert envs.credential_variable("corp.pypi_Proxy", "PASSWORD") == "UV_INDEX_CORP_PYPI_PROXY_PASSWORD"


def install(tmp_path: Path, matrix: Matrix, cell: Cell) -> tuple[envs.InstallPlan, Completed]:
    venv = tmp_path / "venv"
    assert envs.create_venv(venv, python=None).ok
    spec = tmp_path / "spec"
    plan = envs.install_plan(matrix, cell, python=envs.venv_python(venv), spec_dir=spec)
    envs.write_plan_files(plan, spec)
    return plan, envs.run_install(plan, timeout=120)


def test_uv_installs_from_an_index_that_demands_basic_auth(tmp_path: Path, auth_index: AuthIndex) -> None:
    index = with_creds(f"{auth_index.url}/priv/simple")
    matrix, cell = matrix_of(tmp_path, torch_index=index, default_index=index)
    _, done = install(tmp_path, matrix, cell)
    assert done.ok, done.stderr
    assert "+ torch==2.9.1" in done.stderr
    assert PASSWORD not in done.stdout + done.stderr + " ".join(done.argv)


def test_without_the_credentials_the_same_install_is_refused_as_an_error(tmp_path: Path, auth_index: AuthIndex) -> None:
    index = f"{auth_index.url}/priv/simple"
    matrix, cell = matrix_of(tmp_path, torch_index=index, default_index=index)
    plan, done = install(tmp_path, matrix, cell)
    assert not done.ok
    assert uv_failures.classify_uv_failure(done, plan) == (
        "error",
        f"index failure: {index} needs credentials (HTTP 401 for torch's page); put them in the URL as "
        "https://user:password@host/…",
    )
    # Without the plan, uv's own hint still tells the refusal from an unsatisfiable stack.
    assert uv_failures.classify_uv_failure(done) == (
        "error",
        "index refused access: No solution found when resolving dependencies (hint: An index URL "
        f"({index}) could not be queried due to a lack of valid authentication credentials (401 Unauthorized))",
    )


def test_a_pin_the_index_lacks_is_a_failure_that_lists_what_it_has(tmp_path: Path, auth_index: AuthIndex) -> None:
    index = with_creds(f"{auth_index.url}/priv/simple")
    matrix, cell = matrix_of(tmp_path, torch="2.9.2", torch_index=index, default_index=index)
    plan, done = install(tmp_path, matrix, cell)
    assert uv_failures.classify_uv_failure(done, plan) == (
        "fail",
        f"torch 2.9.2 is not on http://***@{auth_index.url[7:]}/priv/simple; it has 2.9.0, 2.9.1, 2.10.0",
    )
    assert uv_failures.classify_uv_failure(done) == ("fail", "unsatisfiable: there is no version of torch==2.9.2")


def test_an_index_whose_whole_path_is_404_is_an_error(tmp_path: Path, auth_index: AuthIndex) -> None:
    good = with_creds(f"{auth_index.url}/priv/simple")
    matrix, cell = matrix_of(tmp_path, torch_index=f"{auth_index.url}/gone/simple", default_index=good)
    plan, done = install(tmp_path, matrix, cell)
    assert uv_failures.classify_uv_failure(done, plan) == (
        "error",
        f"index failure: {auth_index.url}/gone/simple does not answer as a package index: HTTP 404 for its "
        "root and 404 for torch's page; check the URL",
    )


def test_a_web_page_that_is_not_an_index_is_an_error(tmp_path: Path, auth_index: AuthIndex) -> None:
    good = with_creds(f"{auth_index.url}/priv/simple")
    matrix, cell = matrix_of(tmp_path, torch_index=f"{auth_index.url}/site/simple", default_index=good)
    plan, done = install(tmp_path, matrix, cell)
    assert uv_failures.classify_uv_failure(done, plan) == (
        "error",
        f"index failure: {auth_index.url}/site/simple does not answer as a package index: its root is an "
        "HTML page that is not a simple index (PEP 503); check the URL",
    )


def test_a_project_the_index_does_not_have_is_a_failure(tmp_path: Path, auth_index: AuthIndex) -> None:
    index = with_creds(f"{auth_index.url}/priv/simple")
    matrix, cell = matrix_of(tmp_path, torch_index=index, default_index=index)
    cell = Cell(
        id=cell.id,
        values=tuple(
            v if v.axis != "flashinfer" else type(v)(axis=v.axis, version="0.6.4", package="flashinfer-nightly")
            for v in cell.values
        ),
    )
    plan, done = install(tmp_path, matrix, cell)
    assert uv_failures.classify_uv_failure(done, plan) == (
        "fail",
        f"flashinfer-nightly is not on http://***@{auth_index.url[7:]}/priv/simple; the index has no such project",
    )


def index_of(url: str) -> probe.Index:
    return probe.Index.of("x", url)


def test_probe_tells_each_kind_of_index_apart(auth_index: AuthIndex) -> None:
    url = auth_index.url
    good = index_of(with_creds(f"{url}/priv/simple"))
    assert probe.probe_index(good, "Torch") == probe.Listing(versions=("2.9.0", "2.9.1", "2.10.0"))
    assert probe.probe_index(good, "triton") == probe.Listing(note="the index has no such project")
    assert probe.probe_index(index_of(f"{url}/down/simple"), "torch") == probe.Listing(
        problem=f"{url}/down/simple answered HTTP 503 for torch's page"
    )
    wrong = index_of(f"http://{USER}:nope@{url[7:]}/priv/simple")
    assert probe.probe_index(wrong, "torch") == probe.Listing(
        problem=f"http://***@{url[7:]}/priv/simple refused the credentials (HTTP 401 for torch's page); check the "
        "user name and password"
    )
    port = closed_port()
    assert probe.probe_index(index_of(f"http://127.0.0.1:{port}/simple"), "torch") == probe.Listing(
        problem=f"http://127.0.0.1:{port}/simple is unreachable: [Errno 111] Connection refused"
    )
    # The credentials went to the index as basic auth, and only there.
    assert ("/priv/simple/torch/", "Basic YWxpY2U6czNjcjp0L3B3") in auth_index.requests


def test_probe_reads_pep_691_json(auth_index: AuthIndex) -> None:
    index = index_of(with_creds(f"{auth_index.url}/json/simple"))
    assert probe.probe_index(index, "torch") == probe.Listing(versions=("2.9.0", "2.9.1", "2.10.0"))
    # Its root answers as PEP 691 JSON (with "meta"): a working index without that project.
    assert probe.probe_index(index, "triton") == probe.Listing(note="the index has no such project")


def test_probe_reads_a_file_index_with_local_versions_in_its_links(tmp_path: Path) -> None:
    page = tmp_path / "simple" / "torch"
    page.mkdir(parents=True)
    (page / "index.html").write_text(
        '<html><head><meta name="pypi:repository-version" content="1.1"></head><body>'
        '<a href="../../files/torch-2.9.1%2Bcu130-cp311-cp311-linux_x86_64.whl#sha256=00">x</a>'
        '<a href="torch-2.9.0.tar.gz">torch-2.9.0.tar.gz</a><a href="../">up</a></body></html>'
    )
    index = probe.Index.of("x", (tmp_path / "simple").as_uri())
    assert probe.probe_index(index, "torch") == probe.Listing(versions=("2.9.0", "2.9.1+cu130"))
    assert probe.probe_index(index, "triton") == probe.Listing(
        problem=f"{index.url} does not answer as a package index: HTTP 404 for its root and 404 for triton's "
        "page; check the URL"
    )


def test_the_versions_nearest_the_pin_are_listed_when_there_are_many(tmp_path: Path) -> None:
    page = tmp_path / "simple" / "torch"
    page.mkdir(parents=True)
    (page / "index.html").write_text("".join(f'<a href="torch-2.{m}.0-py3-none-any.whl">w</a>' for m in range(20)))
    index = probe.Index.of("x", (tmp_path / "simple").as_uri())
    plan = envs.InstallPlan(
        argv=[],
        files={},
        requirements=[],
        overrides=[],
        indexes=(index,),
        pins=(envs.Pin(package="torch", version="2.12.5", index=index),),
    )
    assert uv_failures.explain_unsatisfiable(plan) == (
        "fail",
        (
            f"torch 2.12.5 is not on {index.url}; it has 2.8.0, 2.9.0, 2.10.0, 2.11.0, 2.12.0, 2.13.0, 2.14.0, "
            "2.15.0, 2.16.0, 2.17.0 (and 10 more)"
        ),
    )
    present = dataclasses.replace(plan, pins=(envs.Pin(package="torch", version="2.12.0", index=index),))
    # Every pin is where it should be: the conflict is real, and uv's own words are the reason.
    assert uv_failures.explain_unsatisfiable(present) is None


PYENV_SHIM = """#!/bin/sh
# What pyenv's shim says when the version asked is installed but not activated (pyenv 2.x, word for word).
echo "pyenv: python3.97: command not found" >&2
echo "" >&2
echo "The \\`python3.97' command exists in these Python versions:" >&2
echo "  3.97.1" >&2
echo "" >&2
echo "Note: See 'pyenv help global' for tips on allowing multiple" >&2
echo "      Python versions to be found at the same time." >&2
exit 127
"""


def test_a_pyenv_shim_for_a_version_not_activated_is_told_as_the_machine_fact_it_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shims = tmp_path / "pyenv" / "shims"
    shims.mkdir(parents=True)
    (shims / "python3.97").write_text(PYENV_SHIM, encoding="utf-8")
    (shims / "python3.97").chmod(0o755)
    monkeypatch.setenv("PATH", f"{shims}{os.pathsep}{uv_dir()}{os.pathsep}{os.environ['PATH']}")
    done = envs.create_venv(tmp_path / "venv", python="3.97")
    assert not done.ok
    cell = Cell(id="c", values=())
    said = uv_failures.venv_failure(done, python="3.97", cell=cell)
    assert said == (
        f"Python 3.97: uv found {shims / 'python3.97'}, a pyenv shim, and pyenv has 3.97.1 but has not activated "
        f"it ({tmp_path / 'pyenv' / 'versions' / '3.97.1' / 'bin' / 'python3.97'}); fix: `pyenv global <your "
        "default> 3.97.1` so that the shim answers, or put that interpreter's folder first on PATH"
    )
