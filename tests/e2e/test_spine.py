"""End to end: a local index of tiny real wheels, real uv, a real `nox -s matrix` in a subprocess."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from compatlab.incell import fakecuda
from compatlab.runs.model import StageState
from fixtures.labutil import closed_port, nox, uv_dir
from fixtures.matrices import EXPECTED_ONLY
from fixtures.shared_run import SharedRun

ROOT = Path(__file__).resolve().parents[2]


def cells_by_axes(tmp_path: Path) -> dict[str, dict[str, Any]]:
    data = json.loads((tmp_path / "reports" / "latest" / "results.json").read_text())
    assert data["schema"] == "compatlab.results/1"
    return {c["id"]: c for c in data["cells"]}


def stage(cell: dict[str, Any], name: str) -> dict[str, Any]:
    return next(s for s in cell["stages"] if s["name"] == name)


def test_matrix_run_with_expected_verdicts_only(expected_only_run: SharedRun) -> None:
    done, tmp_path, index_url = expected_only_run, expected_only_run.folder, expected_only_run.url
    assert done.returncode == 0, done.said
    cells = cells_by_axes(tmp_path)
    assert {cid: c["state"] for cid, c in cells.items()} == {
        "torch2.9.1+cu130-sglkernel0.3.21-flashinfer0.6.4-cuda12.8": "n/a",
        "torch2.9.1+cu130-sglkernel0.3.21-flashinfer0.6.4-cuda13.0": "partial",
        "torch2.9.1+cu130-sglkernel0.3.21-flashinfer0.7.4-cuda12.8": "n/a",
        "torch2.9.1+cu130-sglkernel0.3.21-flashinfer0.7.4-cuda13.0": "partial",
        "torch2.9.1+cu128-sglkernel0.3.21-flashinfer0.6.4-cuda12.8": "partial",
        "torch2.9.1+cu128-sglkernel0.3.21-flashinfer0.6.4-cuda13.0": "n/a",
        "torch2.9.1+cu128-sglkernel0.3.21-flashinfer0.7.4-cuda12.8": "fail",
        "torch2.9.1+cu128-sglkernel0.3.21-flashinfer0.7.4-cuda13.0": "n/a",
    }
    ok = cells["torch2.9.1+cu130-sglkernel0.3.21-flashinfer0.6.4-cuda13.0"]
    assert "torch==2.9.1+cu130" in ok["freeze"]
    assert ok["install"]["argv"][1:3] == ["pip", "install"]
    spec = tomllib.loads(ok["install"]["files"]["pyproject.toml"])
    assert spec["tool"]["uv"] == {
        "index": [{"name": "index-1", "url": f"{index_url}/torch/simple", "explicit": True}],
        "sources": {"torch": {"index": "index-1"}},
    }
    assert spec["project"]["dependencies"] == ["torch==2.9.1+cu130", "sgl-kernel==0.3.21", "flashinfer-python==0.6.4"]
    assert stage(ok, "pins")["state"] == "pass"
    mix = cells["torch2.9.1+cu128-sglkernel0.3.21-flashinfer0.7.4-cuda12.8"]
    assert mix["expected"] == {
        "state": "fail",
        "reason": "cuda-bindings 13 beside a CUDA 12.8 torch; our driver is older",
    }
    assert mix["unexpected"] is False
    assert mix["reason"] == (
        "pins: CUDA 13 package cuda-bindings 13.0.3 beside a CUDA 12.8 stack (flashinfer-python 0.7.4 requires "
        "'cuda-bindings>=13'): it needs a CUDA-13 driver, 580.65.06+; target box (min-driver 570.86) is older"
    )
    assert "[compatlab] end   torch2.9.1+cu128-sglkernel0.3.21-flashinfer0.7.4-cuda12.8: FAIL (known)" in done.stdout
    assert "totals: fail 1, n/a 4, partial 3; unexpected 0" in done.stdout
    # No GPU here: the cuda stage says so, and the cell is partial, not green.
    assert stage(ok, "cuda")["state"] == "skip"
    assert stage(ok, "cuda")["reason"] == "no NVIDIA driver on this machine (no libcuda.so.1)"
    # An amber cell says what it proved and what did not run here.
    assert ok["reason"] == (
        "ran install, pins, static, import (3/3 modules load); not run here: cuda — no NVIDIA driver on this "
        "machine (no libcuda.so.1)"
    )
    assert [s["state"] for s in ok["stages"]] == ["pass", "pass", "pass", "pass", "skip", "skip"]  # cuda, serve
    # The summary session renders the grid from the results.
    html = (tmp_path / "reports" / "latest" / "index.html").read_text()
    assert "cuda-bindings 13.0.3 beside a CUDA 12.8 stack" in html
    assert "| torch |" in (tmp_path / "reports" / "latest" / "compat.md").read_text()
    # Every live cell's result is on disk on its own too, written as the cell finished; the n/a cells are
    # facts of the matrix, written into results.json without a process of their own.
    assert len(list((tmp_path / "reports" / "runs" / "r1" / "cells").glob("*.json"))) == 4


NEWS = """
name = "spine-b"
[[axes.torch]]
version = "2.9.1+cu130"
index = "{url}/torch/simple"
cuda = "13.0"
[[axes.sgl-kernel]]
version = "0.3.21"
[[axes.flashinfer]]
version = "0.8.0"
[[axes.cuda]]
version = "13.0"
[install]
index-url = "{url}/public/simple"
# Meant to lift flashinfer's torch floor; it also lifts the cell's own torch pin.
overrides = ["torch>=2.10"]
[targets.box]
arch = ["sm_90"]
min-driver = "580.65"
"""


def test_a_swapped_pin_is_news(tmp_path: Path, index_url: str) -> None:
    done = nox(tmp_path, NEWS.format(url=index_url), "-s", "matrix")
    assert done.returncode == 1, done.stdout + done.stderr
    cells = cells_by_axes(tmp_path)
    swapped = cells["torch2.9.1+cu130-sglkernel0.3.21-flashinfer0.8.0-cuda13.0"]
    assert swapped["state"] == "fail"
    assert swapped["unexpected"] is True
    assert swapped["reason"] == (
        "pins: torch 2.9.1+cu130 was replaced by 2.10.0; flashinfer-python 0.8.0 requires 'torch>=2.10'; "
        "install.overrides has 'torch>=2.10' (and 1 more)"
    )
    pins = stage(swapped, "pins")["details"]
    assert pins["failures"][1:] == ["torch 2.10.0 is a CUDA 12.8 build; this cell is CUDA 13.0"]
    assert pins["warnings"] == [
        "CUDA 12 package nvidia-cuda-runtime-cu12 12.8.90 beside a CUDA 13.0 stack (torch 2.10.0 requires "
        "'nvidia-cuda-runtime-cu12==12.8.90'): two CUDA runtimes may be loaded into one process",
    ]


def test_unreachable_index_is_an_error_not_a_failure(tmp_path: Path, index_url: str) -> None:
    port = closed_port()
    matrix = EXPECTED_ONLY.format(url=index_url).replace(
        f'version = "2.9.1+cu128"\nindex = "{index_url}/torch/simple"',
        f'version = "2.9.1+cu128"\nindex = "http://127.0.0.1:{port}/simple"',
    )
    # uv's own retries of a refused connection (3, with back-off: 4 s a command, 4 commands a cell) are not what
    # this test is about; the lab's retry of the install is.
    done = nox(tmp_path, matrix, "-s", "matrix", "-k", "cu128 and cuda12", extra_env={"UV_HTTP_RETRIES": "0"})
    assert done.returncode == 1, done.stdout + done.stderr
    cells = cells_by_axes(tmp_path)
    assert len([c for c in cells.values() if c["state"] != "n/a"]) == 2  # the n/a cells come from the matrix
    down = cells["torch2.9.1+cu128-sglkernel0.3.21-flashinfer0.6.4-cuda12.8"]
    assert down["state"] == "error"
    assert down["attempts"] == 2
    # The machine's fact, told as one: which index did not answer, and for which pin.
    assert down["reason"].startswith(
        f"install: index or network failure: http://127.0.0.1:{port}/simple (the index of torch 2.9.1+cu128) did "
        "not answer: "
    ), down["reason"]
    said = done.stdout + done.stderr
    assert "install error, attempt 1 of 2; retrying: index or network failure: http://127.0.0.1:" in said
    assert stage(down, "pins") == {
        "name": "pins",
        "state": "skip",
        "reason": "blocked: install errored",
        "cause": "not-run",
        "details": {},
        "seconds": 0.0,
        "required": True,
    }


HANGING = "torch2.9.1+cu128-sglkernel0.3.21-flashinfer0.6.4-cuda12.8"
FINISHED = "torch2.9.1+cu130-sglkernel0.3.21-flashinfer0.6.4-cuda13.0"


@contextlib.contextmanager
def _run_until_hung(tmp_path: Path, index_url: str) -> Iterator[subprocess.Popen[bytes]]:
    """`nox -s matrix` whose second cell's install hangs on a server that accepts and never answers."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    port = silent.getsockname()[1]
    matrix = EXPECTED_ONLY.format(url=index_url).replace(
        'version = "2.9.1+cu128"\nindex = "' + index_url + '/torch/simple"',
        f'version = "2.9.1+cu128"\nindex = "http://127.0.0.1:{port}/simple"',
    )
    (tmp_path / "matrix.toml").write_text(matrix)
    env = {
        **os.environ,
        "PATH": f"{uv_dir()}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "COMPATLAB_MATRIX": str(tmp_path / "matrix.toml"),
        "COMPATLAB_REPORTS": str(tmp_path / "reports"),
        "COMPATLAB_VENVS": str(tmp_path / "venvs"),
        "COMPATLAB_RUN_ID": "int",
        "UV_PYTHON_DOWNLOADS": "never",
    }
    # As from a terminal: SIGINT at its default, even where this test itself was started in the background
    # (a shell then hands SIGINT down ignored, and nox would never see the Ctrl-C).
    proc = subprocess.Popen(
        [sys.executable, "-m", "nox", "-f", str(ROOT / "noxfile.py"), "-s", "matrix"],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # noqa: PLW1509
    )
    hang_venv = tmp_path / "venvs" / "int" / HANGING
    try:
        deadline = time.monotonic() + 300
        while not _installing(hang_venv) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _installing(hang_venv), "the hanging cell's install never started"
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
        silent.close()


def _installing(venv: Path) -> bool:
    """Whether a `uv pip install` into *venv* is running (its argv names the venv's python)."""
    return bool(_processes_naming(str(venv / "bin" / "python")))


def _processes_naming(needle: str) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(needle.encode() in a for a in argv) and b"pip" in argv and b"install" in argv:
            found.append(int(proc.name))
    return found


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_signal_keeps_finished_cells_and_leaves_no_install_running(
    tmp_path: Path, index_url: str, signum: int
) -> None:
    with _run_until_hung(tmp_path, index_url) as proc:
        os.killpg(proc.pid, signum)
        # A loaded CI machine can take its time to unwind nox and the cell; a real hang is killed below.
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode != 0, out.decode(errors="replace")[-2000:]
    assert proc.returncode != 0
    written = {p.stem for p in (tmp_path / "reports" / "runs" / "int" / "cells").glob("*.json")}
    assert FINISHED in written
    assert HANGING not in written
    data = json.loads((tmp_path / "reports" / "latest" / "results.json").read_text())
    assert FINISHED in {c["id"] for c in data["cells"]}
    # The hung cell's uv was killed with its group and waited for: nothing writes into its venv any more.
    hung = str(tmp_path / "venvs" / "int" / HANGING)
    if signum != signal.SIGINT:
        # Only a Ctrl-C makes nox wait for its cell (interrupt_timeout). SIGTERM or SIGHUP to the group (a
        # kill, the terminal closed) ends nox at once, which has no handler for them; the cell has the signal
        # too and kills its uv with its group, which may end a moment after nox.
        deadline = time.monotonic() + 60
        while _processes_naming(hung) and time.monotonic() < deadline:
            time.sleep(0.2)
    assert _processes_naming(hung) == []


def test_kill_9_of_nox_stops_the_orphaned_cell_before_it_writes(tmp_path: Path, index_url: str) -> None:
    with _run_until_hung(tmp_path, index_url) as proc:
        os.kill(proc.pid, signal.SIGKILL)  # nox alone: its cell process is orphaned
        proc.communicate(timeout=60)
        deadline = time.monotonic() + 60
        hung = str(tmp_path / "venvs" / "int" / HANGING)
        while _processes_naming(hung) and time.monotonic() < deadline:
            time.sleep(0.2)
        # The kernel's parent-death signal stopped the cell process, which killed its uv.
        assert _processes_naming(hung) == []
    time.sleep(2)
    written = {p.stem for p in (tmp_path / "reports" / "runs" / "int" / "cells").glob("*.json")}
    assert FINISHED in written
    assert HANGING not in written


WHY_BAD = "cuda-bindings 13 beside a CUDA 12.8 torch; our driver is older"


def test_nox_lists_cells_and_rejects_a_bad_matrix(tmp_path: Path, index_url: str) -> None:
    done = nox(tmp_path, EXPECTED_ONLY.format(url=index_url), "-l", "--json")
    assert done.returncode == 0, done.stderr
    listed = json.loads(done.stdout)
    names = [s["session"] for s in listed if s["name"] == "matrix"]
    assert names[0] == "matrix(torch2.9.1+cu130-sglkernel0.3.21-flashinfer0.6.4-cuda12.8)"
    assert len(names) == 8
    picked = nox(tmp_path, EXPECTED_ONLY.format(url=index_url), "-l", "-k", "cu128 and cuda12")
    assert [ln for ln in picked.stdout.splitlines() if ln.startswith("* matrix(")] == [
        "* matrix(torch2.9.1+cu128-sglkernel0.3.21-flashinfer0.6.4-cuda12.8) "
        "[torch-2.9.1+cu128,sgl-kernel-0.3.21,flashinfer-0.6.4,cuda-12.8] -> runs",
        "* matrix(torch2.9.1+cu128-sglkernel0.3.21-flashinfer0.7.4-cuda12.8) "
        "[torch-2.9.1+cu128,sgl-kernel-0.3.21,flashinfer-0.7.4,cuda-12.8] -> runs; expected fail: " + WHY_BAD,
    ]
    # -k and -t replace -s in nox: only the cell sessions may match them, never gpu8_perf or the summary.
    assert [ln.split("(")[0] for ln in picked.stdout.splitlines() if ln.startswith("* ")] == ["* matrix"] * 2
    tagged = nox(tmp_path, EXPECTED_ONLY.format(url=index_url), "-l", "-t", "flashinfer-0.7.4")
    assert sum(ln.startswith("* matrix(") for ln in tagged.stdout.splitlines()) == 4
    assert "flashinfer0.6.4" not in "".join(ln for ln in tagged.stdout.splitlines() if ln.startswith("* "))
    bad = nox(tmp_path, EXPECTED_ONLY.format(url=index_url).replace("[install]", "[instal]"), "-l")
    assert bad.returncode == 2
    assert bad.stderr == f"error: {tmp_path / 'matrix.toml'}: instal: unknown key; perhaps you meant 'install'?\n"


def test_a_lab_failure_is_an_error_cell_with_its_result_written(tmp_path: Path) -> None:
    """No uv on PATH: the lab cannot answer; the cell says so as `error`, and its JSON is still written."""
    (tmp_path / "matrix.toml").write_text(
        textwrap.dedent("""
        [[axes.torch]]
        version = "2.9.1"
        [[axes.sgl-kernel]]
        version = "0.3.21"
        [[axes.flashinfer]]
        version = "0.6.4"
        [[axes.cuda]]
        version = "12.8"
        """)
    )
    cell = "torch2.9.1-sglkernel0.3.21-flashinfer0.6.4-cuda12.8"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "compatlab",
            "cell",
            cell,
            "--matrix",
            str(tmp_path / "matrix.toml"),
            "--run-dir",
            str(tmp_path / "run"),
            "--venvs",
            str(tmp_path / "venvs"),
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        cwd=ROOT,
        env={"PATH": "/nonexistent", "PYTHONPATH": str(ROOT / "src"), "HOME": str(tmp_path)},
    )
    assert done.returncode == 1, done.stderr
    result = json.loads((tmp_path / "run" / "cells" / f"{cell}.json").read_text())
    assert result["state"] == "error"
    assert result["unexpected"] is True
    assert result["reason"] == (
        "install: lab error: program 'uv' not found on PATH; install it (e.g. python -m pip install uv)"
    )


def test_adding_pytest_must_not_change_the_stack(tmp_path: Path, index_url: str) -> None:
    matrix = EXPECTED_ONLY.format(url=index_url).replace(
        '[[axes.flashinfer]]\nversion = "0.6.4"',
        '[[axes.flashinfer]]\nversion = "0.6.4"\nrequires = ["pluggy==0.13.1"]',
    )
    done = nox(tmp_path, matrix, "-s", "matrix", "-k", "cu130 and flashinfer0 and cuda13")
    cells = cells_by_axes(tmp_path)
    old = cells["torch2.9.1+cu130-sglkernel0.3.21-flashinfer0.6.4-cuda13.0"]
    assert done.returncode == 1, done.stdout + done.stderr
    assert old["state"] == "error"
    assert "pluggy==0.13.1" in old["freeze"]
    # The cuda suite needs pytest too, but where the machine has no driver it is not started at all.
    suites = ("import", "cuda") if fakecuda.real_driver() is not None else ("import",)
    for name in suites:
        assert stage(old, name)["state"] == "error"
        assert stage(old, name)["reason"].startswith("adding pytest changed the stack under test: pluggy 0.13.1 -> ")
    if "cuda" not in suites:
        assert (stage(old, "cuda")["state"], stage(old, "cuda")["reason"]) == ("skip", fakecuda.NO_DRIVER)


def test_static_and_import_disagreeing_is_said_in_the_reason() -> None:
    from compatlab.runs.model import StageResult
    from compatlab.runs.verdict import verdict

    class Cell:
        def __init__(self, reason: str) -> None:
            self.reason = reason

    def cell(static: str, imported: str, why: str) -> Cell:
        stages = (
            StageResult(name="install", state=StageState.PASS),
            StageResult(name="static", state=StageState(StageState(static)), reason=why if static == "fail" else ""),
            StageResult(
                name="import", state=StageState(StageState(imported)), reason=why if imported == "fail" else ""
            ),
        )
        return Cell(verdict(stages)[1])

    assert (
        cell("fail", "pass", "x.so needs f(int)").reason
        == "static: x.so needs f(int) [import disagrees: every module loaded]"
    )
    assert cell("pass", "fail", "x.so: crashed with SIGSEGV while loading").reason == (
        "import: x.so: crashed with SIGSEGV while loading [static disagrees: it predicted no load failure]"
    )
    assert cell("fail", "fail", "x.so needs f(int)").reason == "static: x.so needs f(int)"


def test_a_preflight_stops_after_static_and_says_what_did_not_run(tmp_path: Path, index_url: str) -> None:
    done = nox(tmp_path, EXPECTED_ONLY.format(url=index_url), "-s", "matrix", "--", "--until", "static")
    assert done.returncode == 0, done.stdout + done.stderr
    ok = cells_by_axes(tmp_path)["torch2.9.1+cu130-sglkernel0.3.21-flashinfer0.6.4-cuda13.0"]
    assert [(s["name"], s["state"]) for s in ok["stages"]] == [
        ("install", "pass"),
        ("pins", "pass"),
        ("static", "pass"),
        ("import", "skip"),
        ("cuda", "skip"),
        ("serve", "skip"),
    ]
    assert (ok["state"], ok["reason"]) == (
        "partial",
        "ran install, pins, static; not run here: import, cuda, serve — preflight stopped after static",
    )
    # Progress: a line per stage as the cell runs, and where the cell is in the run.
    lines = [ln for ln in (done.stdout + done.stderr).splitlines() if ln.startswith("[compatlab]")]
    assert (
        "[compatlab] start torch2.9.1+cu130-sglkernel0.3.21-flashinfer0.6.4-cuda13.0 (1/4, not timed before)" in lines
    )
    assert [
        ln.split(": ", 1)[1].rsplit(" ", 2)[0]
        for ln in lines
        if ln.startswith("[compatlab] torch2.9.1+cu130-sglkernel0.3.21-flashinfer0.6.4-cuda13.0: ")
    ] == ["install pass", "pins pass", "static pass"]


def test_quiet_cells_print_only_their_verdict_and_bad_stage_names_are_usage_errors(
    tmp_path: Path, index_url: str
) -> None:
    (tmp_path / "matrix.toml").write_text(EXPECTED_ONLY.format(url=index_url))
    cell = "torch2.9.1+cu130-sglkernel0.3.21-flashinfer0.6.4-cuda13.0"
    env = {
        **os.environ,
        "PATH": f"{uv_dir()}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": str(ROOT / "src"),
        "UV_PYTHON_DOWNLOADS": "never",
    }
    base = [
        sys.executable,
        "-m",
        "compatlab",
        "cell",
        cell,
        "--matrix",
        str(tmp_path / "matrix.toml"),
        "--run-dir",
        str(tmp_path / "run"),
        "--venvs",
        str(tmp_path / "venvs"),
    ]
    bad = subprocess.run(
        [*base, "--until", "statik"], capture_output=True, text=True, env=env, timeout=120, check=False
    )
    assert (bad.returncode, bad.stderr) == (
        2,
        "error: no stage 'statik'; the pipeline is install, pins, static, import, cuda, serve; perhaps you meant "
        "'static'?\n",
    )
    quiet = subprocess.run(
        [*base, "--stages", "install,pins", "-q"], capture_output=True, text=True, env=env, timeout=300, check=False
    )
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stderr == ""
    assert quiet.stdout.startswith(f"[compatlab] end   {cell}: PARTIAL in ")
    assert quiet.stdout.endswith(
        " s outside stages) — ran install, pins; not run here: static, import, cuda, serve — preflight stopped after "
        "pins\n"
    )
