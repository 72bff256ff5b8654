"""The compilers a stack will call at run time, found and tried on the CPU before any GPU is asked.

SGLang compiles on its first forward: Triton hands each kernel's PTX to ``ptxas``, flashinfer's JIT (and
torch's ``cpp_extension``) to ``nvcc``. A ptxas that does not know the box's GPU (``TRITON_PTXAS_PATH`` pointing
at an older toolkit; sm_120 on a CUDA 12.4 toolchain) is found today only after the GPU box has spent minutes
starting a server, and read back from the log as ``CalledProcessError … exit status 255``. Both tools run here on
the CPU, so this check finds the ones the stack will pick, the way it picks them, and asks each one:

- **Triton's ptxas**, as ``triton/knobs.py`` (3.4 and later; ``backends/nvidia/compiler.py`` before) chooses it:
  ``$TRITON_PTXAS_PATH`` first, then the one Triton ships (``triton/backends/nvidia/bin/ptxas``; Triton 2's
  ``third_party/cuda/bin/ptxas``), the first that answers ``--version`` with a release; for sm_100 and up,
  ``ptxas-blackwell`` and ``$TRITON_PTXAS_BLACKWELL_PATH`` where the Triton has them. Then for each target arch,
  the arch Triton asks for (``sm_90a`` for sm_90: an ``a`` from sm_90 on) and a PTX of the ISA version Triton
  writes for that ptxas release (``ptx_get_version``), compiled by that ptxas: its refusal, in its own words
  (``ptxas fatal : Value 'sm_90a' is not defined for option 'gpu-name'``), fails the check. No ptxas at all is
  Triton's ``RuntimeError: Cannot find ptxas``: a failure too.
- **The JIT's nvcc**, as flashinfer's ``jit/cpp_ext.py`` and torch's ``cpp_extension`` find it: ``$CUDA_HOME``,
  ``$CUDA_PATH``, the folder above the ``nvcc`` on PATH, ``/usr/local/cuda``; ``$FLASHINFER_NVCC`` over all.
  Its release against torch's CUDA major and its ``--list-gpu-code`` against each arch. These are warnings:
  flashinfer ships many kernels built, and only what it must build meets nvcc.

The environment asked is the one the stack runs in: the cell's (``cell_env``), or the caller's for ``check``.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from compatlab.incell.proc import Completed, run

__all__ = ["Problem", "Tool", "find_nvcc", "find_ptxas", "ptx_version", "toolchain_problems", "triton_arch"]

_RELEASE = re.compile(r"release (\d+)\.(\d+)")
_TIMEOUT = 60.0


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Tool:
    """A compiler the stack will call: where it is, how it was chosen, and its CUDA release."""

    name: str  # ptxas, ptxas-blackwell, nvcc
    path: str
    chosen_by: str  # "TRITON_PTXAS_PATH", "triton's own", "CUDA_HOME", "PATH", "/usr/local/cuda"
    release: tuple[int, int] | None

    @property
    def release_text(self) -> str:
        return f"CUDA {self.release[0]}.{self.release[1]}" if self.release else "no release"

    def said(self) -> str:
        return f"{self.name} {self.release_text} ({self.chosen_by}: {self.path})"


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Problem:
    """One thing wrong with a tool: ``fail`` (every kernel it compiles fails) or ``warn``."""

    severity: str  # fail | warn
    dist: str  # the distribution whose run-time compile meets it: triton, flashinfer-python
    message: str
    details: dict[str, object]


def _run(argv: Sequence[str], env: Mapping[str, str], cwd: str | None = None) -> Completed | None:
    """*argv* run to its end (in its own process group, killed at the time limit); None when it cannot start."""
    try:
        return run(argv, timeout=_TIMEOUT, env=env, cwd=cwd)
    except OSError:
        return None


def _release(path: str, env: Mapping[str, str]) -> tuple[int, int] | None:
    """*path*'s ``--version`` release, as Triton's ``NvidiaTool.from_path`` reads it; None when it gives none."""
    done = _run([path, "--version"], env)
    m = _RELEASE.search(done.stdout + done.stderr) if done is not None and done.ok else None
    return (int(m[1]), int(m[2])) if m else None


def triton_arch(arch: str) -> tuple[int, str]:
    """(capability, the arch Triton passes ptxas) for a target arch: ``sm_90`` → (90, ``sm_90a``)."""
    m = re.fullmatch(r"sm_(\d+)[af]?", arch)
    if m is None:
        raise ValueError(f"not an SM arch: {arch!r}")
    cap = int(m[1])
    return cap, f"sm_{cap}{'a' if cap >= 90 else ''}"


def ptx_version(release: tuple[int, int]) -> int:
    """The PTX ISA version Triton writes for a ptxas of *release* (``backends/nvidia/compiler.py``'s
    ``ptx_get_version``): 12.4 → 84, 12.8 → 87, 13.0 → 90."""
    major, minor = release
    if major == 12:
        return 80 + minor if minor < 6 else 80 + minor - 1
    if major == 11:
        return 70 + minor
    if major == 10:
        return 63 + minor
    return 90 + (major - 13) * 10 + minor


def find_ptxas(triton_dir: Path, cap: int, env: Mapping[str, str]) -> tuple[Tool | None, list[str]]:
    """The ptxas Triton in *triton_dir* uses for capability *cap*, and what was tried before it."""
    blackwell = cap >= 100 and (
        (triton_dir / "backends" / "nvidia" / "bin" / "ptxas-blackwell").exists()
        or "ptxas-blackwell" in _read(triton_dir / "knobs.py")
    )
    name = "ptxas-blackwell" if blackwell else "ptxas"
    key = "TRITON_PTXAS_BLACKWELL_PATH" if blackwell else "TRITON_PTXAS_PATH"
    candidates: list[tuple[str, str]] = []
    if env.get(key):
        candidates.append((env[key], key))
    for rel in (f"backends/nvidia/bin/{name}", f"third_party/cuda/bin/{name}"):
        if (triton_dir / rel).exists() or rel.startswith("backends"):
            candidates.append((str(triton_dir / rel), "triton's own"))
    tried: list[str] = []
    for path, chosen_by in candidates:
        release = _release(path, env)
        if release is not None:
            return Tool(name=name, path=path, chosen_by=chosen_by, release=release), tried
        tried.append(f"{chosen_by} {path} " + ("gives no release" if Path(path).exists() else "is not there"))
    return None, tried


def find_nvcc(env: Mapping[str, str]) -> tuple[Tool | None, str]:
    """The nvcc flashinfer's JIT calls (``get_cuda_path``, ``$FLASHINFER_NVCC``), or None; and where it looked."""
    if env.get("FLASHINFER_NVCC"):
        path, chosen_by = env["FLASHINFER_NVCC"], "FLASHINFER_NVCC"
    else:
        home, chosen_by = env.get("CUDA_HOME") or env.get("CUDA_PATH"), "CUDA_HOME"
        if env.get("CUDA_PATH") and not env.get("CUDA_HOME"):
            chosen_by = "CUDA_PATH"
        if home is None:
            found = shutil.which("nvcc", path=env.get("PATH", ""))
            if found is not None:
                home, chosen_by = str(Path(found).parent.parent), "PATH"
            else:
                home, chosen_by = "/usr/local/cuda", "/usr/local/cuda"
        path = str(Path(home) / "bin" / "nvcc")
    looked = f"{chosen_by}: {path}" if chosen_by != "/usr/local/cuda" else f"none on PATH, no {path}"
    if not Path(path).exists():
        return None, looked
    return Tool(name="nvcc", path=path, chosen_by=chosen_by, release=_release(path, env)), looked


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")[:200_000]
    except OSError:
        return ""


def _compiles(tool: Tool, arch: str, env: Mapping[str, str]) -> str:
    """ "" when *tool* (a ptxas) compiles an empty kernel for *arch*, else its first words of refusal."""
    assert tool.release is not None
    version = ptx_version(tool.release)
    ptx = f".version {version // 10}.{version % 10}\n.target {arch}\n.address_size 64\n.visible .entry k() {{ ret; }}\n"
    with tempfile.TemporaryDirectory(prefix="compatlab-ptxas-") as tmp:
        src = Path(tmp) / "k.ptx"
        src.write_text(ptx, encoding="ascii")
        done = _run([tool.path, f"--gpu-name={arch}", str(src), "-o", str(Path(tmp) / "k.cubin")], env, cwd=tmp)
    if done is None:
        return "it could not be run"
    if done.timed_out:
        return f"it did not finish in {_TIMEOUT:.0f} s"
    if done.returncode == 0:
        return ""
    lines = [" ".join(x.replace(str(src), "k.ptx").split()) for x in (done.stderr + done.stdout).splitlines()]
    lines = [x for x in lines if x]
    fatal = next((x for x in lines if "fatal" in x and "aborted" not in x), None)
    return (fatal or (lines[0] if lines else f"exit status {done.returncode}"))[:300]


def _gpu_codes(tool: Tool, env: Mapping[str, str]) -> set[str] | None:
    done = _run([tool.path, "--list-gpu-code"], env)
    return set(done.stdout.split()) if done is not None and done.ok else None


# A JIT that finds nvcc as flashinfer's get_cuda_path does: its file, relative to site-packages.
_NVCC_JITS = ("flashinfer/jit/cpp_ext.py",)


def toolchain_problems(
    site: Path,
    archs: Sequence[str],
    env: Mapping[str, str],
    *,
    torch_cuda: str | None,
    dists: Sequence[str],
    owner: Callable[[Path], str | None],
) -> list[Problem]:
    """What is wrong with the compilers the stack in *site* calls at run time for *archs* (see the module).

    *dists* are the environment's distribution names (canonical); *torch_cuda* torch's CUDA (``13.0``);
    *owner* the distribution a file belongs to."""
    problems: list[Problem] = []
    triton_dir = site / "triton"
    if "triton" in dists and (triton_dir / "__init__.py").exists():
        seen: dict[tuple[str, str], str] = {}
        for arch in dict.fromkeys(archs):
            cap, asked = triton_arch(arch)
            tool, tried = find_ptxas(triton_dir, cap, env)
            if tool is None:
                name = "ptxas-blackwell" if cap >= 100 and "blackwell" in " ".join(tried) else "ptxas"
                problems.append(
                    Problem(
                        severity="fail",
                        dist="triton",
                        message=(
                            f"triton finds no {name} ({'; '.join(tried)}): every Triton kernel fails to compile "
                            f"for {arch} (RuntimeError: Cannot find {name})"
                        ),
                        details={"arch": arch, "tried": tried},
                    )
                )
                continue
            if (tool.path, asked) not in seen:
                seen[(tool.path, asked)] = _compiles(tool, asked, env)
            refused = seen[(tool.path, asked)]
            if refused:
                problems.append(
                    Problem(
                        severity="fail",
                        dist="triton",
                        message=f"triton's {tool.said()} cannot compile for {asked}: {refused}",
                        details={
                            "arch": arch,
                            "asked": asked,
                            "tool": tool.path,
                            "chosen_by": tool.chosen_by,
                            "release": tool.release_text,
                            "ptx_version": ptx_version(tool.release) if tool.release else None,
                            "tried": tried,
                        },
                    )
                )
    jit = next((site / rel for rel in _NVCC_JITS if (site / rel).is_file()), None)
    if jit is not None:
        jit_dist = owner(jit) or jit.relative_to(site).parts[0]
        nvcc, looked = find_nvcc(env)
        if nvcc is None:
            problems.append(
                Problem(
                    severity="warn",
                    dist=jit_dist,
                    message=(
                        f"flashinfer's JIT finds no nvcc ({looked}): a kernel it does not ship built will not build"
                    ),
                    details={"looked": looked},
                )
            )
        elif nvcc.release is None:
            problems.append(
                Problem(
                    severity="warn",
                    dist=jit_dist,
                    message=f"flashinfer's JIT would call {nvcc.path} ({nvcc.chosen_by}), which gives no release",
                    details={"tool": nvcc.path},
                )
            )
        else:
            torch_major = int(torch_cuda.split(".")[0]) if torch_cuda and torch_cuda.split(".")[0].isdigit() else None
            if torch_major is not None and nvcc.release[0] != torch_major:
                problems.append(
                    Problem(
                        severity="warn",
                        dist=jit_dist,
                        message=(
                            f"flashinfer's JIT builds with {nvcc.said()} against torch built for CUDA {torch_cuda}: "
                            "what it builds links another CUDA major than torch's"
                        ),
                        details={"tool": nvcc.path, "release": nvcc.release_text, "torch_cuda": torch_cuda},
                    )
                )
            codes = _gpu_codes(nvcc, env)
            for arch in dict.fromkeys(archs):
                cap, _asked = triton_arch(arch)
                if codes is not None and f"sm_{cap}" not in codes:
                    problems.append(
                        Problem(
                            severity="warn",
                            dist=jit_dist,
                            message=f"flashinfer's JIT nvcc, {nvcc.said()}, cannot build for sm_{cap}",
                            details={"tool": nvcc.path, "arch": arch, "codes": sorted(codes)},
                        )
                    )
    return problems
