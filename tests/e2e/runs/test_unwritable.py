"""Folders the lab must write that cannot be written: one line naming the folder and the fix, never a traceback.

Each case mounts a real read-only bind mount in a private mount namespace of its own (`unshare --mount`, as
root in a container; a user namespace elsewhere), so root's indifference to chmod does not matter and nothing
stays mounted after the test: the venvs folder, the run folder, a cell's work folder and check's --out.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fixtures.labutil import ROOT, uv_dir
from fixtures.matrices import ONE_CELL, ONE_CELL_ID


def _unshare() -> list[str]:
    """A private mount namespace: as root, or as a user mapped to root where that is allowed."""
    for argv in (["unshare", "--mount", "--propagation", "private"], ["unshare", "-rm"]):
        if (
            shutil.which("unshare")
            and subprocess.run([*argv, "true"], capture_output=True, check=False).returncode == 0
        ):
            return argv
    pytest.skip("needs a private mount namespace (unshare --mount, as root or in a user namespace)")


def _in_read_only(tmp_path: Path, folder: Path, *lab: str) -> subprocess.CompletedProcess[str]:
    """Run `python -m compatlab LAB...` in tmp_path with *folder* bound read-only onto itself, in its own namespace."""
    folder.mkdir(parents=True, exist_ok=True)
    ro = shlex.quote(str(folder))
    script = (
        f"mount --bind {ro} {ro} && mount -o remount,ro,bind {ro} && "
        f"exec {shlex.quote(sys.executable)} -m compatlab {shlex.join(lab)}"
    )
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT / "src"),
        "PATH": f"{uv_dir()}{os.pathsep}{os.environ['PATH']}",
        "UV_PYTHON_DOWNLOADS": "never",
        "COMPATLAB_CACHE": str(tmp_path / "cache"),
        "XDG_STATE_HOME": str(tmp_path / "state"),
    }
    return subprocess.run(
        [*_unshare(), "sh", "-c", script],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _cell(*extra: str) -> tuple[str, ...]:
    return ("cell", ONE_CELL_ID, "-q", "--matrix", "matrix.toml", "--run-dir", "reports/runs/r1", *extra)


RUN_FIX = "writable, or write the run elsewhere (COMPATLAB_REPORTS for nox, --run-dir, --out)"


def test_a_read_only_venvs_folder_is_one_line_naming_it_and_the_fix(tmp_path: Path, index_url: str) -> None:
    (tmp_path / "matrix.toml").write_text(ONE_CELL.format(torch=index_url, url=index_url))
    done = _in_read_only(tmp_path, tmp_path / "venvs", *_cell("--venvs", "venvs"))
    assert (done.returncode, done.stdout, done.stderr) == (
        1,
        "",
        f"error: cannot write {tmp_path}/venvs/r1: Read-only file system; make {tmp_path}/venvs writable, or keep "
        "the venvs elsewhere (COMPATLAB_VENVS for nox, --venvs)\n",
    )


def test_a_read_only_work_folder_is_the_cells_error_in_one_line(tmp_path: Path, index_url: str) -> None:
    (tmp_path / "matrix.toml").write_text(ONE_CELL.format(torch=index_url, url=index_url))
    work = tmp_path / "reports" / "runs" / "r1" / "cells" / ONE_CELL_ID
    done = _in_read_only(tmp_path, work, *_cell("--venvs", "venvs"))
    why = (
        f"install: cannot write {work}/spec: Read-only file system; the cell's work folder must be writable: fix it, "
        "or write the run elsewhere (COMPATLAB_REPORTS, --run-dir)"
    )
    assert (done.returncode, done.stderr) == (1, ""), done.stderr
    assert done.stdout.endswith(f" — {why}\n")
    assert "\n" not in done.stdout.rstrip("\n")
    result = json.loads((work.parent / f"{ONE_CELL_ID}.json").read_text())
    assert (result["state"], result["reason"]) == ("error", why)


def test_a_read_only_run_folder_is_one_line_naming_it_and_the_fix(tmp_path: Path, index_url: str) -> None:
    (tmp_path / "matrix.toml").write_text(ONE_CELL.format(torch=index_url, url=index_url))
    done = _in_read_only(tmp_path, tmp_path / "reports" / "runs" / "r1", *_cell("--venvs", "venvs"))
    assert (done.returncode, done.stdout, done.stderr) == (
        1,
        "",
        f"error: cannot write reports/runs/r1/run.json: Read-only file system; make reports/runs/r1 {RUN_FIX}\n",
    )


def test_a_read_only_check_out_is_one_line_naming_it_and_the_fix(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "env")], check=True, timeout=120)
    done = _in_read_only(tmp_path, tmp_path / "out", "check", "--venv", "env", "--out", "out")
    assert done.returncode == 1
    last = done.stderr.splitlines()[-1]
    assert last.startswith(f"error: cannot write {tmp_path}/out/runs/")
    assert last.endswith(f": Read-only file system; make {tmp_path}/out {RUN_FIX}")
    assert "Traceback" not in done.stderr
