"""Run one cell through the pipeline (install first) in a venv its run owns; write the result atomically."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import difflib
import fcntl
import logging
import os
import secrets
import shutil
import signal
import tempfile
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
from compatlab.errors import UNWRITABLE, LabError, Unwritable, UsageError
from compatlab.existing import Environment, existing_cell
from compatlab.runs import store
from compatlab.runs.model import (
    PREFLIGHT,
    CellResult,
    CellState,
    Expectation,
    InstallRecord,
    StageResult,
    StageState,
    cell_state,
)
from compatlab.runs.records.common import Notes
from compatlab.runs.records.install import InstallDetails
from compatlab.runs.records.suite import SuiteDetails
from compatlab.runs.store import RunFolder
from compatlab.stages import GPU8, PIPELINE, CellContext, Stage, blame, install
from compatlab.stages.base import blocked
from compatlab.stages.runtime import observed

__all__ = [
    "DEFAULT_STAGE_SECONDS",
    "GPU8",
    "PIPELINE",
    "STAGE_SECONDS",
    "StageTimeout",
    "amber_reason",
    "cell_venv",
    "conclude",
    "existing_context",
    "existing_matrix",
    "existing_stages",
    "find_cell",
    "new_run_id",
    "own_venv",
    "run_cell",
    "run_existing",
    "run_more_stages",
    "run_pipeline",
    "select_stages",
    "verdict",
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


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def new_run_id() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(2)


def find_cell(matrix: Matrix, cell_id: str) -> Cell:
    cells = expand(matrix)
    for cell in cells:
        if cell.id == cell_id:
            return cell
    raise UsageError(f"{matrix.path}: no cell {cell_id!r}; `compatlab cells` lists them")


def cell_venv(venv_root: Path, run_id: str, cell: Cell) -> Path:
    """The cell's venv, owned by its run: two runs at once never share one."""
    return venv_root / run_id / cell.id


# Venvs of earlier runs wait here to be removed: a rename on the venvs' own filesystem is instant, the removal
# (tens of thousands of hard links for a torch stack: 9-27 s) runs beside the cell's stages.
TRASH = ".trash"


@contextlib.contextmanager
def own_venv(venv_root: Path, run_id: str, cell: Cell) -> Iterator[Path]:
    """Hold the cell's venv of this run, and drop the same cell's venvs of runs that no longer hold theirs.

    The lock (flock on ``<venv>.lock``) is held while the cell's stages run. Another run's venv of this
    cell is set aside (renamed into ``<venvs>/.trash/``) only when its lock can be taken, so a concurrent
    run keeps its own; a thread removes what is set aside while the stages run, and the cell waits for it
    at its end. The disk holds about one venv per cell, and `nox -s gpu8_perf` finds the latest run's venvs.
    """
    venv = cell_venv(venv_root, run_id, cell)
    try:
        venv.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=venv.parent, prefix=".compatlab-write-"):
            pass  # a folder that is there but read-only passes mkdir; the venv and its lock file need a write
    except OSError as exc:
        raise Unwritable(
            exc.filename or venv.parent,
            exc.strerror or str(exc),
            f"make {venv_root} writable, or keep the venvs elsewhere (COMPATLAB_VENVS for nox, --venvs)",
        ) from None
    with _flock(venv.with_name(venv.name + ".lock"), wait=True):
        for other in sorted(venv_root.glob(f"*/{cell.id}")):
            if other == venv or not other.is_dir():
                continue
            with _flock(other.with_name(other.name + ".lock"), wait=False) as got:
                if got:
                    _set_aside(other, venv_root / TRASH)
        sweeper = threading.Thread(target=_sweep, args=(venv_root / TRASH,), name="old-venvs", daemon=True)
        sweeper.start()
        try:
            yield venv
        except BaseException:
            raise  # interrupted: what is left in .trash goes with the next cell
        else:
            sweeper.join()


def _set_aside(old: Path, trash: Path) -> None:
    trash.mkdir(exist_ok=True)
    try:
        old.rename(trash / f"{old.parent.name}-{old.name}-{secrets.token_hex(4)}")
    except OSError:
        shutil.rmtree(old, ignore_errors=True)  # cannot be renamed (another filesystem): removed here


def _sweep(trash: Path) -> None:
    """Remove everything set aside, this cell's and what an interrupted cell left."""
    if trash.is_dir():
        for entry in trash.iterdir():
            shutil.rmtree(entry, ignore_errors=True)


@contextlib.contextmanager
def _flock(path: Path, *, wait: bool) -> Iterator[bool]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


Progress = Callable[[StageResult], None]


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


def existing_stages(env: Environment, *, nccl: bool = False, only: Sequence[str] = ()) -> tuple[Stage, ...]:
    """The matrix's stages without ``install`` (its need dropped: the environment is there), nccl if asked;
    only those named in *only* when it is given."""
    chosen = [s for s in PIPELINE if s.name != "install"]
    if nccl or "nccl" in only:
        chosen += [s for s in GPU8 if s.name == "nccl"]
    if only:
        chosen = [s for s in chosen if s.name in only]
    return tuple(dataclasses.replace(s, needs=tuple(n for n in s.needs if n != "install")) for s in chosen)


def existing_matrix(
    env: Environment,
    *,
    packages: Sequence[str] = (),
    pins: dict[str, str] | None = None,
    archs: Sequence[str] = (),
    min_driver: str | None = None,
    gpus: int = 0,
    serve: ServeConfig | None = None,
    thresholds: Thresholds | None = None,
) -> tuple[Matrix, Cell]:
    """*env* as a one-cell matrix (``existing.existing_cell``), with the ``[serve]`` and suite limits asked for."""
    matrix, cell = existing_cell(env, packages=packages, pins=pins, archs=archs, min_driver=min_driver, gpus=gpus)
    if serve is not None:
        matrix = dataclasses.replace(matrix, serve=serve)
    if thresholds is not None:
        matrix = dataclasses.replace(matrix, thresholds=thresholds)
    return matrix, cell


def existing_context(
    env: Environment, matrix: Matrix, cell: Cell, *, work_dir: Path, say: Callable[[str], None] | None = None
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
        say=say,
        tools_overlay=not env.has_pytest,  # inspect_environment asked it once already
    )


def run_existing(
    env: Environment,
    *,
    run_dir: Path,
    packages: Sequence[str] = (),
    pins: dict[str, str] | None = None,
    archs: Sequence[str] = (),
    min_driver: str | None = None,
    nccl: bool = False,
    gpus: int = 0,
    on_stage: Callable[[StageResult], None] | None = None,
    only: Sequence[str] = (),
    serve: ServeConfig | None = None,
    thresholds: Thresholds | None = None,
    say: Callable[[str], None] | None = None,
) -> tuple[CellContext, CellResult]:
    """Run the stages of ``existing_stages`` on *env* through ``run_pipeline``, into the run folder *run_dir*
    (``runs/<run-id>/`` as for a matrix run: the cell's work files in ``cells/<id>/``, its results.json)."""
    started = now_iso()
    stages = existing_stages(env, nccl=nccl, only=only)
    if on_stage is not None:
        stages = tuple(dataclasses.replace(s, run=_reporting(s.run, on_stage)) for s in stages)
    from compatlab.host import host_facts

    matrix, cell = existing_matrix(
        env,
        packages=packages,
        pins=pins,
        archs=archs,
        min_driver=min_driver,
        gpus=gpus,
        serve=serve,
        thresholds=thresholds,
    )
    with store.claim_run(run_dir, run_id=run_dir.name, plan=planned(matrix), host=host_facts) as run:
        ctx = existing_context(env, matrix, cell, work_dir=run.work_dir(cell.id), say=say)
        t0 = time.monotonic()
        run_pipeline(ctx, stages)
        # The grid shows the environment's axes, not every package it pins.
        axes = {a.name: a.values[0].version for a in matrix.axes}
        result = conclude(ctx, expected=None, started=started, seconds=round(time.monotonic() - t0, 3), axes=axes)
        run.write_cell(result)
        run.finish(planned(matrix), latest=None)
    return ctx, result


def _reporting(
    run: Callable[[CellContext], StageResult], told: Callable[[StageResult], None]
) -> Callable[[CellContext], StageResult]:
    def wrapped(ctx: CellContext) -> StageResult:
        out = run(ctx)
        told(out)
        return out

    return wrapped


def run_cell(
    matrix: Matrix,
    cell: Cell,
    *,
    run: RunFolder,
    venv_root: Path,
    stages: tuple[Stage, ...] = PIPELINE,
    left_out: tuple[Stage, ...] = (),
    progress: Progress | None = None,
    say: Callable[[str], None] | None = None,
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
            say=say,
            caches=venv_root,
        )
        run_pipeline(ctx, stages, left_out=left_out, progress=progress)
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
    progress: Progress | None = None,
    say: Callable[[str], None] | None = None,
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
            progress=progress,
            say=say,
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
            say=say,
            caches=venv_root,
        )
        run_pipeline(ctx, stages, progress=progress)
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
    progress: Progress | None = None,
) -> None:
    """The one loop of `nox -s matrix`, `nox -s gpu8_perf` and `compatlab check`: every stage in order,
    each result added to ``ctx.previous``, where the next stage reads it.

    A stage whose needs did not pass is skipped as blocked; a lab failure inside the loop becomes an
    ``error`` stage, and the cell's result is still written.
    """
    try:
        for stage in stages:
            ctx.previous = (*ctx.previous, _run_stage(stage, ctx))
            if progress is not None:
                progress(ctx.previous[-1])
        if left_out:
            # A preflight: the cell is partial, and says which stages it did not run.
            last = stages[-1].name if stages else "nothing"
            ctx.previous += tuple(
                StageResult(
                    name=s.name,
                    state=StageState.SKIP,
                    required=True,
                    reason=f"{PREFLIGHT} {last}",
                )
                for s in left_out
            )
    except Exception as exc:  # the lab's own failure: recorded as `error`, the cell's result still written
        log.exception("cell %s: lab error", ctx.cell.id)
        why = str(exc) if isinstance(exc, LabError) else repr(exc)
        ctx.previous += (StageResult(name="lab", state=StageState.ERROR, reason=f"lab error: {why}"),)


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
    state, reason = verdict(stages)
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
    )


def verdict(stages: tuple[StageResult, ...]) -> tuple[CellState, str]:
    """The cell's state from its stages, and its reason: the first stage that decided it, and where the static
    stage's prediction and the import stage's proof differ, that they do."""
    state = cell_state(stages)
    if state == CellState.PARTIAL:
        return state, amber_reason(stages)
    bad: StageResult | None = None
    if state in (CellState.FAIL, CellState.ERROR):
        bad = next((s for s in stages if s.state.value == state.value), None)
    reason = f"{bad.name}: {bad.reason}" if bad is not None else ""
    return state, reason + _disagreement(stages)


def amber_reason(stages: Sequence[StageResult]) -> str:
    """A partial cell's reason: what it proved (the stages that ran, with the import stage's count and the
    warnings) and what did not run here and why, so that two amber cells read alike only when they are:
    ``ran install, pins, static, import (412/412 modules load; 3 warnings); not run here: cuda, serve — no
    NVIDIA driver on this machine (no libcuda.so.1)``."""
    ran: list[str] = []
    warnings = 0
    for s in stages:
        if s.state not in (StageState.PASS, StageState.WARN):
            continue
        ran.append(s.name)
        warnings += len(Notes.of(s).warnings) if s.state == StageState.WARN else 0
        counted = SuiteDetails.of(s) if s.name == "import" else None
        if counted is not None and counted.loaded is not None and counted.total is not None:
            ran[-1] += f" ({counted.loaded}/{counted.total} modules load)"
    groups: list[tuple[list[str], str]] = []
    for s in stages:
        if s.state != StageState.SKIP or not s.required:
            continue
        if groups and s.reason.startswith("blocked: "):
            groups[-1][0].append(s.name)  # blocked by what the group before says
        elif groups and s.reason == groups[-1][1]:
            groups[-1][0].append(s.name)
        else:
            groups.append(([s.name], s.reason))
    proved = "ran " + ", ".join(ran) if ran else "nothing ran"
    if warnings:
        proved += f"; {warnings} warning{'s' if warnings != 1 else ''}"
    missing = "; ".join(f"{', '.join(names)} — {why.removeprefix('not run: ')}" for names, why in groups)
    return f"{proved}; not run here: {missing}" if missing else proved


_LINK_CAUSES = ("abi-symbol", "torch-abi", "python-abi", "symbol-version", "missing-library", "")


def _disagreement(stages: tuple[StageResult, ...]) -> str:
    """The static stage predicts what the import stage proves; when they differ, the reason says so."""
    by_name = {s.name: s for s in stages}
    static, imported = by_name.get("static"), by_name.get("import")
    if static is None or imported is None or {static.state, imported.state} != {StageState.FAIL, StageState.PASS}:
        return ""
    if imported.state == StageState.FAIL and imported.cause not in _LINK_CAUSES:
        return ""  # an exception of Python code, which static never reads: no prediction to disagree with
    if static.state == StageState.FAIL:
        return " [import disagrees: every module loaded]"
    return " [static disagrees: it predicted no load failure]"


WORK_FIX = "the cell's work folder must be writable: fix it, or write the run elsewhere (COMPATLAB_REPORTS, --run-dir)"


def _run_stage(stage: Stage, ctx: CellContext) -> StageResult:
    skipped = blocked(stage, ctx)
    if skipped is not None:
        return dataclasses.replace(skipped, required=stage.required)
    s0 = time.monotonic()
    held: gpulease.Lease | None = None
    try:
        with _gpus(stage, ctx) as held, _deadline(STAGE_SECONDS.get(stage.name, DEFAULT_STAGE_SECONDS), stage.name):
            sr = stage.run(ctx)
    except StageTimeout as exc:  # the question is unanswered: an error, never a verdict on the stack
        log.error("cell %s: %s", ctx.cell.id, exc)
        sr = StageResult(name=stage.name, state=StageState.ERROR, reason=str(exc))
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
        why = str(exc) if isinstance(exc, LabError) else repr(exc)
        sr = StageResult(name=stage.name, state=StageState.ERROR, reason=f"lab error: {why}")
    if not sr.seconds:
        sr = dataclasses.replace(sr, seconds=round(time.monotonic() - s0, 3))
    if held is not None and held.gpus:
        sr = dataclasses.replace(
            sr, details={**sr.details, "gpu_lease": {"gpus": list(held.gpus), "waited_s": held.waited_s}}
        )
    return sr


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


def is_unexpected(state: CellState, expected: Expectation | None, *, preflight: bool = False) -> bool:
    """News for the nightly job: a red cell nobody expected, a known-bad cell that passed, or an error. A
    preflight judges only the stages it ran: a known-bad cell it left partial was not reached, no news."""
    if state == CellState.NA:
        return False
    if state == CellState.ERROR:
        return True
    if expected is not None and expected.state == CellState.FAIL:
        return state == CellState.PASS or (state == CellState.PARTIAL and not preflight)
    return state == CellState.FAIL
