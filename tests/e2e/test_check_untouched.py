"""`compatlab check` leaves the environment it checks byte for byte as it found it (issue 32): its suites take
pytest from an overlay outside it (stages/suite.tools_overlay), never from an install into it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from compatlab.cli.check import run_check
from compatlab.existing import inspect_environment
from compatlab.incell import fakecuda
from compatlab.runner import ExistingRequest
from compatlab.runs.model import StageState
from fixtures.labutil import tree
from fixtures.sofix import EXT_SUFFIX, ext_module
from fixtures.wheels import build_wheel, venv_with

pytestmark = pytest.mark.slow

TAG = f"cp{sys.version_info.major}{sys.version_info.minor}-cp{sys.version_info.major}{sys.version_info.minor}-linux_x86_64"


def test_check_leaves_the_environment_as_it_found_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if fakecuda.real_driver() is not None:
        pytest.skip("this machine has a real NVIDIA driver: the cuda stage would run")
    monkeypatch.setenv("COMPATLAB_CACHE", str(tmp_path / "cache"))
    mod = ext_module(tmp_path / "build", "_fast")
    wheel = build_wheel(
        tmp_path / "wheels",
        "fastpkg",
        "1.0",
        files={"fastpkg/__init__.py": "from fastpkg import _fast\n", f"fastpkg/_fast{EXT_SUFFIX}": mod.read_bytes()},
        tag=TAG,
    )
    python = venv_with(tmp_path / "env", [wheel])
    has = subprocess.run([str(python), "-c", "import pytest"], capture_output=True, timeout=60, check=False)
    assert has.returncode != 0, "the checked venv must not see a pytest of its own"
    before = tree(tmp_path / "env")

    result = run_check(inspect_environment(python), ExistingRequest(packages=("fastpkg",)), out=tmp_path / "out").result

    imported = result.stage("import")
    assert imported is not None
    assert (imported.state, imported.details["loaded"]) == (StageState.PASS, 2), imported.reason
    assert tree(tmp_path / "env") == before
    [overlay] = (tmp_path / "cache" / "tools").iterdir()
    assert (overlay / "pytest" / "__init__.py").is_file()
    assert (overlay / "pluggy" / "__init__.py").is_file()

    # Its bytecode went to the lab's folder for this stack, not beside its sources (issue 35), and the next
    # check reads it from there instead of compiling again.
    [folder] = (tmp_path / "cache" / "bytecode").iterdir()
    site = next((tmp_path / "env").resolve().glob("lib/python3*/site-packages"))
    [pyc] = (folder / site.relative_to("/") / "fastpkg").glob("__init__.*.pyc")  # no __pycache__ in a prefix
    written = pyc.stat().st_mtime_ns
    again = run_check(inspect_environment(python), ExistingRequest(packages=("fastpkg",)), out=tmp_path / "out2").result
    second = again.stage("import")
    assert second is not None
    assert second.state == StageState.PASS, second.reason
    assert pyc.stat().st_mtime_ns == written
    assert tree(tmp_path / "env") == before

    # What the next check imports is that file: bytecode for the same source (its mtime and size in the
    # header, written by the environment's own Python) that raises instead is what its import stage meets.
    source = site / "fastpkg" / "__init__.py"
    forged = subprocess.run(
        [
            str(python),
            "-c",
            "import importlib.util, marshal, os, sys; st = os.stat(sys.argv[1]); "
            "code = compile('raise ImportError(\"read from the lab bytecode folder\")', sys.argv[1], 'exec'); "
            "open(sys.argv[2], 'wb').write(importlib.util.MAGIC_NUMBER + (0).to_bytes(4, 'little') "
            "+ int(st.st_mtime).to_bytes(4, 'little') + st.st_size.to_bytes(4, 'little') + marshal.dumps(code))",
            str(source),
            str(pyc),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert forged.returncode == 0, forged.stderr
    third = run_check(inspect_environment(python), ExistingRequest(packages=("fastpkg",)), out=tmp_path / "out3").result
    read = third.stage("import")
    assert read is not None
    assert read.state == StageState.FAIL, read.reason
    assert "read from the lab bytecode folder" in read.reason
    assert tree(tmp_path / "env") == before
