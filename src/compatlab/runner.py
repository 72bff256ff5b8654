"""Run one cell through the pipeline (install first) in a venv its run owns; write the result atomically."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import difflib
import logging
import os
import secrets
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import FrameType

from compatlab import envs, gpulease
from compatlab.cells import Cell, expand, planned
from compatlab.config.matrix import Matrix
from compatlab.config.serve import ServeConfig
from compatlab.config.thresholds import Thresholds
from compatlab.errors import UNWRITABLE, Unwritable, UsageError, lab_error
from compatlab.existing import Environment, existing_cell
from compatlab.reporter import Reporter
from compatlab.runs import store
from compatlab.runs.model import PREFLIGHT, CellResult, CellState, Expectation, InstallRecord, StageResult, StageState
from compatlab.runs.records.install import InstallDetails
from compatlab.runs.store import RunFolder, now_iso
from compatlab.runs.verdict import is_unexpected, verdict
from compatlab.stages import GPU8, PIPELINE, CellContext, Installed, Stage, blame, install
from compatlab.stages.base import blocked
from compatlab.stages.runtime import observed
from compatlab.venvs import cell_venv, own_venv

__all__ = [
    "DEFAULT_STAGE_SECONDS",
    "GPU8",
    "PIPELINE",
    "STAGE_SECONDS",
    "ExistingRequest",
    "StageTimeout",
    "conclude",
    "existing_context",
    "existing_matrix",
    "existing_stage_names",
    "existing_stages",
    "find_cell",
    "new_run_id",
    "run_cell",
    "run_existing",
    "run_more_stages",
    "run_pipeline",
    "select_stages",
]

log = logging.getLogger(__name__)

# A wall-clock limit for each stage, in seconds. The stages bound each of their subprocesses themselves
# (install's timeout, each module load's, the suites'); this bounds the stage as a whole, and above all
# what runs in the lab's own process: the static stage reads strangers' files (each one within 30 s).
STAGE_SECONDS: dict[str, float] = {"pins": 300.0, "static": 1800.0}
DEFAULT_STAGE_SECONDS = 4 * 3600.0


class StageTimeout(BaseException):
    """A stage ran past its deadline. A BaseException, so that no ``except Exception`` inside the stage
    swallows it; each ``run`` on the way out kills its process group, as on Ctrl-C."""


@contextlib.contextmanager
def _deadline(seconds: float, name: str) -> Iterator[None]:
    """Raise StageTimeout in the main thread after *seconds* (SIGALRM); elsewhere, no deadline."""
    if threading.current_thread() is not threading.main_thread() or seconds <= 0:
        yield
        return

    def expired(_signum: int, _frame: FrameType | None) -> None:
        raise StageTimeout(f"the {name} stage ran past its {seconds:g} s deadline")

    previous = signal.signal(signal.SIGALRM, expired)
    outer, _interval = signal.setitimer(signal.ITIMER_REAL, seconds)
    started = time.monotonic()
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer:  # an alarm someone set before this stage (a caller's own deadline) still goes off
            signal.setitimer(signal.ITIMER_REAL, max(0.001, outer - (time.monotonic() - started)))


def new_run_id() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(2)


def find_cell(matrix: Matrix, cell_id: str) -> Cell:
    cells = expand(matrix)
    for cell in cells:
        if cell.id == cell_id:
            return cell
    raise UsageError(f"{matrix.path}: no cell {cell_id!r}; `compatlab cells` lists them")


def select_stages(
    stages: tuple[Stage, ...], *, until: str | None = None, only: tuple[str, ...] = ()
) -> tuple[tuple[Stage, ...], tuple[Stage, ...]]:
    """(the stages to run, the ones a preflight leaves out): ``until`` stops after that stage, ``only``
    keeps those named. Unknown names are a UsageError listing the pipeline's stages."""
    names = [s.name for s in stages]
    for name in (*([until] if until else []), *only):
        if name not in names:
            close = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
            hint = f"; perhaps you meant {close[0]!r}?" if close else ""
            raise UsageError(f"no stage {name!r}; the pipeline is {', '.join(names)}{hint}")
    keep = names[: names.index(until) + 1] if until else names
    if only:
        keep = [n for n in keep if n in only]
    return tuple(s for s in stages if s.name in keep), tuple(s for s in stages if s.name not in keep)


# An existing environment (compatlab check): the same stages, through the same loop.


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class ExistingRequest:
    """What ``compatlab check`` (and each environment ``compatlab rehearse`` judges) asks of an existing
    environment: built once from the command line (cli/check.py), passed whole."""

    packages: tuple[str, ...] = ()  # the distributions to check; () every one with native code
    pins: dict[str, str] | None = None  # NAME -> VERSION the environment should have
    archs: tuple[str, ...] = ()  # GPU archs its kernels must cover
    min_driver: str | None = None  # the oldest NVIDIA driver it must run on
    nccl: bool = False  # also the NCCL suite
    gpus: int = 0  # the GPUs present
    only: tuple[str, ...] = ()  # only these stages; () every one
    serve: ServeConfig | None = None  # the [serve] table to serve; None the built-in one
    thresholds: Thresholds | None = None  # the suites' time limits; None the defaults


def existing_stages(env: Environment, *, nccl: bool = False, only: Sequence[str] = ()) -> tuple[Stage, ...]:
    """The matrix's stages without ``install`` (its need dropped: the environment is there), nccl if asked;
    only those named in *only* when it is given."""
    chosen = [s for s in PIPELINE if s.name != "install"]
    if nccl or "nccl" in only:
        chosen += [s for s in GPU8 if s.name == "nccl"]
    if only:
        chosen = [s for s in chosen if s.name in only]
    return tuple(dataclasses.replace(s, needs=tuple(n for n in s.needs if n != "install")) for s in chosen)


def existing_stage_names(*, nccl: bool = True) -> tuple[str, ...]:
    """The stages ``compatlab check --stage`` may name: the pipeline's, read when asked (nccl with *nccl*)."""
    return tuple(s.name for s in PIPELINE if s.name != "install") + (
        tuple(s.name for s in GPU8 if s.name == "nccl") if nccl else ()
    )


def existing_matrix(env: Environment, request: ExistingRequest) -> tuple[Matrix, Cell]:
    """*env* as a one-cell matrix (``existing.existing_cell``), with the ``[serve]`` and suite limits asked for."""
    matrix, cell = existing_cell(
        env,
        packages=request.packages,
        pins=request.pins,
        archs=request.archs,
        min_driver=request.min_driver,
        gpus=request.gpus,
    )
    if request.serve is not None:
        matrix = dataclasses.replace(matrix, serve=request.serve)
    if request.thresholds is not None:
        matrix = dataclasses.replace(matrix, thresholds=request.thresholds)
    return matrix, cell


def existing_context(
    env: Environment, matrix: Matrix, cell: Cell, *, work_dir: Path, reporter: Reporter | None = None
) -> CellContext:
    """The context of *env*'s one cell (``existing_matrix``): nothing to install, the stack as it is."""
    work_dir.mkdir(parents=True, exist_ok=True)
    return CellContext(
        matrix=matrix,
        cell=cell,
        venv=env.prefix,
        python=env.python,
        work_dir=work_dir,
        site_packages=env.site_for([v.package for v in cell.packages if v.package]),
        install=InstallRecord(existing=str(env.prefix), python=str(env.python)),
        say=_say(reporter),
        tools_overlay=not env.has_pytest,  # inspect_environment asked it once already
    )


def run_existing(
    env: Environment, request: ExistingRequest, *, run_dir: Path, reporter: Reporter | None = None
) -> tuple[CellContext, CellResult]:
    """Run the stages of ``existing_stages`` on *env* through ``run_pipeline``, into the run folder *run_dir*
    (``runs/<run-id>/`` as for a matrix run: the cell's work files in ``cells/<id>/``, its results.json)."""
    started = now_iso()
    stages = existing_stages(env, nccl=request.nccl, only=request.only)
    from compatlab.host import host_facts

    matrix, cell = existing_matrix(env, request)
    with store.claim_run(run_dir, run_id=run_dir.name, plan=planned(matrix), host=host_facts) as run:
        ctx = existing_context(env, matrix, cell, work_dir=run.work_dir(cell.id), reporter=reporter)
        t0 = time.monotonic()
        ctx = run_pipeline(ctx, stages, reporter=reporter)
        # The grid shows the environment's axes, not every package it pins.
        axes = {a.name: a.values[0].version for a in matrix.axes}
        result = conclude(ctx, expected=None, started=started, seconds=round(time.monotonic() - t0, 3), axes=axes)
        run.write_cell(result)
        run.finish(planned(matrix), latest=None)
    return ctx, result


def _say(reporter: Reporter | None) -> Callable[[str], None] | None:
    """The cell's ``say``: the reporter's notes, None for a quiet face (the stages log instead)."""
    return None if reporter is None or reporter.quiet else reporter.note


def run_cell(
    matrix: Matrix,
    cell: Cell,
    *,
    run: RunFolder,
    venv_root: Path,
    stages: tuple[Stage, ...] = PIPELINE,
    left_out: tuple[Stage, ...] = (),
    reporter: Reporter | None = None,
) -> CellResult:
    """Run *cell* through *stages* and write its result into *run*; never raises for a red cell.

    A result that cannot be written raises runs.store.UnsavedResult, which says where it was kept. A signal
    (SIGINT, SIGTERM, SIGHUP: KeyboardInterrupt) propagates: the cell's processes are killed and waited for
    on the way out, and nothing is written for the interrupted cell.
    """
    started, t0 = now_iso(), time.monotonic()
    expected = (
        Expectation(state=CellState(cell.expect), reason=cell.expect_reason or "")
        if cell.expect and cell.na is None
        else None
    )
    if cell.na is not None:
        result = CellResult(
            id=cell.id,
            axes=cell.axes,
            state=CellState.NA,
            reason=cell.na,
            started=started,
            finished=now_iso(),
        )
        run.write_cell(result)
        return result
    work = run.work_dir(cell.id)
    with own_venv(venv_root, run.id, cell) as venv:
        ctx = CellContext(
            matrix=matrix,
            cell=cell,
            venv=venv,
            python=envs.venv_python(venv),
            work_dir=work,
            say=_say(reporter),
            caches=venv_root,
        )
        ctx = run_pipeline(ctx, stages, left_out=left_out, reporter=reporter)
    result = conclude(ctx, expected=expected, started=started, seconds=round(time.monotonic() - t0, 3))
    run.write_cell(result)
    return result


def run_more_stages(
    matrix: Matrix,
    cell: Cell,
    *,
    run: RunFolder,
    venv_root: Path,
    stages: tuple[Stage, ...],
    reporter: Reporter | None = None,
) -> CellResult:
    """Add *stages* to a cell of this run (the GPU stages after `nox -s matrix`), reusing its venv.

    Without an earlier result or a complete venv the cell is run whole first, so the stages always have
    a stack.
    """
    earlier = run.read_cell(cell.id)
    venv = cell_venv(venv_root, run.id, cell)
    if earlier is None or earlier.unreadable or not install.is_complete(venv):
        again = {s.name for s in stages}  # serve is in both: it runs once, after the matrix's other stages
        return run_cell(
            matrix,
            cell,
            run=run,
            venv_root=venv_root,
            stages=tuple(s for s in PIPELINE if s.name not in again) + stages,
            reporter=reporter,
        )
    if earlier.state == CellState.NA:
        return earlier
    t0 = time.monotonic()
    names = {s.name for s in stages}
    with own_venv(venv_root, run.id, cell) as venv:
        ctx = CellContext(
            matrix=matrix,
            cell=cell,
            venv=venv,
            python=envs.venv_python(venv),
            work_dir=run.work_dir(cell.id),
            site_packages=envs.site_packages(venv),
            freeze=earlier.freeze,
            install=earlier.install,
            previous=tuple(s for s in earlier.stages if s.name not in names),
            say=_say(reporter),
            caches=venv_root,
        )
        ctx = run_pipeline(ctx, stages, reporter=reporter)
    result = conclude(
        ctx,
        expected=earlier.expected,
        started=earlier.started,
        seconds=round(earlier.seconds + time.monotonic() - t0, 3),
        attempts=earlier.attempts,
    )
    run.write_cell(result)
    return result


def run_pipeline(
    ctx: CellContext,
    stages: tuple[Stage, ...],
    *,
    left_out: tuple[Stage, ...] = (),
    reporter: Reporter | None = None,
) -> CellContext:
    """The one loop of `nox -s matrix`, `nox -s gpu8_perf` and `compatlab check`: every stage in order, each
    result added to the ``previous`` of the next stage's context (with what the install stage made); the
    context after the last is returned, for ``conclude``.

    A stage whose needs did not pass is skipped as blocked; a lab failure inside the loop becomes an
    ``error`` stage, and the cell's result is still written.
    """
    try:
        for stage in stages:
            sr, ctx = _run_stage(stage, ctx)
            ctx = dataclasses.replace(ctx, previous=(*ctx.previous, sr))
            if reporter is not None:
                reporter.stage_done(sr)
        if left_out:
            # A preflight: the cell is partial, and says which stages it did not run.
            last = stages[-1].name if stages else "nothing"
            skipped = tuple(
                StageResult(
                    name=s.name,
                    state=StageState.SKIP,
                    required=True,
                    reason=f"{PREFLIGHT} {last}",
                )
                for s in left_out
            )
            ctx = dataclasses.replace(ctx, previous=(*ctx.previous, *skipped))
    except Exception as exc:  # the lab's own failure: recorded as `error`, the cell's result still written
        log.exception("cell %s: lab error", ctx.cell.id)
        lab = StageResult(name="lab", state=StageState.ERROR, reason=lab_error(exc))
        ctx = dataclasses.replace(ctx, previous=(*ctx.previous, lab))
    return ctx


def conclude(
    ctx: CellContext,
    *,
    expected: Expectation | None,
    started: str,
    seconds: float,
    attempts: int | None = None,
    axes: dict[str, str] | None = None,
) -> CellResult:
    """The cell's result, built once from its context after its stages ran; *axes* replaces the cell's own
    (an existing environment's grid shows its axes, not every package it pins)."""
    stages = tuple(blame.with_cause(s) for s in observed(ctx.previous))
    state, reason, bad = verdict(stages)
    causes = blame.blames(stages) if state == CellState.FAIL else ()
    if len(causes) > 1:
        reason = (
            f"{len(causes)} causes: {reason}; also "
            + "; also ".join(f"{b.stage}: {b.reason}" for b in causes[1:3])
            + (f" (and {len(causes) - 3} more)" if len(causes) > 3 else "")
        )
    inst = ctx.stage("install")
    if inst is not None:
        attempts = InstallDetails.of(inst).attempts or 1
    return CellResult(
        id=ctx.cell.id,
        axes=ctx.cell.axes if axes is None else axes,
        state=state,
        expected=expected,
        unexpected=is_unexpected(state, expected, preflight=any(s.reason.startswith(PREFLIGHT) for s in stages)),
        stages=stages,
        install=ctx.install,
        freeze=ctx.freeze,
        started=started,
        finished=now_iso(),
        seconds=seconds,
        attempts=attempts or 1,
        reason=reason,
        causes=causes,
        culprit=bad.name if bad is not None else "",
    )


WORK_FIX = "the cell's work folder must be writable: fix it, or write the run elsewhere (COMPATLAB_REPORTS, --run-dir)"


def _run_stage(stage: Stage, ctx: CellContext) -> tuple[StageResult, CellContext]:
    """*stage*'s result, and the context of the stages after it: *ctx* with what an install made."""
    skipped = blocked(stage, ctx)
    if skipped is not None:
        return dataclasses.replace(skipped, required=stage.required), ctx
    s0 = time.monotonic()
    held: gpulease.Lease | None = None
    after = ctx
    try:
        with _gpus(stage, ctx) as held, _deadline(STAGE_SECONDS.get(stage.name, DEFAULT_STAGE_SECONDS), stage.name):
            out = stage.run(ctx)
        if isinstance(out, Installed):
            sr, after = out.result, out.after(ctx)
        else:
            sr = out
    except StageTimeout as exc:  # the question is unanswered: an error, never a verdict on the stack
        log.error("cell %s: %s", ctx.cell.id, exc)
        sr = StageResult(name=stage.name, state=StageState.ERROR, reason=str(exc))
    except Unwritable as exc:  # a file of the stage's own (runs/atomic.py): the infrastructure, in one line
        said = exc.fixed(WORK_FIX)
        log.debug("cell %s: the %s stage: %s", ctx.cell.id, stage.name, said)  # the cell's end line says it
        sr = StageResult(name=stage.name, state=StageState.ERROR, reason=str(said))
    except OSError as exc:
        if exc.errno not in UNWRITABLE or not exc.filename:
            log.exception("stage %s crashed", stage.name)
            sr = StageResult(name=stage.name, state=StageState.ERROR, reason=f"lab error: {exc!r}")
        else:  # the stage's work folder (or a file in it) cannot be written: the infrastructure, said in one line
            said = Unwritable(exc.filename, exc.strerror or str(exc), WORK_FIX)
            log.debug("cell %s: the %s stage: %s", ctx.cell.id, stage.name, said)  # the cell's end line says it
            sr = StageResult(name=stage.name, state=StageState.ERROR, reason=str(said))
    except Exception as exc:  # a lab bug in one stage must not lose the cell: logged, the cell goes on
        log.exception("stage %s crashed", stage.name)
        sr = StageResult(name=stage.name, state=StageState.ERROR, reason=lab_error(exc))
    if not sr.seconds:
        sr = dataclasses.replace(sr, seconds=round(time.monotonic() - s0, 3))
    if held is not None and held.gpus:
        sr = dataclasses.replace(
            sr, details={**sr.details, "gpu_lease": {"gpus": list(held.gpus), "waited_s": held.waited_s}}
        )
    return sr, after


@contextlib.contextmanager
def _gpus(stage: Stage, ctx: CellContext) -> Iterator[gpulease.Lease | None]:
    """A GPU stage's lease (gpulease.py), with CUDA_VISIBLE_DEVICES its GPUs while it runs; None for the rest."""
    need = gpulease.GPU_STAGES.get(stage.name)
    if need is None:
        yield None
        return
    total = gpulease.gpu_count()
    if need == "all":
        count = total
    elif need == "tp":
        count = ctx.matrix.serve.tp_size(t.gpus for t in ctx.matrix.targets)
    else:
        count = int(need)
    with gpulease.lease(count, f"cell {ctx.cell.id} {stage.name}", total=total, say=ctx.say) as held:
        before = os.environ.get("CUDA_VISIBLE_DEVICES")
        if held.gpus:
            os.environ["CUDA_VISIBLE_DEVICES"] = held.visible
        try:
            yield held
        finally:
            if held.gpus:
                if before is None:
                    os.environ.pop("CUDA_VISIBLE_DEVICES", None)
                else:
                    os.environ["CUDA_VISIBLE_DEVICES"] = before
