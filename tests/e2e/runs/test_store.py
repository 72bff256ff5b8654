"""The run folder: unreadable cells, merges that disagree, links, owners, latest, and writes that fail.

Real files and real `python -m compatlab` processes; the disk and read-only cases mount a real tmpfs or a
read-only bind mount where this process may (root in a container), and skip saying so where it may not.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import BinaryIO

import pytest

from compatlab.cells import planned
from compatlab.config.matrix import Matrix, load_matrix
from compatlab.host import host_facts
from compatlab.runs import store
from compatlab.runs.model import CELL_SCHEMA, CellResult, CellState, StageResult, StageState
from fixtures.labutil import ROOT, nox, uv_dir
from fixtures.matrices import ONE_CELL, ONE_CELL_ID

MATRIX = """
[[axes.torch]]
version = "2.9.1"
cuda = "12.8"
[[axes.sgl-kernel]]
version = "0.3.21"
[[axes.flashinfer]]
version = "0.6.4"
[[axes.cuda]]
version = "12.8"
[[axes.cuda]]
version = "13.0"
"""
LIVE = "torch2.9.1-sglkernel0.3.21-flashinfer0.6.4-cuda12.8"
NA = "torch2.9.1-sglkernel0.3.21-flashinfer0.6.4-cuda13.0"
NA_REASON = "torch 2.9.1 is built for CUDA 12.8, this column is CUDA 13.0"
HOST = socket.gethostname()


@pytest.fixture
def matrix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Matrix:
    (tmp_path / "matrix.toml").write_text(MATRIX)
    monkeypatch.chdir(tmp_path)  # paths in messages are as the user typed them: relative
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    return load_matrix("matrix.toml")


def lab(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT / "src"),
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "COMPATLAB_MATRIX": "matrix.toml",
    }
    return subprocess.run(
        [sys.executable, "-m", "compatlab", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def live(state: str = "pass", reason: str = "") -> CellResult:
    stage = StageResult(name="static", state=StageState.FAIL if state == "fail" else StageState.PASS, reason=reason)
    return CellResult(
        id=LIVE,
        axes={"torch": "2.9.1", "sgl-kernel": "0.3.21", "flashinfer": "0.6.4", "cuda": "12.8"},
        state=CellState(state),
        stages=(stage,),
        reason=f"static: {reason}" if reason else "",
        finished="2026-12-02T10:00:00+00:00",
    )


def na() -> CellResult:
    return CellResult(
        id=NA,
        axes={"torch": "2.9.1", "sgl-kernel": "0.3.21", "flashinfer": "0.6.4", "cuda": "13.0"},
        state=CellState.NA,
        reason=NA_REASON,
    )


def shard(matrix: Matrix, name: str, *results: CellResult) -> Path:
    with store.claim_run(Path(name), run_id=name, plan=planned(matrix), host={"hostname": name}) as run:
        for result in results:
            run.write_cell(result)
    return Path(name)


def json_error(text: str) -> str:
    try:
        json.loads(text)
    except json.JSONDecodeError as exc:
        return str(exc)
    raise AssertionError("valid JSON")


def kept_words(tmp_path: Path, run_id: str, cell_id: str) -> str:
    folder = tmp_path / "state" / "compatlab" / "unsaved" / run_id
    return (
        f"the result is kept in {folder / 'cells' / f'{cell_id}.json'}; to bring it back: "
        f"compatlab merge <run folder> {folder} --out <new run folder>"
    )


def test_a_truncated_cell_file_is_an_error_cell_and_merge_summary_report_fail(tmp_path: Path, matrix: Matrix) -> None:
    s1 = shard(matrix, "s1", live(), na())
    path = s1 / "cells" / f"{LIVE}.json"
    text = path.read_text()[:60]
    path.write_text(text)
    why = f"unreadable result: s1/cells/{LIVE}.json: not valid JSON: {json_error(text)}"
    done = lab(tmp_path, "merge", "s1", "--out", "merged")
    assert (done.returncode, done.stdout, done.stderr) == (
        1,
        "merged 1 shard(s) into merged/results.json: 2 cells, 0 missing, 1 unreadable\n",
        f"error: {why}\n",
    )
    cells = {c.id: c for c in store.load_results(Path("merged/results.json")).cells}
    assert (cells[LIVE].state, cells[LIVE].unexpected, cells[LIVE].reason) == ("error", True, why)
    assert cells[LIVE].axes == live().axes
    summary = lab(tmp_path, "summary", "merged/results.json")
    assert (summary.returncode, summary.stderr) == (1, f"error: {why}\n")
    assert summary.stdout.endswith("totals: error 1, n/a 1; unexpected 1; unreadable 1\n")
    report = lab(tmp_path, "report", "merged/results.json", "--no-history")
    assert (report.returncode, report.stderr) == (
        1,
        f"error: merged/results.json: 1 cell result(s) could not be read, shown as errors: {why}\n",
    )
    assert (tmp_path / "merged" / "index.html").is_file()  # the grid still shows it, as an error


def test_a_list_or_a_cell_without_id_does_not_stop_the_other_cells(tmp_path: Path, matrix: Matrix) -> None:
    cells = tmp_path / "reports" / "runs" / "r1" / "cells"
    cells.mkdir(parents=True)
    (cells / "aaa-list.json").write_text("[]\n")
    (cells / "bbb-noid.json").write_text(json.dumps({"schema": CELL_SCHEMA, "axes": {}, "state": "pass"}))
    (cells / "ccc-old.json").write_text(json.dumps(live().to_json()))  # no schema: written by an older lab
    done = lab(tmp_path, "cell", NA, "-q", "--run-dir", "reports/runs/r1", "--latest", "reports/latest")
    assert done.returncode == 0, done.stderr
    results = store.load_results(Path("reports/latest/results.json"))
    assert [(c.id, c.state, c.reason) for c in results.cells] == [
        (NA, "n/a", NA_REASON),
        (
            "aaa-list",
            "error",
            "unreadable result: reports/runs/r1/cells/aaa-list.json: expected a cell result (a JSON object), got a list",
        ),
        ("bbb-noid", "error", "unreadable result: reports/runs/r1/cells/bbb-noid.json: missing key 'id'"),
        (
            "ccc-old",
            "error",
            "unreadable result: reports/runs/r1/cells/ccc-old.json: schema: expected 'compatlab.runs.cell/1', got None",
        ),
    ]
    summary = lab(tmp_path, "summary", "reports/latest/results.json")
    assert summary.returncode == 1
    assert summary.stderr == "".join(f"error: {c.reason}\n" for c in results.cells[1:])


def test_links_and_folders_in_cells_are_refused_not_followed(tmp_path: Path, matrix: Matrix) -> None:
    other = shard(matrix, "other", live("pass"))
    s1 = shard(matrix, "s1", na())
    (s1 / "cells" / f"{LIVE}.json").symlink_to((other / "cells" / f"{LIVE}.json").resolve())
    (s1 / "cells" / "zzz.json").mkdir()
    done = lab(tmp_path, "merge", "s1", "--out", "merged")
    assert (done.returncode, done.stderr) == (
        1,
        (
            f"error: unreadable result: s1/cells/{LIVE}.json: a symbolic link, not followed "
            "(a cell result must be a regular file)\n"
            "error: unreadable result: s1/cells/zzz.json: a folder, not a cell result (a cell result must be a regular file)\n"
        ),
    )
    cells = {c.id: c for c in store.load_results(Path("merged/results.json")).cells}
    assert cells[LIVE].state == CellState.ERROR
    assert not (tmp_path / "merged" / "cells" / f"{LIVE}.json").is_symlink()


def test_two_shards_that_disagree_on_a_cell_are_refused_unless_one_is_preferred(tmp_path: Path, matrix: Matrix) -> None:
    shard(matrix, "a", live("fail", "needs a symbol torch does not export"), na())
    shard(matrix, "b", live("pass"))
    done = lab(tmp_path, "merge", "a", "b", "--out", "merged")
    assert (done.returncode, done.stdout, done.stderr) == (
        1,
        "",
        (
            f"error: cell {LIVE}: different results in a/cells/{LIVE}.json (fail) and b/cells/{LIVE}.json (pass); "
            "say which shard wins with --prefer DIR\n"
        ),
    )
    assert not (tmp_path / "merged").exists()
    chosen = lab(tmp_path, "merge", "a", "b", "--out", "merged", "--prefer", "b")
    assert (chosen.returncode, chosen.stdout) == (0, "merged 2 shard(s) into merged/results.json: 2 cells, 0 missing\n")
    assert store.read_cell(Path("merged"), LIVE) == live("pass")
    # The same result twice (a shard folder copied) is one result.
    shutil.copytree("a", "a-copy")
    same = lab(tmp_path, "merge", "a", "a-copy", "--out", "merged-same")
    assert (same.returncode, same.stderr) == (0, "")
    assert store.read_cell(Path("merged-same"), LIVE) == live("fail", "needs a symbol torch does not export")
    wrong = lab(tmp_path, "merge", "a", "b", "--out", "merged-other", "--prefer", "elsewhere")
    assert (wrong.returncode, wrong.stderr) == (2, "error: --prefer elsewhere: not one of the shard folders given\n")


def test_merge_never_writes_into_another_run(tmp_path: Path, matrix: Matrix) -> None:
    assert lab(tmp_path, "cell", NA, "-q", "--run-dir", "reports/runs/r1").returncode == 0  # a finished run
    shard(matrix, "s1", live("pass"))
    before = {p: p.read_bytes() for p in Path("reports/runs/r1").rglob("*") if p.is_file()}
    r1 = store.load_results(Path("reports/runs/r1/results.json")).run
    onto = lab(tmp_path, "merge", "s1", "--out", "reports/runs/r1")
    assert (onto.returncode, onto.stdout, onto.stderr) == (
        2,
        "",
        f"error: reports/runs/r1: holds run r1 (started {r1.started}, finished {r1.finished}); a merge writes a new "
        "run, never into another one: give --out a new folder\n",
    )
    assert {p: p.read_bytes() for p in Path("reports/runs/r1").rglob("*") if p.is_file()} == before
    # A shard whose run was interrupted (claimed, never finished) keeps its cells too.
    interrupted = lab(tmp_path, "merge", "reports/runs/r1", "--out", "s1")
    assert (interrupted.returncode, interrupted.stdout) == (2, "")
    assert interrupted.stderr.endswith(
        ", interrupted); a merge writes a new run, never into another one: give --out a new folder\n"
    )
    assert store.read_cell(Path("s1"), LIVE) == live("pass")
    # A merge of its own that finished is a finished run; one that was interrupted is written again.
    assert lab(tmp_path, "merge", "s1", "--out", "merged").returncode == 0
    assert lab(tmp_path, "merge", "s1", "--out", "merged").returncode == 2
    results = json.loads(Path("merged/results.json").read_text())
    results["run"]["complete"] = False
    Path("merged/results.json").write_text(json.dumps(results))
    run_json = json.loads(Path("merged/run.json").read_text())
    Path("merged/run.json").write_text(json.dumps({**run_json, "complete": False}))
    again = lab(tmp_path, "merge", "s1", "--out", "merged")
    assert (again.returncode, again.stderr) == (0, "")


def _history_run(tmp_path: Path, matrix: Matrix, name: str, result: CellResult, *, finished: bool = True) -> None:
    if not finished:  # what a `nox -s matrix` killed after its first cell leaves
        with store.claim_run(Path("reports/runs") / name, run_id=name, plan=planned(matrix), host={}) as run:
            run.write_cell(result)
            run.aggregate(planned(matrix), latest=None)
        return
    shard(matrix, f"shard-{name}", result)
    out = f"reports/runs/{name}"
    done = lab(tmp_path, "merge", f"shard-{name}", "--out", out, "--run-id", name, "--matrix", matrix.path)
    assert done.returncode == 0, done.stderr
    assert store.read_cell(Path(out), result.id) == result


def test_changes_compare_with_the_newest_finished_run_of_the_same_matrix(tmp_path: Path, matrix: Matrix) -> None:
    _history_run(tmp_path, matrix, "a-finished", live("fail", "needs a symbol torch does not export"))
    _history_run(tmp_path, matrix, "b-killed", live("fail", "a reason of a run that was killed"), finished=False)
    (tmp_path / "other.toml").write_text('name = "other"\n' + MATRIX)
    _history_run(tmp_path, load_matrix("other.toml"), "c-other-matrix", live("fail", "another matrix's reason"))
    _history_run(tmp_path, matrix, "d-now", live("pass"))
    done = lab(tmp_path, "report", "reports/runs/d-now/results.json", "--out", "reports/latest")
    assert (done.returncode, done.stderr) == (0, "")
    assert (tmp_path / "reports" / "latest" / "changes.md").read_text() == (
        "## compatlab: run `d-now` compared with `a-finished`\n\n"
        "✓ pass 1 · ✗ fail 0 · ◐ partial 0 · ⚠ error 0 · – n/a 1\n\n"
        "### Newly green (1)\n\n"
        "- torch 2.9.1 · sgl-kernel 0.3.21 · flashinfer 0.6.4 · cuda 12.8: ✗ fail → ✓ pass "
        "(was `needs a symbol torch does not export`)\n"
    )


def test_an_older_run_never_replaces_a_newer_latest(tmp_path: Path, matrix: Matrix) -> None:
    assert lab(tmp_path, "cell", NA, "-q", "--run-dir", "reports/runs/old").returncode == 0
    assert (
        lab(tmp_path, "cell", NA, "-q", "--run-dir", "reports/runs/new", "--latest", "reports/latest").returncode == 0
    )
    old = store.load_results(Path("reports/runs/old/results.json")).run
    new = store.load_results(Path("reports/latest/results.json")).run
    stale = (
        f"reports/latest shows run new (started {new.started}), newer than run old (started {old.started}): "
        "left as it is"
    )
    # A cell of the older run ends after the newer run has shown itself.
    late = lab(tmp_path, "cell", NA, "-q", "--run-dir", "reports/runs/old", "--latest", "reports/latest")
    assert (late.returncode, late.stderr) == (0, f"WARNING compatlab.runs.store: {stale}\n")
    assert store.load_results(Path("reports/latest/results.json")).run.id == "new"
    report = lab(tmp_path, "report", "reports/runs/old/results.json", "--out", "reports/latest", "--no-history")
    assert (report.returncode, report.stdout, report.stderr) == (0, "", f"note: {stale}\n")
    assert store.load_results(Path("reports/latest/results.json")).run.id == "new"
    assert not (tmp_path / "reports" / "latest" / "index.html").exists()


def test_report_into_a_run_in_progress_leaves_its_results_to_the_owner(tmp_path: Path, matrix: Matrix) -> None:
    assert lab(tmp_path, "cell", NA, "-q", "--run-dir", "reports/runs/r1").returncode == 0
    before = (tmp_path / "reports" / "runs" / "r1" / "results.json").read_bytes()
    with store.claim_run(Path("reports/runs/r1"), run_id="r1", plan=planned(matrix), host=host_facts):
        done = lab(tmp_path, "report", "reports/runs/r1/results.json", "--no-history")
    assert (done.returncode, done.stderr) == (0, "")
    assert (tmp_path / "reports" / "runs" / "r1" / "index.html").is_file()
    assert (tmp_path / "reports" / "runs" / "r1" / "results.json").read_bytes() == before


def test_a_second_process_cannot_write_a_run_in_use(tmp_path: Path, matrix: Matrix) -> None:
    with store.claim_run(Path("reports/runs/r1"), run_id="r1", plan=planned(matrix), host=host_facts):
        done = lab(tmp_path, "cell", NA, "-q", "--run-dir", "reports/runs/r1")
        assert (done.returncode, done.stderr) == (
            1,
            (
                f"error: reports/runs/r1: run r1 is in use by pid {os.getpid()} on {HOST}; one run belongs to one "
                "process at a time: wait for it to finish, or choose another run id (COMPATLAB_RUN_ID)\n"
            ),
        )
    assert not (tmp_path / "reports" / "runs" / "r1" / "cells").exists()


def test_a_cell_whose_owner_is_gone_or_replaced_writes_nothing(tmp_path: Path, matrix: Matrix) -> None:
    first = store.claim_run(Path("reports/runs/r1"), run_id="r1", plan=planned(matrix), host=host_facts)
    token = first.owner
    first.close()
    gone = lab(tmp_path, "cell", NA, "-q", "--run-dir", "reports/runs/r1", "--owner", token)
    assert (gone.returncode, gone.stderr) == (
        1,
        (
            f"error: run r1 has no owner any more (the process that started it, pid {os.getpid()} on {HOST}, exited or "
            "was killed): nothing is written into reports/runs/r1\n"
        ),
    )
    with store.claim_run(Path("reports/runs/r1"), run_id="r1", plan=planned(matrix), host=host_facts):
        replaced = lab(tmp_path, "cell", NA, "-q", "--run-dir", "reports/runs/r1", "--owner", token)
    assert (replaced.returncode, replaced.stderr) == (
        1,
        (
            f"error: run r1 now belongs to another process (pid {os.getpid()} on {HOST}): nothing is written into "
            "reports/runs/r1\n"
        ),
    )
    assert not (tmp_path / "reports" / "runs" / "r1" / "cells").exists()


def test_prune_keeps_the_newest_runs_and_any_run_in_use(tmp_path: Path, matrix: Matrix) -> None:
    for run_id in ("b-first", "a-second", "c-third"):
        assert lab(tmp_path, "cell", NA, "-q", "--run-dir", f"reports/runs/{run_id}").returncode == 0
    with store.claim_run(Path("reports/runs/b-first"), run_id="b-first", plan=planned(matrix), host=host_facts):
        done = lab(tmp_path, "prune", "--keep", "1")
    assert (done.returncode, done.stdout) == (0, "removed reports/runs/a-second\n")
    assert done.stderr == "WARNING compatlab.runs.store: reports/runs/b-first: in use by a running process; kept\n"
    assert sorted(p.name for p in (tmp_path / "reports" / "runs").iterdir()) == ["b-first", "c-third"]


# --- writes that fail --------------------------------------------------------------------------------


def _mount(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["mount", *args], capture_output=True, text=True, check=False, timeout=30)


@pytest.fixture
def mounts(tmp_path: Path) -> Iterator[list[Path]]:
    """Folders mounted by the test, unmounted after it; skips where this process may not mount."""
    probe = tmp_path / "probe"
    probe.mkdir()
    if shutil.which("mount") is None or _mount("-t", "tmpfs", "-o", "size=16k", "tmpfs", str(probe)).returncode:
        pytest.skip("needs to mount a tmpfs and a read-only bind mount (root with CAP_SYS_ADMIN)")
    mounted = [probe]
    try:
        yield mounted
    finally:
        for path in reversed(mounted):
            subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False, timeout=30)


def _read_only(path: Path, mounted: list[Path]) -> None:
    assert _mount("--bind", str(path), str(path)).returncode == 0
    mounted.append(path)
    done = _mount("-o", "remount,ro,bind", str(path))
    assert done.returncode == 0, done.stderr


def _full(path: Path, mounted: list[Path]) -> None:
    assert _mount("-t", "tmpfs", "-o", "size=16k", "tmpfs", str(path)).returncode == 0
    mounted.append(path)
    with open(path / "filler", "wb", buffering=0) as fh, pytest.raises(OSError, match="No space left on device"):
        _fill(fh)


def _fill(fh: BinaryIO) -> None:
    while True:
        fh.write(b"x" * 1024)


def _run_with_cells_broken(tmp_path: Path, break_cells: str, mounted: list[Path]) -> subprocess.CompletedProcess[str]:
    assert lab(tmp_path, "cell", NA, "-q", "--run-dir", "reports/runs/r1").returncode == 0  # the run exists
    cells = tmp_path / "reports" / "runs" / "r1" / "cells"
    shutil.rmtree(cells)
    if break_cells == "file":
        cells.write_text("not a folder\n")
    else:
        cells.mkdir()
        (_read_only if break_cells == "ro" else _full)(cells, mounted)
    return lab(tmp_path, "cell", NA, "-q", "--run-dir", "reports/runs/r1", "--latest", "reports/latest")


@pytest.mark.parametrize(
    ("break_cells", "why"),
    [
        ("ro", "Read-only file system"),
        ("full", "No space left on device"),
        ("file", "reports/runs/r1/cells is not a folder"),
    ],
)
def test_a_finished_cell_whose_result_cannot_be_written_keeps_it(
    tmp_path: Path, matrix: Matrix, break_cells: str, why: str, request: pytest.FixtureRequest
) -> None:
    mounted: list[Path] = request.getfixturevalue("mounts") if break_cells != "file" else []
    done = _run_with_cells_broken(tmp_path, break_cells, mounted)
    assert (done.returncode, done.stderr) == (
        1,
        (f"error: cannot write reports/runs/r1/cells/{NA}.json: {why}; {kept_words(tmp_path, 'r1', NA)}\n"),
    )
    kept = json.loads((tmp_path / "state" / "compatlab" / "unsaved" / "r1" / "cells" / f"{NA}.json").read_text())
    assert kept["schema"] == CELL_SCHEMA
    assert CellResult.from_json({k: v for k, v in kept.items() if k != "schema"}).reason == NA_REASON
    # What the README says to do once the folder is fixed: merge the kept result back.
    for path in reversed(mounted[1:]):
        subprocess.run(["umount", "-l", str(path)], check=True, timeout=30)
    del mounted[1:]
    cells = tmp_path / "reports" / "runs" / "r1" / "cells"
    if cells.is_file():
        cells.unlink()
    cells.mkdir(exist_ok=True)
    back = lab(
        tmp_path,
        "merge",
        "reports/runs/r1",
        str(tmp_path / "state" / "compatlab" / "unsaved" / "r1"),
        "--out",
        "reports/runs/r1-saved",
    )
    assert back.returncode == 1  # the live cell of this matrix never ran: missing
    assert store.read_cell(Path("reports/runs/r1-saved"), NA) == CellResult.from_json(
        {k: v for k, v in kept.items() if k != "schema"}
    )


def test_a_read_only_reports_folder_is_one_clear_error(tmp_path: Path, matrix: Matrix, mounts: list[Path]) -> None:
    (tmp_path / "reports").mkdir()
    _read_only(tmp_path / "reports", mounts)
    done = lab(tmp_path, "cell", NA, "-q", "--run-dir", "reports/runs/r1", "--latest", "reports/latest")
    assert (done.returncode, done.stdout, done.stderr) == (
        1,
        "",
        "error: cannot write reports/runs/r1: Read-only file system; make reports writable, or write the run "
        "elsewhere (COMPATLAB_REPORTS for nox, --run-dir, --out)\n",
    )


def test_a_result_that_cannot_be_kept_anywhere_is_in_the_error(
    tmp_path: Path, matrix: Matrix, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "not-a-folder").write_text("")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "not-a-folder"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "not-a-folder"))
    with store.claim_run(Path("r1"), run_id="r1", plan=planned(matrix), host={}) as run:
        Path("r1/cells").write_text("")
        with pytest.raises(store.UnsavedResult) as info:
            run.write_cell(na())
    assert info.value.kept is None
    payload = json.dumps({"schema": CELL_SCHEMA, **na().to_json()})
    uid = os.getuid()
    assert str(info.value) == (
        f"cannot write r1/cells/{NA}.json: r1/cells is not a folder; it could not be kept anywhere else either "
        f"(cannot write {tmp_path}/not-a-folder/compatlab/unsaved/r1/cells/{NA}.json: Not a directory; "
        f"cannot write {tmp_path}/not-a-folder/compatlab-unsaved-{uid}/r1/cells/{NA}.json: Not a directory); "
        f"here it is: {payload}"
    )


# --- two `nox -s matrix` at once, and kill -9 of the first ---------------------------------------------


class _Gate(ThreadingHTTPServer):
    """A loopback proxy in front of the test index that holds every request until it is opened."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.hit = threading.Event()
        self.opened = threading.Event()
        super().__init__(("127.0.0.1", 0), _GateHandler)


class _GateHandler(BaseHTTPRequestHandler):
    server: _Gate

    def do_GET(self) -> None:
        self.server.hit.set()
        self.server.opened.wait(300)
        try:
            with urllib.request.urlopen(self.server.upstream + self.path, timeout=60) as up:  # noqa: S310
                body, kind = up.read(), up.headers.get("Content-Type", "application/octet-stream")
        except OSError:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
def test_an_orphaned_cell_of_a_killed_nox_never_rewrites_latest(tmp_path: Path, index_url: str) -> None:
    (tmp_path / "b").mkdir()
    gate = _Gate(index_url)
    threading.Thread(target=gate.serve_forever, daemon=True).start()
    reports = tmp_path / "reports"
    a = tmp_path / "a"
    a.mkdir()
    (a / "matrix.toml").write_text(
        textwrap.dedent(ONE_CELL.format(torch=f"http://127.0.0.1:{gate.server_port}", url=index_url))
    )
    env = {
        **os.environ,
        "PATH": f"{uv_dir()}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "COMPATLAB_MATRIX": str(a / "matrix.toml"),
        "COMPATLAB_REPORTS": str(reports),
        "COMPATLAB_VENVS": str(a / "venvs"),
        "COMPATLAB_RUN_ID": "a",
        "UV_PYTHON_DOWNLOADS": "never",
        "UV_HTTP_TIMEOUT": "300",
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "NO_COLOR": "1",
    }
    with open(tmp_path / "a.log", "w") as log:
        first = subprocess.Popen(
            [sys.executable, "-m", "nox", "-f", str(ROOT / "noxfile.py"), "-s", "matrix"],
            env=env,
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    orphans: list[int] = []
    try:
        assert gate.hit.wait(300), "run a's cell never asked the index for torch"
        orphans = _children(first.pid)
        assert orphans, "no cell process under nox"
        first.kill()  # kill -9 of nox alone: its cell process lives on, blocked on the index
        first.wait(30)
        second = nox(
            tmp_path / "b",
            ONE_CELL.format(torch=index_url, url=index_url),
            "-s",
            "matrix",
            run_id="b",
            reports=reports,
            extra_env={"XDG_STATE_HOME": str(tmp_path / "state")},
        )
        assert store.load_results(reports / "latest" / "results.json").run.id == "b", second.stdout + second.stderr
        gate.opened.set()
        deadline = time.monotonic() + 300
        while any(_alive(p) for p in orphans) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(_alive(p) for p in orphans), "the orphaned cell did not finish"
    finally:
        gate.opened.set()
        if first.poll() is None:
            first.kill()
        gate.shutdown()
        gate.server_close()
    assert store.load_results(reports / "latest" / "results.json").run.id == "b"
    assert not (reports / "runs" / "a" / "cells" / f"{ONE_CELL_ID}.json").exists()
    output = (tmp_path / "a.log").read_text()
    # The kernel's parent-death signal stopped the orphan at once (runs/store's owner check is the second
    # line of defence, tested on its own above): it wrote nothing.
    assert "error: SIGTERM: stopped; finished cells are kept under reports/runs/\n" in output, output
