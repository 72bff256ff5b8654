"""`compatlab rehearse` on the origin story's swap, in tiny real wheels served by a loopback index (issue 36).

torch 2.9.1+cu130 with a C++ library exporting c10_cuda_check_implementation(…, int, bool); kernelish, an
extension linked against it; flashish 0.5.0, asking for torch>=2.0.0. `-U flashish` lets uv move torch to the
generic 2.10.0, whose library changed the parameter to unsigned int: the rehearsal must name the swap, the
broken symbol, and a command holding torch that keeps what works, tried on its own copy; the environment's
files must hash the same before and after.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from compatlab.incell import fakecuda
from fixtures.labutil import tree, uv_dir
from fixtures.swap import SYMBOL, swap_wheels
from fixtures.wheels import serve, write_simple_index

pytestmark = pytest.mark.slow

STACK = ("torch==2.9.1+cu130", "kernelish==0.3.21", "flashish==0.5.0")
EXT = f"_kernels.cpython-{sys.version_info.major}{sys.version_info.minor}-x86_64-linux-gnu.so"


def _env() -> dict[str, str]:
    env = {**os.environ, "PATH": f"{uv_dir()}{os.pathsep}{os.environ['PATH']}", "UV_PYTHON_DOWNLOADS": "never"}
    env.pop("VIRTUAL_ENV", None)
    return env


def _run(*argv: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=_env(), check=False)


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("swap")
    wheels = swap_wheels(root / "build", root / "wheels")
    write_simple_index(root / "index", wheels)
    with serve(root / "index") as url:
        yield f"{url}/simple"


def _venv(tmp: Path, index: str) -> Path:
    venv = tmp / "serve-env"
    uv = str(Path(uv_dir()) / "uv")
    for argv in (
        [uv, "venv", "--quiet", "--python", sys.executable, str(venv)],
        [uv, "pip", "install", "--quiet", "--python", str(venv / "bin" / "python"), "--index-url", index, *STACK],
    ):
        done = _run(*argv)
        assert done.returncode == 0, done.stderr
    return venv


def _rehearse(venv: Path, out: Path, *install: str) -> subprocess.CompletedProcess[str]:
    if fakecuda.real_driver() is not None:
        pytest.skip("this machine has a real NVIDIA driver: the cuda stage would run")
    return _run(
        sys.executable, "-m", "compatlab", "rehearse", "--venv", str(venv), "--out", str(out), "-q", "--", *install
    )


def test_rehearse_names_the_swap_the_broken_symbol_and_a_safe_command(tmp_path: Path, index: str) -> None:
    venv = _venv(tmp_path, index)
    before = tree(venv)
    out = tmp_path / "out"

    done = _rehearse(venv, out, "--index-url", index, "-U", "flashish")

    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    python = venv / "bin" / "python"
    constraints = out / "safer-1" / "constraints.txt"
    assert lines[0] == f"rehearsal of: uv pip install --python {python} --index-url {index} -U flashish"
    assert lines[2:] == [
        "the install changes 2 distributions:",
        "  torch 2.9.1+cu130 → 2.10.0 (build +cu130 → generic; CUDA 13.0 → 12.8): flashish 0.6.0 requires "
        "torch>=2.0.0; kernelish 0.3.21 requires torch",
        "  flashish 0.5.0 → 0.6.0",
        "pins it breaks: none",
        "what worked and breaks (2):",
        f"  kernelish: undefined symbol {SYMBOL}",
        f"  kernelish/{EXT}: undefined symbol {SYMBOL}; torch 2.10.0 (libc10_cuda.so) exports "
        f"{SYMBOL.replace(', int, bool', ', unsigned int, bool')}: kernelish was built against another torch.",
        "what was broken and is fixed: none",
        "verdict: breaks: 2 modules that work now break (after: fail)",
        "tried on its own copy: the same request, holding what works now (torch==2.9.1+cu130): safe: nothing that "
        "works now breaks (after: partial)",
        "  it changes: flashish 0.5.0 → 0.6.0",
        f"run instead: uv pip install --python {python} --index-url {index} -U flashish --constraint {constraints}",
        lines[-2],  # the time it took
        f"reports: {out / 'rehearsal.md'}, {out / 'index.html'}, {out / 'rehearsal.json'}",
    ]
    assert lines[-2].startswith("time: ")
    # Never written into: every file, folder and link of the environment as it was.
    assert tree(venv) == before
    assert not (out / "copies").exists()  # the copies went with the rehearsal

    data = json.loads((out / "rehearsal.json").read_text(encoding="utf-8"))
    assert (data["schema"], data["outcome"], data["suggested"]) == ("compatlab.rehearsal/1", "breaks", 0)
    [safer] = data["safer"]
    assert (safer["outcome"], safer["constraints"]) == ("safe", {"torch": "2.9.1+cu130"})
    assert constraints.read_text(encoding="utf-8") == "torch==2.9.1+cu130\n"
    assert data["request"]["copy"]["linked"] > 20
    assert data["request"]["copy"]["copied"] == 0
    assert data["request"]["breaks"][0]["code"] == "torch-abi"
    for name in ("original", "after", "safer-1"):
        assert (out / name / "results.json").is_file()
        assert (out / name / "index.html").is_file()
    assert (
        "| torch | 2.9.1+cu130 | 2.10.0 | +cu130 → generic | 13.0 → 12.8 | flashish 0.6.0 requires torch\\>=2.0.0; "
        "kernelish 0.3.21 requires torch |"
    ) in (out / "rehearsal.md").read_text(encoding="utf-8").splitlines()

    # The command it suggests, run for real on the environment itself, does what the rehearsal said.
    suggested = data["safer"][0]["command"]
    assert _run(str(Path(uv_dir()) / "uv"), *suggested[1:]).returncode == 0
    check = _run(str(python), "-c", "import kernelish, flashish, torch; print(flashish.__version__, torch.__version__)")
    assert check.stdout.split() == ["0.6.0", "2.9.1+cu130"], check.stderr


def test_an_install_that_breaks_nothing_exits_0(tmp_path: Path, index: str) -> None:
    venv = _venv(tmp_path, index)
    done = _rehearse(venv, tmp_path / "out", "--index-url", index, "flashish==0.6.0")
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[2:7] == [
        "the install changes 1 distribution:",
        "  flashish 0.5.0 → 0.6.0",
        "pins it breaks: none",
        "what worked and breaks: none",
        "what was broken and is fixed: none",
    ]
    assert lines[7] == "verdict: safe: nothing that works now breaks (after: partial)"
    assert not (tmp_path / "out" / "safer-1").exists()  # nothing broke: nothing safer to try


def test_an_install_uv_cannot_resolve_is_said_so(tmp_path: Path, index: str) -> None:
    venv = _venv(tmp_path, index)
    done = _rehearse(venv, tmp_path / "out", "--index-url", index, "flashish==9.9")
    assert done.returncode == 1, done.stdout + done.stderr
    verdict = next(line for line in done.stdout.splitlines() if line.startswith("verdict: "))
    assert verdict.startswith("verdict: the install fails: unsatisfiable: ")
    assert verdict.endswith("; the environment would stay as it is")


@pytest.mark.parametrize(
    ("install", "message"),
    [
        (
            [],
            "error: what install? pass the arguments of `uv pip install` after --, e.g. compatlab rehearse "
            "--venv ENV -- -U flashinfer-python, or --requirements FILE",
        ),
        (
            ["--python", "/usr/bin/python3", "flashish"],
            "error: rehearse: --python: the rehearsal installs into its copy of the environment; drop it from the "
            "install's arguments",
        ),
        (
            ["--dry-run", "flashish"],
            "error: rehearse: --dry-run: the rehearsal installs for real, into a copy; "
            "drop it from the install's arguments",
        ),
    ],
)
def test_bad_usage_is_one_line_and_exit_2(tmp_path: Path, install: list[str], message: str) -> None:
    venv = tmp_path / "v"
    (venv / "bin").mkdir(parents=True)
    done = _run(sys.executable, "-m", "compatlab", "rehearse", "--venv", str(venv), "--", *install)
    assert (done.returncode, done.stderr.strip()) == (2, message)
