"""The README's commands as a new user types them: from another folder, with relative paths."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fixtures.labutil import ROOT, nox, uv_dir
from fixtures.matrices import EXPECTED_ONLY
from fixtures.shared_run import SharedRun


def _nox_here(cwd: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    full = {
        **os.environ,
        "PATH": f"{uv_dir()}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "UV_PYTHON_DOWNLOADS": "never",
        "NO_COLOR": "1",
        **env,
    }
    return subprocess.run(
        [sys.executable, "-m", "nox", "-f", str(ROOT / "noxfile.py"), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env=full,
        timeout=300,
        check=False,
    )


def test_a_relative_matrix_is_the_file_where_nox_was_started(tmp_path: Path) -> None:
    (tmp_path / "matrix.toml").write_text(EXPECTED_ONLY.format(url="http://127.0.0.1:9"), encoding="utf-8")
    done = _nox_here(tmp_path, "-l", "--json", env={"COMPATLAB_MATRIX": "matrix.toml"})
    assert done.returncode == 0, done.stderr
    cells = [s["session"] for s in json.loads(done.stdout) if s["name"] == "matrix"]
    assert len(cells) == 8
    missing = _nox_here(tmp_path, "-l", env={"COMPATLAB_MATRIX": "nothere.toml"})
    assert missing.returncode == 2
    assert (
        missing.stderr
        == f"error: {tmp_path / 'nothere.toml'}: no such file; set COMPATLAB_MATRIX or create matrix.toml\n"
    )


def test_relative_reports_and_venvs_are_folders_where_nox_was_started(tmp_path: Path, index_url: str) -> None:
    (tmp_path / "matrix.toml").write_text(EXPECTED_ONLY.format(url=index_url), encoding="utf-8")
    env = {
        "COMPATLAB_MATRIX": "matrix.toml",
        "COMPATLAB_REPORTS": "out/reports",
        "COMPATLAB_VENVS": "out/venvs",
        "COMPATLAB_RUN_ID": "r1",
    }
    done = _nox_here(tmp_path, "-s", "matrix", "-k", "cu130 and flashinfer0 and cuda13", env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads((tmp_path / "out" / "reports" / "runs" / "r1" / "results.json").read_text(encoding="utf-8"))
    ran = {c["id"]: [s["state"] for s in c["stages"]] for c in results["cells"] if c["state"] != "n/a"}
    assert ran == {
        "torch2.9.1+cu130-sglkernel0.3.21-flashinfer0.6.4-cuda13.0": ["pass", "pass", "pass", "pass", "skip", "skip"],
        "torch2.9.1+cu130-sglkernel0.3.21-flashinfer0.7.4-cuda13.0": ["pass", "pass", "pass", "pass", "skip", "skip"],
    }
    assert sorted(p.name for p in (tmp_path / "out" / "venvs" / "r1").iterdir() if p.is_dir()) == sorted(ran)
    assert not (ROOT / "out").exists()


NA_CELLS = {
    "torch2.9.1+cu130-sglkernel0.3.21-flashinfer0.6.4-cuda12.8",
    "torch2.9.1+cu130-sglkernel0.3.21-flashinfer0.7.4-cuda12.8",
    "torch2.9.1+cu128-sglkernel0.3.21-flashinfer0.6.4-cuda13.0",
    "torch2.9.1+cu128-sglkernel0.3.21-flashinfer0.7.4-cuda13.0",
}


def test_not_applicable_cells_start_nothing_and_are_one_line_per_reason(expected_only_run: SharedRun) -> None:
    done, tmp_path = expected_only_run, expected_only_run.folder
    report = tmp_path / "nox-report.json"
    assert done.returncode == 0, done.said
    sessions = {
        s["signatures"][0].removeprefix("matrix(").removesuffix(")"): s
        for s in json.loads(report.read_text(encoding="utf-8"))["sessions"]
        if s["name"] == "matrix"
    }
    assert len(sessions) == 8
    for cid in NA_CELLS:
        # Started nothing: no venv, no work folder, no log of its own anywhere (a cell that runs makes all three).
        assert not sorted(p for p in tmp_path.rglob(f"*{cid}*")), cid
        assert cid not in done.stdout + done.stderr  # neither nox's lines nor a row of its own
    ran = next(c for c in sessions if c not in NA_CELLS)
    assert sorted(tmp_path.rglob(f"*{ran}*"))  # what the check above looks for, a running cell has
    assert re.findall(r"^(\S+ ?\S*) +n/a +(.*)$", done.stdout, flags=re.MULTILINE) == [
        ("2 cells", "torch 2.9.1+cu130 is built for CUDA 13.0, this column is CUDA 12.8"),
        ("2 cells", "torch 2.9.1+cu128 is built for CUDA 12.8, this column is CUDA 13.0"),
    ]
    latest = json.loads((tmp_path / "reports" / "latest" / "results.json").read_text(encoding="utf-8"))
    assert {c["id"] for c in latest["cells"] if c["state"] == "n/a"} == NA_CELLS
    # Quiet: the n/a cells are not counted, nox's echo of the lab's own commands is gone, and the last lines
    # say where the grid is and what the GPU box should run.
    said = done.stdout + done.stderr
    assert "nox > Ran 5 sessions in " in said, said  # 4 live cells and the summary, not the 4 n/a
    assert "-m compatlab cell" not in said
    assert (
        f"[compatlab] the grid: {tmp_path / 'reports' / 'latest' / 'index.html'} (also compat.md, results.json)" in said
    )
    assert (
        "cell(s) amber: every stage this machine can run passed; the cuda and serve stages need an NVIDIA GPU" in said
    )


def test_the_start_lines_give_the_previous_runs_seconds_and_the_expected_end(tmp_path: Path, index_url: str) -> None:
    matrix = EXPECTED_ONLY.format(url=index_url)
    first = nox(tmp_path, matrix, "-s", "matrix", "-k", "cu130 and flashinfer0 and cuda13", run_id="r1")
    assert first.returncode == 0, first.stdout + first.stderr
    assert "[compatlab] run r1: 2 cells (4 n/a), none timed in the previous run: no estimate\n" in first.stderr
    assert (
        "[compatlab] start torch2.9.1+cu130-sglkernel0.3.21-flashinfer0.6.4-cuda13.0 (1/2, not timed before)\n"
        in first.stdout
    )
    took = {
        c["id"]: c["seconds"]
        for c in json.loads((tmp_path / "reports" / "latest" / "results.json").read_text())["cells"]
        if c["state"] != "n/a"
    }
    again = nox(tmp_path, matrix, "-s", "matrix", "-k", "cu130 and flashinfer0 and cuda13", run_id="r2")
    assert again.returncode == 0, again.stdout + again.stderr
    total = sum(took.values())
    line = next(ln for ln in again.stderr.splitlines() if ln.startswith("[compatlab] run r2:"))
    assert re.fullmatch(
        rf"\[compatlab\] run r2: 2 cells \(4 n/a\), about {round(total)} s as in the previous run, "
        r"ending about \d\d:\d\d \w+",
        line,
    ), line
    first_cell = "torch2.9.1+cu130-sglkernel0.3.21-flashinfer0.6.4-cuda13.0"
    start = next(ln for ln in again.stdout.splitlines() if ln.startswith(f"[compatlab] start {first_cell}"))
    assert re.fullmatch(
        rf"\[compatlab\] start {re.escape(first_cell)} \(1/2, about {round(took[first_cell])} s as in "
        r"the previous run; the run ends about \d\d:\d\d \w+\)",
        start,
    ), start
    assert "compatlab.incell.proc" not in first.stdout + first.stderr  # the lab's INFO log stays out of nox's


BAD = "torch2.9.1+cu128-sglkernel0.3.21-flashinfer0.7.4-cuda12.8"


def test_a_preflight_judges_only_the_stages_it_ran_and_keeps_the_fuller_grid(tmp_path: Path, index_url: str) -> None:
    matrix = EXPECTED_ONLY.format(url=index_url)
    full = nox(tmp_path, matrix, "-s", "matrix", "-k", "cu128 and cuda12", run_id="r1")
    assert full.returncode == 0, full.stdout + full.stderr
    pre = nox(tmp_path, matrix, "-s", "matrix", "-k", "cu128 and cuda12", "--", "--until", "install", run_id="r2")
    # The known-bad cell fails at pins, which an install preflight does not reach: no news, exit 0.
    assert pre.returncode == 0, pre.stdout + pre.stderr
    said = pre.stdout + pre.stderr
    assert f"end   {BAD}: PARTIAL (known bad; this preflight did not reach the stage that fails)" in said
    assert "[compatlab] 2 cell(s) preflighted only: `nox -s matrix` runs the whole pipeline" in said
    latest = json.loads((tmp_path / "reports" / "latest" / "results.json").read_text(encoding="utf-8"))
    shown = {c["id"]: (c["state"], c.get("run", "")) for c in latest["cells"] if c["state"] != "n/a"}
    assert shown[BAD] == ("fail", "r1"), shown  # the full verdict stays in the grid
    own = json.loads((tmp_path / "reports" / "runs" / "r2" / "results.json").read_text(encoding="utf-8"))
    assert {c["id"]: c["state"] for c in own["cells"] if c["state"] != "n/a"}[BAD] == "partial"  # nothing lost


@pytest.mark.long
def test_two_matrix_files_keep_two_grids(tmp_path: Path, index_url: str) -> None:
    one = EXPECTED_ONLY.format(url=index_url)
    first = nox(tmp_path, one, "-s", "matrix", "-k", "cu130 and cuda13", run_id="r1")
    assert first.returncode == 0, first.stdout + first.stderr
    # Another matrix file into the same reports folder: refused for reports/latest, kept in its own run.
    other = tmp_path / "other.toml"
    other.write_text(one.replace('name = "spine-a"', 'name = "spine-b"'), encoding="utf-8")
    second = nox(
        tmp_path,
        one,
        "-s",
        "matrix",
        "-k",
        "cu130 and cuda13",
        run_id="r2",
        extra_env={"COMPATLAB_MATRIX": str(other)},
    )
    assert second.returncode == 0, second.stdout + second.stderr
    assert "shows the grid of matrix 'spine-a', not of 'spine-b': left as it is" in second.stdout + second.stderr
    latest = json.loads((tmp_path / "reports" / "latest" / "results.json").read_text(encoding="utf-8"))
    assert (latest["run"]["id"], latest["run"]["matrix_name"]) == ("r1", "spine-a")
    assert (tmp_path / "reports" / "runs" / "r2" / "results.json").is_file()
    # With no COMPATLAB_REPORTS, a matrix file other than the repository's matrix.toml has its own folder.
    stem = f"test-{os.getpid()}-{tmp_path.name}"
    mine = tmp_path / f"{stem}.toml"
    mine.write_text(one, encoding="utf-8")
    env = {
        "COMPATLAB_MATRIX": str(mine),
        "COMPATLAB_REPORTS": "",  # unset: the default
        "COMPATLAB_RUN_ID": "r3",
        "COMPATLAB_VENVS": str(tmp_path / "venvs"),
    }
    folder = ROOT / "reports" / stem
    try:
        done = _nox_here(tmp_path, "-s", "matrix", "-k", "cu130 and cuda13", "--", "--until", "install", env=env)
        assert done.returncode == 0, done.stdout + done.stderr
        assert (folder / "runs" / "r3" / "results.json").is_file()
        assert (folder / "latest" / "results.json").is_file()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_a_misspelled_stage_after_the_double_dash_is_one_line_before_any_cell(tmp_path: Path) -> None:
    (tmp_path / "matrix.toml").write_text(EXPECTED_ONLY.format(url="http://127.0.0.1:9"), encoding="utf-8")
    env = {"COMPATLAB_MATRIX": "matrix.toml", "COMPATLAB_REPORTS": "reports", "COMPATLAB_RUN_ID": "r1"}
    done = _nox_here(tmp_path, "-s", "matrix", "--", "--until", "statc", env=env)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        "error: no stage 'statc'; the pipeline is install, pins, static, import, cuda, serve; "
        "perhaps you meant 'static'?\n"
    )
    assert not (tmp_path / "reports").exists()  # no empty run, no grid "in progress"
    flag = _nox_here(tmp_path, "-s", "matrix", "--", "--untl", "static", env=env)
    assert (flag.returncode, flag.stderr) == (
        2,
        "error: --untl: not an option of a matrix cell (it takes --until, --stages, -q, --quiet, -j, --jobs); perhaps you "
        "meant '--until'?\n",
    )
    # Another session's posargs are its own: `nox -s tests -- unit -k x` is not a cell's.
    assert _nox_here(tmp_path, "-s", "tests", "-l", "--", "unit", "-k", "x", env=env).returncode == 0


def test_nox_list_says_which_cells_run_and_why_the_others_are_not_applicable(tmp_path: Path) -> None:
    (tmp_path / "matrix.toml").write_text(EXPECTED_ONLY.format(url="http://127.0.0.1:9"), encoding="utf-8")
    done = _nox_here(tmp_path, "-l", "--json", env={"COMPATLAB_MATRIX": "matrix.toml"})
    assert done.returncode == 0, done.stderr
    said = {s["session"].removeprefix("matrix(").removesuffix(")"): s["description"] for s in json.loads(done.stdout)}
    assert {said[c] for c in NA_CELLS} == {
        "n/a: torch 2.9.1+cu130 is built for CUDA 13.0, this column is CUDA 12.8",
        "n/a: torch 2.9.1+cu128 is built for CUDA 12.8, this column is CUDA 13.0",
    }
    assert said[BAD] == "runs; expected fail: cuda-bindings 13 beside a CUDA 12.8 torch; our driver is older"
    assert said["torch2.9.1+cu130-sglkernel0.3.21-flashinfer0.6.4-cuda13.0"] == "runs"
    listed = _nox_here(tmp_path, "-l", env={"COMPATLAB_MATRIX": "matrix.toml"}).stdout
    assert f"* matrix({BAD}) [" in listed
    assert "] -> runs; expected fail: cuda-bindings 13 beside a CUDA 12.8 torch" in listed


def test_two_nox_at_once_make_the_labs_venv_once_and_both_use_it(tmp_path: Path) -> None:
    """A matrix and a report started together (or the lab's own tests, side by side) on a fresh clone: the
    lab's venv is made under a lock, once, and neither clears it while the other is installing into it."""
    (tmp_path / "matrix.toml").write_text(EXPECTED_ONLY.format(url="http://127.0.0.1:9"), encoding="utf-8")
    env = {
        **os.environ,
        "PATH": f"{uv_dir()}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "UV_PYTHON_DOWNLOADS": "never",
        "NO_COLOR": "1",
        "COMPATLAB_MATRIX": str(tmp_path / "matrix.toml"),
        "COMPATLAB_LAB_VENV": str(tmp_path / "lab"),
    }
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "nox", "-f", str(ROOT / "noxfile.py"), "-s", "report"],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**env, "COMPATLAB_REPORTS": str(tmp_path / f"reports{i}")},
        )
        for i in range(2)
    ]
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    made = [out.count("uv venv --clear") for out in outputs]
    assert sorted(made) == [0, 1], outputs
    for out in outputs:
        # Each reached the report itself (there is no run to render yet: said so), through the one lab venv.
        assert "compatlab report" in out, out
        assert "No such file or directory: " not in out.replace("results.json", ""), out
    assert (tmp_path / "lab" / ".compatlab-deps").is_file()
