"""End to end: `compatlab lock` and `nox -s lock` against a live index on loopback, then `nox -l` and the
report reading the lock.

The index gains a release between two locks (news, in changes.md), holds a yanked and a pre-release (left
out), and becomes unreachable (a clear error, the old lock kept byte for byte); a lock older than its
matrix is said by `nox -l`, and a missing one is an error that names the fix.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from fixtures.labutil import nox
from fixtures.liveindex import LiveIndex, serve_live
from fixtures.wheels import build_wheel

ROOT = Path(__file__).resolve().parents[2]
CU13 = ['cuda-toolkit[cudart]==13.0.3; platform_system == "Linux"']


@pytest.fixture
def live(tmp_path: Path) -> Iterator[LiveIndex]:
    w = tmp_path / "wheels"
    wheels = [build_wheel(w, "torch", v, requires=CU13) for v in ("2.13.0", "2.14.0", "2.14.1", "2.14.2", "2.15.0rc1")]
    wheels += [
        build_wheel(w, "sglang-kernel", "0.4.10", requires=["torch==2.14.1"]),
        build_wheel(w, "flashinfer-python", "0.7.2", requires=["torch"]),
    ]
    with serve_live(wheels) as server:
        server.yank("torch-2.14.2-py3-none-any.whl")
        yield server


def matrix_text(url: str) -> str:
    return textwrap.dedent(f"""
        name = "living"
        [axes.torch]
        select = {{ latest = 2, per = "minor" }}
        [[axes.sglang-kernel]]
        version = "0.4.10"
        [[axes.flashinfer]]
        version = "0.7.2"
        [[axes.cuda]]
        version = "13.0"
        [install]
        index-url = "{url}/simple"
        [report]
        rows = ["torch"]
        columns = ["sglang-kernel", "flashinfer"]
        """)


def lab(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run(
        [sys.executable, "-m", "compatlab", *args], capture_output=True, text=True, env=env, timeout=120, check=False
    )


def test_lock_news_yanked_pre_unreachable_and_stale(live: LiveIndex, tmp_path: Path) -> None:
    matrix = tmp_path / "matrix.toml"
    matrix.write_text(matrix_text(live.url))
    lock = tmp_path / "matrix.lock"

    listed = nox(tmp_path, matrix_text(live.url), "-l")
    assert listed.returncode == 2
    assert listed.stderr.strip() == (
        f"error: {matrix}: axes.torch: selects its versions (latest 2 per minor) from its "
        f"index, and there is no {lock}; run `compatlab lock` (or `nox -s lock`) to resolve them"
    )

    first = nox(tmp_path, matrix_text(live.url), "-s", "lock")
    assert first.returncode == 0, first.stderr
    text = lock.read_text()
    # 2.14.2 is yanked and 2.15.0rc1 a pre-release: the newest patch of the last two minors is 2.14.1.
    assert '{ version = "2.13.0", cuda = "13.0" }' in text
    assert '{ version = "2.14.1", cuda = "13.0" }' in text
    assert "2.14.2" not in text
    assert "2.15.0rc1" not in text
    assert '{ version = "0.4.10", pins = { torch = "==2.14.1" } }' in text

    listed = nox(tmp_path, matrix_text(live.url), "-l")
    assert listed.returncode == 0, listed.stderr
    assert "matrix(torch2.14.1-sglangkernel0.4.10-flashinfer0.7.2-cuda13.0)" in listed.stdout
    assert "matrix(torch2.13.0-sglangkernel0.4.10-flashinfer0.7.2-cuda13.0)" in listed.stdout
    assert "note:" not in listed.stderr

    live.add(build_wheel(tmp_path / "wheels", "torch", "2.15.0", requires=["cuda-toolkit[cudart]==13.2.2"]))
    second = lab("lock", "--matrix", str(matrix), "--news", str(tmp_path / "news.md"))
    assert second.returncode == 0, second.stderr
    resolved = next(line for line in text.splitlines() if line.startswith("resolved = ")).split('"')[1]
    news = f"torch 2.15.0 is out on {live.url}/simple (chosen; new since the lock of {resolved})"
    assert second.stdout.splitlines() == [
        f"torch: 2.14.1, 2.15.0 (latest 2 per minor; {live.url}/simple)",
        f"sglang-kernel: 0.4.10 (listed; {live.url}/simple)",
        f"flashinfer: 0.7.2 (listed; {live.url}/simple)",
        f"news: {news}",
        f"wrote {lock}",
    ]
    assert (tmp_path / "news.md").read_text() == f"### Upstream releases new since the previous lock (1)\n\n- {news}\n"

    # The news lead changes.md, even for a first run.
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"schema": "compatlab.results/1", "run": {"id": "r1"}, "cells": []}))
    report = lab(
        "report", str(results), "--out", str(tmp_path / "site"), "--no-history", "--news", str(tmp_path / "news.md")
    )
    assert report.returncode == 0, report.stderr
    assert (tmp_path / "site" / "changes.md").read_text() == (tmp_path / "news.md").read_text()

    # A torch whose CUDA the matrix has no column for: its cells are n/a, and nox -l says why.
    listed = nox(tmp_path, matrix_text(live.url), "-l")
    assert listed.stderr.strip() == (
        "note: axes.torch: torch 2.15.0 is a CUDA 13.2 build and no column of axis 'cuda' "
        "(13.0) matches: its cells are n/a; add a cuda value '13.2' to test it"
    )

    before = lock.read_bytes()
    live.stop()
    down = lab("lock", "--matrix", str(matrix), "--timeout", "5")
    assert down.returncode == 1
    resolved = next(line for line in before.decode().splitlines() if line.startswith("resolved = ")).split('"')[1]
    port = live.url.rsplit(":", 1)[1]
    assert down.stderr == (
        f"error: cannot resolve the axes of {matrix}:\n"
        f"  axes.torch: http://127.0.0.1:{port}/simple is unreachable: [Errno 111] Connection refused\n"
        f"  axes.sglang-kernel: http://127.0.0.1:{port}/simple is unreachable: [Errno 111] Connection refused\n"
        f"  axes.flashinfer: http://127.0.0.1:{port}/simple is unreachable: [Errno 111] Connection refused\n"
        f"{lock} was not changed (resolved {resolved}); run `compatlab lock` again when the index answers\n"
    )
    assert lock.read_bytes() == before

    # matrix.toml changed its axes after the lock: nox -l still lists the locked cells and says so.
    stale = nox(
        tmp_path,
        matrix_text(live.url).replace('version = "13.0"', 'version = "13.0"\n[[axes.cuda]]\nversion = "13.2"'),
        "-l",
    )
    assert stale.returncode == 0, stale.stderr
    assert stale.stderr.splitlines()[0] == (
        f"note: {lock} is older than {matrix}: its axes changed since the lock was resolved ({resolved}); run "
        "`compatlab lock` (or `nox -s lock`) to resolve them again"
    )
    assert "matrix(torch2.15.0-sglangkernel0.4.10-flashinfer0.7.2-cuda13.2)" in stale.stdout
