"""The install stage: a fresh uv venv and one install of the cell's pins, retried when it errors.

Install is a stage like the others: it reads the cell's context and returns its result, as an ``Installed``
(stages/base.py) that also carries what the later stages read about the environment it made (the install
record, ``site_packages`` and ``freeze``): the runner puts those into their context. Only an
``error`` (the index or the network failed) is retried; ``fail`` (the pins cannot be satisfied) is an
answer. A venv is marked complete only after its install passed, so a half-written venv (a killed run) is
never mistaken for the cell's stack.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path

from compatlab import envs, uv_failures
from compatlab.errors import lab_error
from compatlab.runs.model import InstallRecord, StageResult, StageState
from compatlab.runs.records.install import InstallDetails
from compatlab.stages.base import CellContext, Installed

__all__ = ["COMPLETE", "is_complete", "run_install_stage"]

log = logging.getLogger(__name__)

COMPLETE = ".compatlab-complete"


def is_complete(venv: Path) -> bool:
    """Whether *venv* holds a stack the install stage finished installing."""
    return (venv / COMPLETE).is_file() and envs.venv_python(venv).exists()


def _attempt(ctx: CellContext) -> tuple[StageResult, InstallRecord]:
    start = time.monotonic()
    python = envs.cell_interpreter(ctx.matrix, ctx.cell)
    made = envs.create_venv(ctx.venv, python=python)
    if not made.ok:
        why = uv_failures.venv_failure(made, python=python, cell=ctx.cell)
        return (
            StageResult(
                name="install",
                state=StageState.ERROR,
                reason=why,
                details=InstallDetails(argv=tuple(made.argv), stderr=made.stderr[-4000:]).to_details(),
                seconds=time.monotonic() - start,
            ),
            InstallRecord(argv=tuple(made.argv)),
        )
    spec_dir = ctx.work_dir / "spec"
    plan = envs.install_plan(ctx.matrix, ctx.cell, python=ctx.python, spec_dir=spec_dir)
    envs.write_plan_files(plan, spec_dir)
    done = envs.run_install(plan, timeout=ctx.matrix.install.timeout)
    record = plan.record()
    details = InstallDetails(
        argv=tuple(plan.argv), stdout=done.stdout[-4000:], stderr=done.stderr[-8000:], uv_seconds=round(done.seconds, 3)
    ).to_details()
    if not done.ok:
        state, why = uv_failures.classify_uv_failure(done, plan)
        return StageResult(
            name="install", state=state, reason=why, details=details, seconds=time.monotonic() - start
        ), record
    return StageResult(name="install", state=StageState.PASS, details=details, seconds=time.monotonic() - start), record


def run_install_stage(ctx: CellContext) -> Installed:
    """Make the cell's venv and install its pins: the result, with the install record and, where it passed, the
    venv's ``site_packages`` and ``freeze`` for the stages after it."""
    (ctx.venv / COMPLETE).unlink(missing_ok=True)
    attempts = 0
    start = time.monotonic()
    while True:
        attempts += 1
        result, record = _attempt(ctx)
        if result.state != StageState.ERROR or attempts > ctx.matrix.install.retries:
            break
        said = f"install error, attempt {attempts} of {ctx.matrix.install.retries + 1}; retrying: {result.reason}"
        if ctx.say is not None:  # one format with the cell's other lines
            ctx.say(said)
        else:
            log.warning("%s: %s", ctx.cell.id, said)
    counted = dataclasses.replace(InstallDetails.of(result), attempts=attempts)
    result = dataclasses.replace(result, details=counted.to_details(), seconds=round(time.monotonic() - start, 3))
    if result.state != StageState.PASS:
        return Installed(result=result, install=record)
    try:
        site = envs.site_packages(ctx.venv)
        frozen = envs.freeze(ctx.python)
    except Exception as exc:  # a lab bug after uv installed: the cell keeps what uv did (the record, its output)
        log.exception("stage install crashed")
        return Installed(
            result=dataclasses.replace(result, state=StageState.ERROR, reason=lab_error(exc)), install=record
        )
    lines = tuple(frozen.stdout.splitlines()) if frozen.ok else ()
    (ctx.venv / COMPLETE).write_text("installed by compatlab\n", encoding="utf-8")
    return Installed(result=result, install=record, site_packages=site, freeze=lines)
