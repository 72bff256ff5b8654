"""End to end: indexes that demand basic auth, credentials only in matrix.toml's URLs, real nox and uv.

The installs must succeed (so uv got the credentials, through its environment), and afterwards not one
file the lab wrote (run folder, plan files, venvs, uv's cache, report, published site) nor any output it
printed (nox's, the lab's debug log) may hold the password, in any of its spellings.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fixtures.authindex import AuthIndex, serve_auth
from fixtures.labutil import nox, uv_dir
from fixtures.wheels import build_wheel, write_simple_index

ROOT = Path(__file__).resolve().parents[2]
USER, PASSWORD = "ci-bot", "pa:ss/w@rd#1"
QUOTED = "pa%3Ass%2Fw%40rd%231"
SPELLINGS = [PASSWORD, QUOTED, base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()]
GOOD = "torch2.9.1+cu130-sglkernel0.3.21-flashinfer0.6.4-cuda13.0"
MISSING = "torch2.9.3+cu130-sglkernel0.3.21-flashinfer0.6.4-cuda13.0"
GONE = "torch2.9.1+cu128-sglkernel0.3.21-flashinfer0.6.4-cuda13.0"


@pytest.fixture(scope="module")
def private(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AuthIndex]:
    root = tmp_path_factory.mktemp("private")
    w = root / "wheels"
    cu13 = {"torch/version.py": "cuda = '13.0'\n"}
    torch = [
        build_wheel(w, "torch", v, files=cu13, requires=["nvidia-cuda-runtime-cu13==13.0.96"])
        for v in ("2.9.0+cu130", "2.9.1+cu130", "2.10.0+cu130")
    ]
    public = [
        build_wheel(w, "sgl-kernel", "0.3.21"),
        build_wheel(w, "flashinfer-python", "0.6.4", requires=["torch"]),
        build_wheel(w, "nvidia-cuda-runtime-cu13", "13.0.96"),
    ]
    write_simple_index(root / "torch", torch)
    write_simple_index(root / "public", public)
    # Files a direct-URL requirement names, behind the same credentials (GET /direct/<file>).
    build_wheel(root / "direct", "directpkg", "1.0")
    build_wheel(root / "direct", "nvidia-cuda-runtime-cu13", "13.0.96")
    with serve_auth(root, username=USER, password=PASSWORD) as server:
        yield server


def matrix_text(url: str) -> str:
    creds = url.replace("http://", f"http://{USER}:{QUOTED}@")
    return f"""
        name = "secrets"
        [[axes.torch]]
        version = "2.9.1+cu130"
        index = "{creds}/torch/simple"
        [[axes.torch]]
        version = "2.9.3+cu130"
        index = "{creds}/torch/simple"
        [[axes.torch]]
        version = "2.9.1+cu128"
        index = "{creds}/gone/simple"
        [[axes.sgl-kernel]]
        version = "0.3.21"
        [[axes.flashinfer]]
        version = "0.6.4"
        [[axes.cuda]]
        version = "13.0"
        [install]
        index-url = "{creds}/public/simple"
        retries = 0
        """


def leaks(root: Path, *texts: str) -> list[str]:
    """Where any spelling of the password occurs: files under *root* (by grep -r) and the texts.

    matrix.toml is where the user wrote the credentials: the one file that holds them by design.
    """
    found = []
    for word in SPELLINGS:
        done = subprocess.run(
            ["grep", "-rlF", "--binary-files=text", "--exclude=matrix.toml", "-e", word, str(root)],
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode in (0, 1), done.stderr
        found += done.stdout.splitlines()
        found += [f"output #{i}" for i, text in enumerate(texts) if word in text]
    return found


def cells(run: Path) -> dict[str, dict[str, Any]]:
    data = json.loads((run / "results.json").read_text())
    return {c["id"]: c for c in data["cells"]}


def test_credentials_reach_uv_and_nothing_else(tmp_path: Path, private: AuthIndex) -> None:
    url = private.url
    env = {"UV_CACHE_DIR": str(tmp_path / "uv-cache")}
    done = nox(tmp_path, matrix_text(url), "-s", "matrix", extra_env=env)
    assert done.returncode == 1, done.stdout + done.stderr  # the missing pin and the broken index are news
    got = cells(tmp_path / "reports" / "runs" / "r1")
    assert {cid: c["state"] for cid, c in got.items()} == {GOOD: "partial", MISSING: "fail", GONE: "error"}
    host = url.removeprefix("http://")
    # Installed from the private indexes: uv sent the credentials it was given by environment.
    assert "torch==2.9.1+cu130" in got[GOOD]["freeze"]
    token = "Basic " + SPELLINGS[2]
    assert {p for p, auth in private.requests if auth == token} >= {
        "/torch/simple/torch/",
        "/public/simple/sgl-kernel/",
    }
    assert got[MISSING]["reason"] == (
        f"install: torch 2.9.3+cu130 is not on http://***@{host}/torch/simple; it has 2.9.0+cu130, 2.9.1+cu130, "
        "2.10.0+cu130"
    )
    assert got[GONE]["reason"] == (
        f"install: index failure: http://***@{host}/gone/simple does not answer as a package index: HTTP 404 for its "
        "root and 404 for torch's page; check the URL"
    )
    spec = tmp_path / "reports" / "runs" / "r1" / "cells" / GOOD / "spec" / "pyproject.toml"
    assert f'url = "{url}/torch/simple"' in spec.read_text()
    assert got[GOOD]["install"]["argv"][-2:] == ["--default-index", f"default={url}/public/simple"]

    site = tmp_path / "site"
    published = nox(
        tmp_path,
        matrix_text(url),
        "-s",
        "publish",
        "--",
        "--site",
        str(site),
        "--runs",
        str(tmp_path / "reports" / "runs"),
        extra_env=env,
    )
    assert published.returncode == 0, published.stdout + published.stderr
    assert (site / "index.html").is_file()
    assert f"http://***@{host}/torch/simple; it has 2.9.0+cu130" in (site / "index.html").read_text()

    # The lab's own log at its most verbose, with every argv it runs, for one cell.
    debug = subprocess.run(
        [
            sys.executable,
            "-m",
            "compatlab",
            "--debug",
            "cell",
            GOOD,
            "--matrix",
            str(tmp_path / "matrix.toml"),
            "--run-dir",
            str(tmp_path / "debug-run"),
            "--venvs",
            str(tmp_path / "debug-venvs"),
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
        cwd=ROOT,
        env={
            **os.environ,
            **env,
            "PATH": f"{uv_dir()}{os.pathsep}{os.environ['PATH']}",
            "PYTHONPATH": str(ROOT / "src"),
            "UV_PYTHON_DOWNLOADS": "never",
        },
    )
    assert debug.returncode == 0, debug.stderr
    assert f"compatlab.incell.proc: $ {uv_dir()}/uv pip install --python" in debug.stderr

    # The search does find a spelling where one is: in the user's own matrix.toml.
    assert subprocess.run(["grep", "-qF", QUOTED, str(tmp_path / "matrix.toml")], check=False).returncode == 0
    outputs = (done.stdout, done.stderr, published.stdout, published.stderr, debug.stdout, debug.stderr)
    assert leaks(tmp_path, *outputs) == []


DIRECT = "torch2.9.1+cu130-sglkernel0.3.21-flashinfer0.6.4-cuda13.0"
CUDART = "nvidia_cuda_runtime_cu13-13.0.96-py3-none-any.whl"


def test_credentials_in_direct_url_requirements_reach_uv_and_nothing_else(tmp_path: Path, private: AuthIndex) -> None:
    url = private.url
    creds = url.replace("http://", f"http://{USER}:{QUOTED}@")
    text = f"""
        [[axes.torch]]
        version = "2.9.1+cu130"
        index = "{url}/torch/simple"
        requires = ["directpkg @ {creds}/direct/directpkg-1.0-py3-none-any.whl"]
        [[axes.sgl-kernel]]
        version = "0.3.21"
        [[axes.flashinfer]]
        version = "0.6.4"
        [[axes.cuda]]
        version = "13.0"
        [install]
        index-url = "{creds}/public/simple"
        overrides = ["nvidia-cuda-runtime-cu13 @ {creds}/direct/{CUDART}"]
        retries = 0
        """
    env = {"UV_CACHE_DIR": str(tmp_path / "uv-cache")}
    done = nox(
        tmp_path,
        text.replace(f'index = "{url}/torch/simple"', f'index = "{creds}/torch/simple"'),
        "-s",
        "matrix",
        extra_env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    got = cells(tmp_path / "reports" / "runs" / "r1")[DIRECT]
    # Installed from the URLs, with the credentials uv took from its environment.
    assert f"directpkg @ {url}/direct/directpkg-1.0-py3-none-any.whl" in got["freeze"]
    assert f"nvidia-cuda-runtime-cu13 @ {url}/direct/{CUDART}" in got["freeze"]
    token = "Basic " + SPELLINGS[2]
    assert {p for p, auth in private.requests if auth == token} >= {
        "/direct/directpkg-1.0-py3-none-any.whl",
        f"/direct/{CUDART}",
    }
    assert f"directpkg @ {url}/direct/directpkg-1.0-py3-none-any.whl" in got["install"]["requirements"]

    # check's pins and constraints: a direct URL is no pin, and the error says so without the password; the
    # constraints' pip options (an --index-url with credentials) are not pins either, and go nowhere.
    venv = tmp_path / "venvs" / "r1" / DIRECT
    assert (venv / "bin" / "python").exists()
    with tempfile.TemporaryDirectory() as user:  # the user's own files, outside what the lab writes
        direct = f"directpkg @ {creds}/direct/directpkg-1.0-py3-none-any.whl"
        shown = f"directpkg @ http://***@{url.removeprefix('http://')}/direct/directpkg-1.0-py3-none-any.whl"
        good, bad = Path(user) / "good.txt", Path(user) / "bad.txt"
        good.write_text(f"directpkg==1.0\n--index-url {creds}/public/simple\n")
        bad.write_text(f"{direct}\n")
        checks = [
            _check(tmp_path, venv, "--constraints", str(good), "--stage", "pins", "--out", str(tmp_path / "check")),
            _check(tmp_path, venv, "--pin", direct, "--out", str(tmp_path / "check-pin")),
            _check(tmp_path, venv, "--constraints", str(bad), "--out", str(tmp_path / "check-bad")),
        ]
    assert checks[0].returncode == 0, checks[0].stdout + checks[0].stderr
    assert (checks[1].returncode, checks[1].stderr) == (
        2,
        f"error: --pin: {shown!r} is not a pin; expected NAME==VERSION, e.g. directpkg==2.9.1\n",
    )
    assert (checks[2].returncode, checks[2].stderr) == (
        2,
        f"error: {bad}: line 1: {shown!r} is not a pin; expected NAME==VERSION, e.g. directpkg==2.9.1\n",
    )
    outputs = (done.stdout, done.stderr, *(c.stdout + c.stderr for c in checks))
    assert leaks(tmp_path, *outputs) == []


def _check(tmp_path: Path, venv: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "compatlab", "check", "--venv", str(venv), *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src"), "COMPATLAB_CACHE": str(tmp_path / "cache")},
    )
