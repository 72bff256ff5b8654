"""`compatlab rehearse` on real wheels from the package index: a CPU torch with torchvision, upgrading
torchvision alone (issue 36).

torch 2.13.0+cpu (PyTorch's CPU build) beside PyPI's torchvision 0.28.0, which is built against a CUDA torch:
`import torchvision` fails on libc10_cuda.so. `--upgrade-package torchvision torchvision` lets uv take the
newest torchvision, which needs a newer torch, so the CPU build goes and PyPI's generic (CUDA 13) torch comes
with its CUDA libraries. The rehearsal must say so, call torchvision fixed and nothing broken, exit 0, and leave
the environment as it was. The index is read as it was on 2026-12-01 (uv's --exclude-newer), so the answer
does not move with new releases.

The CPU torch comes from ``COMPATLAB_TEST_CPU_TORCH`` (a find-links folder, or an index URL), else
/opt/wheels where it holds one, else PyTorch's CPU index; the test skips, saying why, where uv cannot build
the environment.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from compatlab.incell import fakecuda
from fixtures.labutil import tree, uv_dir

pytestmark = [
    pytest.mark.network,
    pytest.mark.slow,
    pytest.mark.heavy,
    # The upgrade brings PyPI's torch 2.15 with its CUDA 13 libraries: gigabytes on a machine whose uv cache
    # lacks them. A tier of its own, as the truth corpus is: not in every CI run.
    pytest.mark.skipif(
        os.environ.get("COMPATLAB_TEST_HEAVY") != "1",
        reason="downloads gigabytes (torch 2.15 and its CUDA libraries): COMPATLAB_TEST_HEAVY=1 runs it",
    ),
]

SNAPSHOT = ("--exclude-newer", "2026-12-01T00:00:00Z")
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def _torch_source() -> list[str]:
    given = os.environ.get("COMPATLAB_TEST_CPU_TORCH")
    if given:
        return ["--extra-index-url", given] if "://" in given else ["--find-links", given]
    local = Path("/opt/wheels")
    if any(local.glob("torch-2.13.0+cpu-*.whl")):
        return ["--find-links", str(local)]
    return ["--extra-index-url", CPU_INDEX]


def _env() -> dict[str, str]:
    env = {**os.environ, "PATH": f"{uv_dir()}{os.pathsep}{os.environ['PATH']}", "UV_PYTHON_DOWNLOADS": "never"}
    env.pop("VIRTUAL_ENV", None)
    return env


def _run(*argv: str, timeout: float = 1200) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=_env(), check=False)


def test_rehearse_upgrading_torchvision_alone_beside_a_cpu_torch(tmp_path: Path) -> None:
    if fakecuda.real_driver() is not None:
        pytest.skip("this machine has a real NVIDIA driver: the cuda stage would run")
    uv = str(Path(uv_dir()) / "uv")
    venv = tmp_path / "vision-env"
    source = _torch_source()
    assert _run(uv, "venv", "--quiet", "--python", sys.executable, str(venv)).returncode == 0
    python = venv / "bin" / "python"
    made = _run(
        uv, "pip", "install", "--python", str(python), *source, *SNAPSHOT, "torch==2.13.0+cpu", "torchvision==0.28.0"
    )
    if made.returncode != 0:
        pytest.skip(f"cannot build the CPU torch environment from the index: {made.stderr.strip().splitlines()[-1]}")
    before = tree(venv)
    out = tmp_path / "out"

    install = [*source, *SNAPSHOT, "--upgrade-package", "torchvision", "torchvision"]
    done = _run(
        sys.executable, "-m", "compatlab", "rehearse", "--venv", str(venv), "--out", str(out), "-q", "--", *install
    )

    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"rehearsal of: uv pip install --python {python} {' '.join(install)}"
    assert lines[1].startswith(f"  on {venv} (Python {sys.version_info.major}.{sys.version_info.minor}")
    assert "as it is: fail), applied to a copy (" in lines[1]
    assert lines[2:5] == [
        "the install changes 21 distributions:",
        "  torch 2.13.0+cpu → 2.15.0 (build +cpu → generic; CUDA none → 13.2): torchvision 0.29.2 requires torch>=2.14.0",
        "  torchvision 0.28.0 → 0.29.2",
    ]
    assert lines[5].startswith("  added (19): cuda-bindings 13.5.0 (CUDA 13), ")
    assert lines[6:11] == [
        "pins it breaks: none",
        "what worked and breaks: none",
        "what was broken and is fixed (1):",
        "  torchvision — was: torchvision (it loads torchvision/_C.so): missing shared library libc10_cuda.so; then "
        "RuntimeError: operator torchvision::nms does not exist",
        "no longer installed (2 that loaded before): torchvision/_C.so, torchvision/image.so",
    ]
    assert lines[11] == "verdict: safe: nothing that works now breaks (after: partial); 1 fixed"
    assert tree(venv) == before

    data = json.loads((out / "rehearsal.json").read_text(encoding="utf-8"))
    assert (data["outcome"], data["original"]["state"], data["safer"]) == ("safe", "fail", [])
    # The copy shared every file of the original: no byte of torch was copied.
    assert data["request"]["copy"]["copied"] == 0
    assert data["request"]["copy"]["linked"] > 10000
    print("\n".join(lines))
    print(f"rehearsal {data['seconds']} s; check of the environment as it is {data['original']['seconds']} s")
