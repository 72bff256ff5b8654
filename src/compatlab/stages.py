"""The stage interface: each stage reads a CellContext and returns a StageResult."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path

from .cells import Cell
from .matrix import Matrix
from .results import StageResult

__all__ = ["CellContext", "Stage", "cell_env"]


@dataclasses.dataclass(kw_only=True, slots=True)
class CellContext:
    """Everything a stage may read about its cell. Stages must not write outside ``work_dir``."""

    matrix: Matrix
    cell: Cell
    venv: Path
    python: Path
    site_packages: Path
    work_dir: Path
    freeze: list[str] = dataclasses.field(default_factory=list)
    previous: list[StageResult] = dataclasses.field(default_factory=list)

    def stage(self, name: str) -> StageResult | None:
        for s in self.previous:
            if s.name == name:
                return s
        return None


# A stage: name, function, and the stages that must have passed (or warned) for it to run.
@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Stage:
    name: str
    run: Callable[[CellContext], StageResult]
    needs: tuple[str, ...] = ()


def cell_env(venv: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for processes in a cell: the venv first on PATH, no inherited library paths."""
    dropped = ("LD_LIBRARY_PATH", "LD_PRELOAD", "PYTHONPATH", "PYTHONHOME")
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    # The cell must not see stray toolkits, but a container may find the driver only this way.
    driver_dirs = [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep)
                   if d and (Path(d) / "libcuda.so.1").exists()]
    if driver_dirs:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(driver_dirs)
    env["VIRTUAL_ENV"] = str(venv)
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONNOUSERSITE"] = "1"
    if extra:
        env.update(extra)
    return env
