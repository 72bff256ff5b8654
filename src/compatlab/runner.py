"""Run one cell: venv, install, then every stage in order; write the result atomically."""

from __future__ import annotations

import datetime as dt
import logging
import secrets
import time
from pathlib import Path
from typing import Any

from compatlab import envs
from compatlab.cells import Cell, expand
from compatlab.config.matrix import Matrix
from compatlab.errors import LabError, UsageError
from compatlab.proc import run
from compatlab.runs.model import CellResult, StageResult, cell_state
from compatlab.runs.store import RunFolder
from compatlab.stages import GPU8, PIPELINE, CellContext, Stage

__all__ = ["GPU8", "PIPELINE", "find_cell", "new_run_id", "run_cell", "run_more_stages"]

log = logging.getLogger(__name__)


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def new_run_id() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(2)


def find_cell(matrix: Matrix, cell_id: str) -> Cell:
    cells = expand(matrix)
    for cell in cells:
        if cell.id == cell_id:
            return cell
    raise UsageError(f"{matrix.path}: no cell {cell_id!r}; `python -m compatlab cells` lists them")


def _install(matrix: Matrix, cell: Cell, venv: Path, spec_dir: Path) -> tuple[StageResult, dict[str, Any]]:
    start = time.monotonic()
    made = envs.create_venv(venv, python=matrix.install.python)
    if not made.ok:
        state, why = envs.classify_uv_failure(made)
        return (StageResult(name="install", state="error", reason="uv venv failed: " + why,
                            details={"argv": made.argv, "stderr": made.stderr[-4000:]},
                            seconds=time.monotonic() - start), {"argv": made.argv})
    python = envs.venv_python(venv)
    plan = envs.install_plan(matrix, cell, python=python, spec_dir=spec_dir)
    envs.write_plan_files(plan, spec_dir)
    done = run(plan.argv, timeout=matrix.install.timeout, env=envs.uv_env())
    record = plan.to_json()
    details: dict[str, Any] = {"argv": plan.argv, "stdout": done.stdout[-4000:], "stderr": done.stderr[-8000:],
                               "uv_seconds": round(done.seconds, 3)}
    if not done.ok:
        state, why = envs.classify_uv_failure(done)
        return (StageResult(name="install", state=state, reason=why, details=details,
                            seconds=time.monotonic() - start), record)
    return StageResult(name="install", state="pass", details=details, seconds=time.monotonic() - start), record


def _blocked(stage: Stage, install: StageResult) -> StageResult:
    word = "failed" if install.state == "fail" else "errored"
    return StageResult(name=stage.name, state="skip", reason=f"blocked: install {word}")


def run_cell(matrix: Matrix, cell: Cell, *, run: RunFolder, venv_root: Path,
             stages: tuple[Stage, ...] = PIPELINE) -> CellResult:
    """Run every stage of *cell* and write its result into *run*; never raises for a red cell.

    A result that cannot be written raises runs.store.UnsavedResult, which says where it was kept.
    """
    started, t0 = now_iso(), time.monotonic()
    expected = {"state": cell.expect, "reason": cell.expect_reason} if cell.expect and cell.na is None else None
    result = CellResult(id=cell.id, axes=cell.axes, state="n/a", expected=expected, started=started)
    if cell.na is not None:
        result.reason = cell.na
        result.finished = now_iso()
        run.write_cell(result)
        return result
    work = run.work_dir(cell.id)
    try:
        _run_stages(matrix, cell, result, work=work, venv=venv_root / cell.id, stages=stages)
    except Exception as exc:  # the lab's own failure: recorded as `error`, the cell's result still written
        log.exception("cell %s: lab error", cell.id)
        why = str(exc) if isinstance(exc, LabError) else repr(exc)
        result.stages.append(StageResult(name="lab", state="error", reason=f"lab error: {why}"))
    _conclude(result)
    result.finished = now_iso()
    result.seconds = round(time.monotonic() - t0, 3)
    run.write_cell(result)
    return result


def _run_stages(matrix: Matrix, cell: Cell, result: CellResult, *, work: Path, venv: Path,
                stages: tuple[Stage, ...]) -> None:
    attempts = 0
    while True:
        attempts += 1
        install, record = _install(matrix, cell, venv, work / "spec")
        if install.state != "error" or attempts > matrix.install.retries:
            break
        log.warning("%s: install errored (%s); retrying", cell.id, install.reason)
    install.details["attempts"] = attempts
    result.attempts = attempts
    result.install = record
    result.stages.append(install)
    if install.state == "pass":
        frozen = envs.freeze(envs.venv_python(venv))
        result.freeze = frozen.stdout.splitlines() if frozen.ok else []
        ctx = CellContext(matrix=matrix, cell=cell, venv=venv, python=envs.venv_python(venv),
                          site_packages=envs.site_packages(venv), work_dir=work, freeze=result.freeze,
                          previous=result.stages)
        for stage in stages:
            result.stages.append(_run_stage(stage, ctx))
    else:
        result.stages.extend(_blocked(s, install) for s in stages)


def _conclude(result: CellResult) -> None:
    result.state = cell_state(result.stages)
    result.reason = ""
    if result.state == "partial":
        bad = next((s for s in result.stages if s.state == "skip" and s.required), None)
    elif result.state in ("fail", "error"):
        bad = next((s for s in result.stages if s.state == result.state), None)
    else:
        bad = None
    if bad is not None:
        result.reason = f"{bad.name}: {bad.reason}"
    result.reason += _disagreement(result.stages)
    result.unexpected = is_unexpected(result)


def _disagreement(stages: list[StageResult]) -> str:
    """The static stage predicts what the import stage proves; when they differ, the reason says so."""
    by_name = {s.name: s for s in stages}
    static, imported = by_name.get("static"), by_name.get("import")
    if static is None or imported is None or {static.state, imported.state} != {"fail", "pass"}:
        return ""
    if static.state == "fail":
        return " [import disagrees: every module loaded]"
    return " [static disagrees: it predicted no load failure]"


def run_more_stages(matrix: Matrix, cell: Cell, *, run: RunFolder, venv_root: Path,
                    stages: tuple[Stage, ...]) -> CellResult:
    """Add *stages* to a cell of this run (the GPU stages after `nox -s matrix`), reusing its venv.

    Without an earlier result or venv the cell is run whole first, so the stages always have a stack.
    """
    venv = venv_root / cell.id
    earlier = run.read_cell(cell.id)
    if earlier is None or not envs.venv_python(venv).exists():
        return run_cell(matrix, cell, run=run, venv_root=venv_root, stages=PIPELINE + stages)
    result = earlier
    if result.state == "n/a":
        return result
    t0 = time.monotonic()
    names = {s.name for s in stages}
    result.stages = [s for s in result.stages if s.name not in names]
    install = next((s for s in result.stages if s.name == "install"), None)
    if install is None or install.state != "pass":
        result.stages.extend(StageResult(name=s.name, state="skip", reason="blocked: install did not pass")
                             for s in stages)
    else:
        ctx = CellContext(matrix=matrix, cell=cell, venv=venv, python=envs.venv_python(venv),
                          site_packages=envs.site_packages(venv), work_dir=run.work_dir(cell.id),
                          freeze=result.freeze, previous=result.stages)
        for stage in stages:
            result.stages.append(_run_stage(stage, ctx))
    _conclude(result)
    result.finished = now_iso()
    result.seconds = round(result.seconds + time.monotonic() - t0, 3)
    run.write_cell(result)
    return result


def _run_stage(stage: Stage, ctx: CellContext) -> StageResult:
    missing = [n for n in stage.needs if (st := ctx.stage(n)) is None or st.state not in ("pass", "warn")]
    if missing:
        return StageResult(name=stage.name, state="skip", reason="blocked: " + ", ".join(missing) + " did not pass")
    s0 = time.monotonic()
    try:
        sr = stage.run(ctx)
    except Exception as exc:  # a lab bug in one stage must not lose the cell: logged, the cell goes on
        log.exception("stage %s crashed", stage.name)
        sr = StageResult(name=stage.name, state="error", reason=f"lab error in stage {stage.name}: {exc!r}")
    if not sr.seconds:
        sr.seconds = round(time.monotonic() - s0, 3)
    return sr


def is_unexpected(result: CellResult) -> bool:
    """News for the nightly job: a red cell nobody expected, a known-bad cell that passed, or an error."""
    if result.state == "n/a":
        return False
    if result.state == "error":
        return True
    known_bad = bool(result.expected) and result.expected.get("state") == "fail"  # type: ignore[union-attr]
    if known_bad:
        return result.state in ("pass", "partial")
    return result.state == "fail"
