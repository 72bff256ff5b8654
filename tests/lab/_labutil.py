"""Helpers of the lab's tests: run a real nox in a subprocess against a matrix file."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def uv_dir() -> str:
    from uv import find_uv_bin

    return str(Path(find_uv_bin()).parent)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def nox(tmp_path: Path, matrix: str, *args: str, run_id: str = "r1", timeout: float = 600,
        extra_env: dict[str, str] | None = None, reports: Path | None = None) -> subprocess.CompletedProcess[str]:
    (tmp_path / "matrix.toml").write_text(textwrap.dedent(matrix))
    env = {
        **os.environ,
        "PATH": f"{uv_dir()}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "COMPATLAB_MATRIX": str(tmp_path / "matrix.toml"),
        "COMPATLAB_REPORTS": str(reports or tmp_path / "reports"),
        "COMPATLAB_VENVS": str(tmp_path / "venvs"),
        "COMPATLAB_RUN_ID": run_id,  # "" leaves the choice to the noxfile
        "UV_PYTHON_DOWNLOADS": "never",
        "NO_COLOR": "1",
        **(extra_env or {}),
    }
    if not run_id:
        del env["COMPATLAB_RUN_ID"]
    return subprocess.run([sys.executable, "-m", "nox", "-f", str(ROOT / "noxfile.py"), *args],
                          capture_output=True, text=True, env=env, timeout=timeout, check=False, cwd=ROOT)


