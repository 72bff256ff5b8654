"""An installed compatlab (a wheel, not this checkout) runs the in-cell suites, found with importlib.resources."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from fixtures.labutil import uv_dir

ROOT = Path(__file__).resolve().parents[2]


def test_an_installed_compatlab_runs_the_import_stage_outside_a_checkout(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PATH": f"{uv_dir()}{os.pathsep}{os.environ['PATH']}",
        "UV_PYTHON_DOWNLOADS": "never",
        "COMPATLAB_CACHE": str(tmp_path / "cache"),
    }
    env.pop("PYTHONPATH", None)
    for venv in ("lab", "cell"):
        subprocess.run(["uv", "venv", "-q", str(tmp_path / venv)], env=env, check=True, timeout=120)
    subprocess.run(
        ["uv", "pip", "install", "-q", "--python", str(tmp_path / "lab" / "bin" / "python"), str(ROOT)],
        env=env,
        check=True,
        timeout=600,
    )
    subprocess.run(
        ["uv", "pip", "install", "-q", "--python", str(tmp_path / "cell" / "bin" / "python"), "pytest"],
        env=env,
        check=True,
        timeout=600,
    )
    done = subprocess.run(
        [
            str(tmp_path / "lab" / "bin" / "compatlab"),
            "check",
            "-q",
            "--venv",
            str(tmp_path / "cell"),
            "--package",
            "pytest",
            "--stage",
            "import",
            "--out",
            str(tmp_path / "out"),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    [result] = json.loads((tmp_path / "out" / "results.json").read_text())["cells"]
    assert [(s["name"], s["state"]) for s in result["stages"]] == [("import", "pass")]
    # The suite ran from the installed package's copy, never from this checkout.
    log = Path(result["stages"][0]["details"]["log"]).read_text()
    assert str(ROOT) not in log
    suites = next((tmp_path / "lab" / "lib").glob("python3*/site-packages/compatlab/incell/suites"))
    assert sorted(p.name for p in suites.iterdir() if p.suffix in (".py", ".ini")) == [
        "__init__.py",
        "pytest.ini",
        "test_cuda.py",
        "test_import.py",
    ]
