"""incell_command: a module of compatlab.incell run by a real venv's interpreter (3.11, and 3.10 where this
machine has one), in a hostile environment: it sees the standard library, its own site-packages and the
lab's copy of compatlab.incell, nothing else."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from compatlab.proc import incell_command, incell_path
from fixtures.venvs import python_seeing


def _interpreters() -> list[str]:
    """This interpreter (3.11+: ``-P`` exists) and a 3.10 (no ``-P``), where the machine has one."""
    found = [sys.executable]
    for path in [
        *Path("/usr/bin").glob("python3.10"),
        *(Path.home() / ".pyenv" / "versions").glob("3.10*/bin/python3.10"),
    ]:
        if subprocess.run([str(path), "-V"], capture_output=True, check=False, timeout=60).returncode == 0:
            return [*found, str(path)]
    return found


@pytest.mark.parametrize("base", _interpreters())
def test_a_module_sees_only_the_stdlib_its_packages_and_compatlab_incell(tmp_path: Path, base: str) -> None:
    own = tmp_path / "own"  # the cell's own packages
    (own / "cellpkg").mkdir(parents=True)
    (own / "cellpkg" / "__init__.py").write_text("", encoding="utf-8")
    (own / "cellpkg-1.0.dist-info").mkdir()
    (own / "cellpkg-1.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: cellpkg\nVersion: 1.0\n", encoding="utf-8"
    )
    python = python_seeing(tmp_path / "venv", own, base=base)
    # What must not be seen: the user's PYTHONPATH (a compatlab that is not the lab's copy, a broken json),
    # a stray module in the caller's working directory, and the lab's own dependencies (packaging).
    hostile = tmp_path / "hostile"
    (hostile / "compatlab").mkdir(parents=True)
    (hostile / "compatlab" / "__init__.py").write_text("raise SystemExit('the wrong compatlab')\n", encoding="utf-8")
    (hostile / "json.py").write_text("raise SystemExit('the wrong json')\n", encoding="utf-8")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(hostile), "PYTHONSAFEPATH": "1", "PYTHONHOME": str(hostile)}

    command = incell_command(python, "inspect_env", "cellpkg", "packaging")
    assert command.argv == [
        python,
        "-E",
        "-s",
        "-B",
        "-u",
        "-m",
        "compatlab.incell.inspect_env",
        "cellpkg",
        "packaging",
    ]
    assert command.cwd == str(incell_path())
    done = subprocess.run(
        command.argv, cwd=command.cwd, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert (done.returncode, done.stderr) == (0, "")
    seen = json.loads(done.stdout)
    assert seen["packages"] == {"cellpkg": "1.0", "packaging": None}
    assert seen["python"] == python
    assert seen["path"][0] == str(incell_path())
    assert str(hostile) not in seen["path"]
    assert seen["prefix"] == str(tmp_path / "venv")
