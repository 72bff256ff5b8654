"""What rehearse.copy relies on, with real uv: an install into a hard-linked copy replaces files and never writes
one in place, whatever uv's link mode; and the relocated copy is an environment of its own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from compatlab.rehearse.copy import copy_environment
from fixtures.labutil import tree, uv_dir
from fixtures.wheels import build_wheel

pytestmark = pytest.mark.slow


def _run(*argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "UV_PYTHON_DOWNLOADS": "never", "UV_NO_CONFIG": "1", **env}
    full.pop("VIRTUAL_ENV", None)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=full, check=False)
    assert done.returncode == 0, done.stderr
    return done


@pytest.mark.parametrize("mode", ["hardlink", "copy", "clone", "symlink"])
def test_an_install_into_the_copy_leaves_every_shared_file_as_it_was(tmp_path: Path, mode: str) -> None:
    uv = str(Path(uv_dir()) / "uv")
    wheels = tmp_path / "wheels"
    build_wheel(
        wheels, "alpha", "1.0", files={"alpha/data.txt": "one\n", "alpha/cli.py": "def main():\n    print(1)\n"}
    )
    build_wheel(wheels, "alpha", "2.0", files={"alpha/data.txt": "two\n"})
    build_wheel(wheels, "beta", "1.0", files={"alpha/stray.txt": "beta's\n"})  # over a file no RECORD lists
    venv = tmp_path / "orig"
    _run(uv, "venv", "--quiet", "--python", sys.executable, str(venv))
    _run(
        uv,
        "pip",
        "install",
        "--quiet",
        "--python",
        str(venv / "bin" / "python"),
        "--no-index",
        "-f",
        str(wheels),
        "alpha==1.0",
    )
    site = next((venv / "lib").glob("python3*/site-packages"))
    (site / "alpha" / "stray.txt").write_text("nobody's\n")
    (venv / "bin" / "alpha-cli").write_text(f"#!{venv}/bin/python\nfrom alpha.cli import main\nmain()\n")
    (venv / "bin" / "alpha-cli").chmod(0o755)
    before = tree(venv)

    copy = copy_environment(venv, tmp_path / "copy")
    _run(
        uv, "pip", "install", "--quiet", "--python", str(copy.python), "--no-index", "-f", str(wheels),
        "alpha==2.0", "beta", UV_LINK_MODE=mode,
    )  # fmt: skip

    assert tree(venv) == before
    copy.check_untouched()
    new_site = tmp_path / "copy" / site.relative_to(venv)
    assert (new_site / "alpha" / "data.txt").read_text() == "two\n"
    assert (new_site / "alpha" / "stray.txt").read_text() == "beta's\n"
    prefix = _run(str(copy.python), "-c", "import sys; print(sys.prefix)").stdout.strip()
    assert prefix == str(tmp_path / "copy")
    assert (tmp_path / "copy" / "bin" / "alpha-cli").read_text().startswith(f"#!{tmp_path / 'copy'}/bin/python\n")
