"""The compilers a stack calls at run time, checked on the CPU (issue 31): two real ptxas releases from the
package index (nvidia-cuda-nvcc-cu12 12.4, which does not know sm_120, and 12.8, which does), put where Triton
looks for them (``TRITON_PTXAS_PATH``, Triton's own ``backends/nvidia/bin/ptxas``), and asked by ``compatlab
static`` as Triton would ask them. The Triton beside them is a folder with Triton's layout and its dist-info:
what the check reads of it is where its ptxas is; the 300 MB wheel adds nothing to that."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from compatlab.runs.records.static import Kind, Severity
from compatlab.stages.static.stage import check_site_packages

SRC = Path(__file__).resolve().parents[3] / "src"
# release -> (the wheel, its toolkit folder); the cu12 wheels carry ptxas alone, CUDA 13's nvcc as well.
RELEASES = {
    "12.4": ("nvidia-cuda-nvcc-cu12==12.4.131", "nvidia/cuda_nvcc"),
    "12.8": ("nvidia-cuda-nvcc-cu12==12.8.93", "nvidia/cuda_nvcc"),
    "13.0": ("nvidia-cuda-nvcc==13.0.88", "nvidia/cu13"),
}


def _uv() -> str:
    uv = shutil.which("uv") or str(Path(sys.executable).parent / "uv")
    if not Path(uv).exists():
        pytest.skip("no uv to fetch the ptxas releases with")
    return uv


@pytest.fixture(scope="module")
def toolkits(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """release -> the toolkit folder of that wheel (bin/ptxas; bin/nvcc for 13.0), installed from the index."""
    root = tmp_path_factory.mktemp("toolkits")
    found: dict[str, Path] = {}
    for release, (spec, folder) in RELEASES.items():
        target = root / release
        done = subprocess.run(
            [_uv(), "pip", "install", "--quiet", "--no-deps", "--target", str(target), spec],
            capture_output=True,
            text=True,
            env={**os.environ, "UV_PYTHON_DOWNLOADS": "never"},
            timeout=600,
        )
        if done.returncode != 0:
            pytest.skip(f"{spec} could not be installed from the index: {done.stderr.strip()[-300:]}")
        found[release] = target / folder
        assert (found[release] / "bin" / "ptxas").is_file()
    return found


def _site(tmp: Path, *, bundled: Path | None, flashinfer: bool = False, torch_cuda: str = "13.0") -> Path:
    """A site-packages with Triton's layout (its ptxas *bundled* there, or none) and torch's version.py."""
    sp = tmp / "site-packages"
    (sp / "triton" / "backends" / "nvidia" / "bin").mkdir(parents=True)
    (sp / "triton" / "__init__.py").write_text('__version__ = "3.6.0"\n', encoding="utf-8")
    (sp / "triton" / "knobs.py").write_text('ptxas = env_nvidia_tool("ptxas")\n', encoding="utf-8")
    if bundled is not None:
        shutil.copy2(bundled / "bin" / "ptxas", sp / "triton" / "backends" / "nvidia" / "bin" / "ptxas")
    dists = [("triton", "3.6.0", "triton/__init__.py")]
    (sp / "torch").mkdir()
    (sp / "torch" / "version.py").write_text(
        f"__version__ = '2.11.0+cu{torch_cuda.replace('.', '')}'\ncuda = '{torch_cuda}'\n", encoding="utf-8"
    )
    dists.append(("torch", "2.11.0", "torch/version.py"))
    if flashinfer:
        (sp / "flashinfer" / "jit").mkdir(parents=True)
        (sp / "flashinfer" / "__init__.py").write_text("", encoding="utf-8")
        (sp / "flashinfer" / "jit" / "cpp_ext.py").write_text("def get_cuda_path(): ...\n", encoding="utf-8")
        dists.append(("flashinfer_python", "0.6.15", "flashinfer/jit/cpp_ext.py"))
    for name, version, rel in dists:
        info = sp / f"{name}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n", encoding="utf-8")
        (info / "RECORD").write_text(f"{rel},,\n{info.name}/METADATA,,\n", encoding="utf-8")
    return sp


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRITON_", "CUDA_", "FLASHINFER_"))}
    env.update(extra)
    return env


def _toolchain(sp: Path, archs: list[str], env: dict[str, str]) -> list[tuple[str, str]]:
    report = check_site_packages(sp, archs=archs, env=env)
    found = [f for f in report.findings if f.kind == Kind.TOOLCHAIN]
    assert {f.module for f in found} <= {"triton", "flashinfer-python"}  # the distribution whose compile meets it
    return [(f.severity.value, f.message) for f in found]


def test_a_ptxas_that_does_not_know_the_arch_fails_before_any_gpu(tmp_path: Path, toolkits: dict[str, Path]) -> None:
    """The origin story in miniature: sm_120 with TRITON_PTXAS_PATH at CUDA 12.4's ptxas, Triton's own 12.8
    beside it. Triton takes the one the variable names, so the check does; ptxas's own words are the reason."""
    sp = _site(tmp_path, bundled=toolkits["12.8"])
    old = str(toolkits["12.4"] / "bin" / "ptxas")
    found = _toolchain(sp, ["sm_120"], _env(TRITON_PTXAS_PATH=old))
    assert found == [
        (
            "fail",
            f"triton's ptxas CUDA 12.4 (TRITON_PTXAS_PATH: {old}) cannot compile for sm_120a: "
            "ptxas fatal : Value 'sm_120a' is not defined for option 'gpu-name'",
        )
    ]
    # The same ptxas knows sm_90 (Triton asks for sm_90a): nothing to say there.
    assert _toolchain(sp, ["sm_90"], _env(TRITON_PTXAS_PATH=old)) == []
    # The release that knows sm_120, and Triton's own when the variable is unset or names nothing that answers.
    assert _toolchain(sp, ["sm_120"], _env(TRITON_PTXAS_PATH=str(toolkits["12.8"] / "bin" / "ptxas"))) == []
    assert _toolchain(sp, ["sm_120"], _env()) == []
    assert _toolchain(sp, ["sm_120"], _env(TRITON_PTXAS_PATH=str(tmp_path / "no-such-ptxas"))) == []


def test_triton_without_a_ptxas_is_a_failure_too(tmp_path: Path, toolkits: dict[str, Path]) -> None:
    sp = _site(tmp_path, bundled=None)
    found = _toolchain(sp, ["sm_90"], _env(TRITON_PTXAS_PATH=str(tmp_path / "gone")))
    assert len(found) == 1
    severity, message = found[0]
    assert severity == "fail"
    assert message.startswith(f"triton finds no ptxas (TRITON_PTXAS_PATH {tmp_path / 'gone'} is not there; ")
    assert message.endswith("every Triton kernel fails to compile for sm_90 (RuntimeError: Cannot find ptxas)")


def test_the_jit_s_nvcc_is_judged_against_torch_and_the_arch(tmp_path: Path, toolkits: dict[str, Path]) -> None:
    """flashinfer's JIT takes CUDA_HOME's nvcc: CUDA 13.0's (from the index), beside a torch for CUDA 12.8 and a
    Volta target, which CUDA 13 no longer builds for. Warnings: flashinfer ships most kernels built."""
    sp = _site(tmp_path, bundled=toolkits["12.8"], flashinfer=True, torch_cuda="12.8")
    home = toolkits["13.0"]
    nvcc = f"nvcc CUDA 13.0 (CUDA_HOME: {home / 'bin' / 'nvcc'})"
    assert _toolchain(sp, ["sm_70", "sm_90"], _env(CUDA_HOME=str(home))) == [
        (
            "warn",
            f"flashinfer's JIT builds with {nvcc} against torch built for CUDA 12.8: what it builds links another "
            "CUDA major than torch's",
        ),
        ("warn", f"flashinfer's JIT nvcc, {nvcc}, cannot build for sm_70"),
    ]
    # Found on PATH as flashinfer finds it (the folder above bin/), and a torch of its major: nothing to say.
    sp13 = _site(tmp_path / "13", bundled=toolkits["12.8"], flashinfer=True, torch_cuda="13.0")
    assert _toolchain(sp13, ["sm_90"], _env(PATH=f"{home / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}")) == []
    # No nvcc anywhere it looks (a CUDA_HOME without one): a warning that says where it looked.
    assert _toolchain(sp13, ["sm_90"], _env(CUDA_HOME=str(tmp_path))) == [
        (
            "warn",
            f"flashinfer's JIT finds no nvcc (CUDA_HOME: {tmp_path / 'bin' / 'nvcc'}): a kernel it does not ship "
            "built will not build",
        )
    ]


def test_compatlab_static_says_it_and_exits_1(tmp_path: Path, toolkits: dict[str, Path]) -> None:
    sp = _site(tmp_path, bundled=toolkits["12.8"])
    env = _env(TRITON_PTXAS_PATH=str(toolkits["12.4"] / "bin" / "ptxas"), PYTHONPATH=str(SRC))
    done = subprocess.run(
        [sys.executable, "-m", "compatlab", "static", "--site-packages", str(sp), "--target", "sm_120", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    (finding,) = [f for f in report["findings"] if f["kind"] == "toolchain"]
    assert finding["severity"] == Severity.FAIL
    assert finding["module"] == "triton"
    assert finding["details"]["asked"] == "sm_120a"
    assert finding["details"]["release"] == "CUDA 12.4"
    assert finding["details"]["ptx_version"] == 84
