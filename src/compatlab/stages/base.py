"""The stage interface: each stage reads a CellContext and returns a StageResult.

A context is frozen: the runner makes each stage's successor context with ``dataclasses.replace`` (the results
so far in ``previous``). The one stage that makes the cell's environment (install) returns an ``Installed``, its
result with what it made (the install record, site-packages, ``uv pip freeze``), which the runner puts into the
context of the stages after it (``Installed.after``).

Also what every stage that runs code in the cell shares: the cell's environment (``cell_env``). The command
that runs a module of ``compatlab.incell`` with the cell's interpreter is ``proc.incell_command``.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path

from compatlab.cells import Cell
from compatlab.config.matrix import Matrix
from compatlab.runs.model import InstallRecord, StageResult, StageState

__all__ = ["CellContext", "Installed", "Stage", "blocked", "cell_env", "stack_of"]


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class CellContext:
    """Everything a stage may read about its cell. Stages must not write outside ``work_dir``.

    ``site_packages``, ``freeze`` and ``install`` come from the install stage's ``Installed`` (or, for an
    existing environment, from whoever made the context); ``previous`` holds the results of the stages before.
    """

    matrix: Matrix
    cell: Cell
    venv: Path
    python: Path
    work_dir: Path
    site_packages: Path | None = None
    freeze: tuple[str, ...] = ()
    install: InstallRecord | None = None
    previous: tuple[StageResult, ...] = ()
    # Where a long stage says how far it is (a line at a time, for people); None: quiet.
    say: Callable[[str], None] | None = None
    # The suites take pytest from an overlay outside the environment (suite.tools_overlay): one the lab did not
    # make (compatlab check: ``install.existing``), which is never installed into, and which has no pytest.
    tools_overlay: bool = False
    # Where what a cell keeps between runs lives (the serve stage's JIT caches): the venvs folder for a matrix
    # cell, pruned with it; None (an existing environment): $COMPATLAB_CACHE.
    caches: Path | None = None

    def stage(self, name: str) -> StageResult | None:
        for s in self.previous:
            if s.name == name:
                return s
        return None

    @property
    def site(self) -> Path:
        """The cell's site-packages; only stages that need ``install`` read it."""
        if self.site_packages is None:
            raise LookupError(f"{self.cell.id}: no site-packages yet (the install stage has not passed)")
        return self.site_packages


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Installed:
    """What the stage that makes the cell's environment returns: its ``result``, the ``install`` record of
    what it ran (kept in the cell's result), and, where it passed, the venv's ``site_packages`` and its
    ``freeze`` lines; None and () where it did not."""

    result: StageResult
    install: InstallRecord
    site_packages: Path | None = None
    freeze: tuple[str, ...] = ()

    def after(self, ctx: CellContext) -> CellContext:
        """*ctx* with what this install made, for the stages after it (its result is not yet in ``previous``)."""
        return dataclasses.replace(ctx, install=self.install, site_packages=self.site_packages, freeze=self.freeze)


# A stage: name, function, and the stages that must have passed (or warned) for it to run. The function returns
# its result, or (the install stage) an Installed: its result with what it made for the stages after it.
@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Stage:
    name: str
    run: Callable[[CellContext], StageResult | Installed]
    needs: tuple[str, ...] = ()
    # A stage that does not run on this machine (a GPU stage on a CPU box) makes the cell partial.
    required: bool = True


def blocked(stage: Stage, ctx: CellContext) -> StageResult | None:
    """The one spelling of a stage that cannot run because a stage it needs did not pass, or None."""
    missing = []
    for name in stage.needs:
        prior = ctx.stage(name)
        if prior is None:
            missing.append(f"{name} did not run")
        elif prior.state not in (StageState.PASS, StageState.WARN):
            word = {"fail": "failed", "error": "errored", "skip": "was skipped"}.get(prior.state, prior.state)
            missing.append(f"{name} {word}")
    if not missing:
        return None
    return StageResult(name=stage.name, state=StageState.SKIP, reason="blocked: " + ", ".join(missing))


def cell_env(venv: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for processes in a cell: the venv first on PATH, no inherited library paths."""
    dropped = ("LD_LIBRARY_PATH", "LD_PRELOAD", "PYTHONPATH", "PYTHONHOME")
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    # The cell must not see stray toolkits, but a container may find the driver only this way.
    driver_dirs = [
        d for d in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if d and (Path(d) / "libcuda.so.1").exists()
    ]
    if driver_dirs:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(driver_dirs)
    env["VIRTUAL_ENV"] = str(venv)
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONNOUSERSITE"] = "1"
    if extra:
        env.update(extra)
    return env


def stack_of(ctx: CellContext) -> str:
    """The cell's exact stack: every distribution and version of its site-packages (its freeze), one a line."""
    if ctx.freeze:
        return "\n".join(sorted(ctx.freeze))
    sites = (
        [ctx.site_packages] if ctx.site_packages is not None else sorted(ctx.venv.glob("lib/python3*/site-packages"))
    )
    return "\n".join(sorted(info.name for site in sites for info in site.glob("*.dist-info")))
