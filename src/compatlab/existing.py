"""An existing environment, what ``compatlab check`` is pointed at: ``inspect_environment`` runs its interpreter
once (``incell/inspect_env.py``, read as ``runs.records.environment.Inspection``) and reads what it is and sees;
``existing_cell`` makes it a one-cell matrix whose axes are the stack packages it has.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

from packaging.utils import canonicalize_name

from compatlab.cells import Cell, cell_id
from compatlab.config.axes import AXIS_KINDS, CUDA_AXIS, PYTHON_AXIS, Axis, AxisValue
from compatlab.config.matrix import Matrix, Report, Target
from compatlab.errors import UsageError
from compatlab.proc import incell_command, run
from compatlab.runs.records.environment import Inspection
from compatlab.site import cuda_of_torch

__all__ = ["Environment", "count_gpus", "existing_cell", "inspect_environment"]


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Environment:
    """An interpreter and what it sees, read by running it once."""

    python: Path
    version: str
    prefix: Path
    is_venv: bool
    site: Path  # the site directory holding most of the distributions with native code
    dists: dict[str, str]  # name as its METADATA spells it -> version
    native: tuple[str, ...]  # distributions whose RECORD lists a shared object
    sites: dict[str, str]  # distribution -> the site directory it is installed in
    has_pytest: bool
    has_pip: bool
    torch_version_py: str | None = None
    # (the *.dist-info folder, what is wrong with it): distributions whose METADATA or RECORD cannot be read
    problems: tuple[tuple[str, str], ...] = ()

    def version_of(self, name: str) -> str | None:
        want = canonicalize_name(name)
        return next((v for d, v in self.dists.items() if canonicalize_name(d) == want), None)

    def site_for(self, names: Sequence[str]) -> Path:
        """The site directory holding most of *names* (the static stage reads one site directory)."""
        counts: dict[str, int] = {}
        for name in names:
            site = self.sites.get(self.spelled(name) or name, "")
            if site:
                counts[site] = counts.get(site, 0) + 1
        return Path(max(counts, key=lambda s: counts[s])) if counts else self.site

    def spelled(self, name: str) -> str | None:
        want = canonicalize_name(name)
        return next((d for d in self.dists if canonicalize_name(d) == want), None)


def inspect_environment(python: Path) -> Environment:
    """Run *python* once and read what it is and sees. UsageError when it is not a usable interpreter."""
    python = Path(os.path.abspath(python))  # the probe runs in another folder: a relative path would miss
    if not python.exists():
        raise UsageError(f"{python}: no such interpreter; pass --python PATH or --venv DIR of the environment")
    # compatlab.incell.inspect_env, with the checked interpreter: who it is, and every distribution it sees.
    command = incell_command(python, "inspect_env")
    try:
        done = run(command.argv, timeout=120, env=_plain_env(), cwd=command.cwd)
    except OSError as exc:
        raise UsageError(f"{python}: cannot run it: {exc.strerror or exc}") from None
    if not done.ok:
        last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        raise UsageError(f"{python}: could not read its environment: {last}")
    info = Inspection.from_json(json.loads(done.stdout))
    return Environment(
        python=Path(info.python or python),
        version=info.version,
        prefix=Path(info.prefix),
        is_venv=info.is_venv,
        site=Path(info.site),
        dists={d.name: d.version for d in info.dists},
        native=tuple(sorted((d.name for d in info.dists if d.native), key=str.lower)),
        sites={d.name: d.site for d in info.dists},
        has_pytest=info.pytest,
        has_pip=info.pip,
        torch_version_py=info.torch_version_py,
        problems=info.problems,
    )


def _plain_env() -> dict[str, str]:
    dropped = ("PYTHONPATH", "PYTHONHOME", "LD_PRELOAD")
    return {k: v for k, v in os.environ.items() if k not in dropped}


def count_gpus() -> int:
    """NVIDIA GPUs this machine has, from the driver's /proc entries (else nvidia-smi -L); 0 without a driver."""
    proc = Path("/proc/driver/nvidia/gpus")
    if proc.is_dir():
        return sum(1 for _ in proc.iterdir())
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0
    try:
        done = run([smi, "-L"], timeout=60)
    except OSError:
        return 0
    return sum(1 for line in done.stdout.splitlines() if line.startswith("GPU ")) if done.ok else 0


def _stack_values(env: Environment, pins: dict[str, str]) -> list[AxisValue]:
    """The axes of the grid: the stack packages the environment has (pinned ones at their pin)."""
    values: list[AxisValue] = []
    for axis, kind in AXIS_KINDS.items():
        if kind.package is None:
            continue
        spelled = env.spelled(kind.package)
        pinned = next((v for n, v in pins.items() if canonicalize_name(n) == canonicalize_name(kind.package)), None)
        if spelled is None and pinned is None:
            continue
        version = pinned or env.dists[spelled or kind.package]
        values.append(AxisValue(axis=axis, version=version, package=spelled or kind.package))
    return values


def existing_cell(
    env: Environment,
    *,
    packages: Sequence[str] = (),
    pins: dict[str, str] | None = None,
    archs: Sequence[str] = (),
    min_driver: str | None = None,
    gpus: int = 0,
    not_needed: Sequence[str] = (),
) -> tuple[Matrix, Cell]:
    """The one-cell matrix of an existing environment, and its cell.

    The cell's packages are *packages* (every distribution when empty, pure Python included), the pinned
    ones and the stack; a pinned one carries its pin as the declared version, so that the pins stage
    compares the environment against it.
    """
    pins = dict(pins or {})
    if packages:
        unknown = [p for p in packages if env.spelled(p) is None]
        if unknown:
            raise UsageError(
                f"--package {unknown[0]}: not installed for {env.python}"
                + (f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else "")
                + "; `compatlab check` without --package checks every distribution"
            )
        chosen = [env.spelled(p) or p for p in packages]
    else:
        chosen = sorted(env.dists, key=str.lower)  # pure Python too: its import can fail as well
    stack = _stack_values(env, pins)
    cuda = cuda_of_torch(env.torch_version_py, env.version_of("torch"))
    axis_values = list(stack)
    if cuda:
        axis_values.append(AxisValue(axis=CUDA_AXIS, version=cuda))
    if not axis_values:
        axis_values.append(AxisValue(axis=PYTHON_AXIS, version=env.version))
    in_stack = {canonicalize_name(v.package) for v in stack if v.package}
    extra: list[AxisValue] = []
    for name in [*chosen, *pins]:
        want = canonicalize_name(name)
        if want in in_stack or any(want == canonicalize_name(v.axis) for v in extra):
            continue
        pinned = next((v for n, v in pins.items() if canonicalize_name(n) == want), None)
        version = pinned or env.version_of(name)
        if version is None:  # a pin of something not installed: the pins stage says so
            version = "?"
        extra.append(AxisValue(axis=name, version=version, package=env.spelled(name) or name))
    target = Target(
        name="this-box", arch=tuple(archs), gpus=max(1, gpus), min_driver=min_driver, not_needed=tuple(not_needed)
    )
    rows = (axis_values[0].axis,)
    columns = tuple(v.axis for v in axis_values[1:] if v.axis != CUDA_AXIS)
    matrix = Matrix(
        path="<compatlab check>",
        name=f"check {env.prefix}",
        axes=tuple(Axis(name=v.axis, values=(v,)) for v in axis_values),
        targets=(target,),
        report=Report(rows=rows, columns=columns, tables=(CUDA_AXIS,) if cuda else ()),
    )
    cell = Cell(id=cell_id(tuple(axis_values)), values=(*axis_values, *extra))
    return matrix, cell
