"""The NCCL suite: ranks come up, collectives give right answers, bandwidth is what the links carry.

One process per GPU, started the way PyTorch's own multi-GPU tests start them: a file-based rendezvous,
``init_process_group(..., device_id=...)`` so that init errors show at once, and a parent that watches the
ranks through their event files. A hang is a verdict: each phase has a hard timeout, after which the
parent asks every rank for its Python stack (faulthandler on SIGUSR1), kills every rank's process group,
and says which rank was stuck where. Without GPUs the same suite runs on the gloo backend.

This module has two halves. The parent (``run_nccl``, ``run_nccl_stage``, ``main``) runs in the lab. The
worker (``compatlab.incell.nccl_worker``) runs in a cell's venv with torch and the standard library only,
started as every in-cell program is (``proc.incell_command``), as is the probe of what torch sees
(``compatlab.incell.nccl_probe``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from compatlab.config.nccl import NcclThresholds, NcclTimeouts, nccl_thresholds
from compatlab.incell.nccl_worker import GIB, HOOK_ENV, OPS, NcclHook, human_bytes, parse_test_hook

# Importable from here before the worker moved out (tests import MIB); explicit re-exports for mypy.
from compatlab.incell.nccl_worker import MIB as MIB  # noqa: PLC0414
from compatlab.incell.nccl_worker import PHASES as PHASES  # noqa: PLC0414
from compatlab.proc import incell_command, tethered
from compatlab.runs.model import StageState
from compatlab.stages.nccl.model import NcclReport
from compatlab.stages.nccl.ranks import RankProcess, watch_ranks
from compatlab.stages.nccl.report import (
    algbw_gbps,
    bus_factor,
    busbw_gbps,
    collect_report,
    default_sizes,
    judge_report,
)

if TYPE_CHECKING:
    from compatlab.runs.model import StageResult
    from compatlab.stages.base import CellContext

__all__ = [
    "CHECK_COUNTS",
    "DTYPES",
    "HOOK_ENV",
    "OPS",
    "SAFETY_ENV",
    "NcclHook",
    "NcclReport",
    "NcclThresholds",
    "NcclTimeouts",
    "algbw_gbps",
    "bus_factor",
    "busbw_gbps",
    "default_sizes",
    "nccl_thresholds",
    "parse_size",
    "parse_test_hook",
    "probe",
    "report_lines",
    "run_nccl",
    "run_nccl_stage",
]

log = logging.getLogger(__name__)

DTYPES = ("float32", "bfloat16", "float16", "int32")
# Elements per rank: one, an odd count, and a large count that is not a power of two.
CHECK_COUNTS = (1, 1023, (1 << 20) + 3)
# NVLink multicast can take a shared host's GPUs out of service: it stays off in every child, whatever
# the caller's environment or the target's nccl-env say.
SAFETY_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
_RECORDED_PREFIXES = ("NCCL_", "TORCH_NCCL_", "TORCH_SYMM_MEM_", "NVSHMEM_", "GLOO_", "COMPATLAB_NCCL_")
_RECORDED_NAMES = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")


# Parent: running the ranks


def _child_env(env: Mapping[str, str], notes: list[str]) -> dict[str, str]:
    child = dict(env)
    for key, value in SAFETY_ENV.items():
        if child.get(key, value) != value:
            notes.append(f"{key}={child[key]} overridden to {value}: NVLink multicast stays off")
        child[key] = value
    return child


def _recorded_env(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in sorted(env.items()) if k.startswith(_RECORDED_PREFIXES) or k in _RECORDED_NAMES}


def _topo(backend: str) -> str | None:
    exe = shutil.which("nvidia-smi")
    if backend != "nccl" or exe is None:
        return None
    try:
        done = subprocess.run([exe, "topo", "-m"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"nvidia-smi topo -m failed: {exc}"
    text = done.stdout.strip() or done.stderr.strip()
    return re.sub(r"\x1b\[[0-9;]*m", "", text) or None  # nvidia-smi underlines its header


def _kill(ranks: Iterable[RankProcess]) -> None:
    for r in ranks:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(r.proc.pid, signal.SIGKILL)
    for r in ranks:
        try:
            r.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            log.warning("rank %d (pid %d) survived SIGKILL", r.rank, r.proc.pid)


def run_nccl(
    python: Path,
    *,
    world_size: int,
    backend: str,
    env: Mapping[str, str],
    timeouts: NcclTimeouts,
    sizes: Sequence[int],
    thresholds: NcclThresholds | None,
    work_dir: Path,
    test_hook: str | None = None,
    check_counts: Sequence[int] = CHECK_COUNTS,
    dtypes: Sequence[str] = DTYPES,
    ops: Sequence[str] = OPS,
    sweeps: int = 3,
    warmup: int = 5,
    iters: int = 20,
) -> NcclReport:
    """Run the suite with *world_size* ranks of *python* and judge it.

    *env* is the children's whole environment (a cell's, plus the target's nccl-env); the multicast
    switches of SAFETY_ENV are forced on top of it. *sizes* are the bandwidth sweep's buffer sizes in
    bytes (empty: no bandwidth phase). *test_hook* (or ``COMPATLAB_NCCL_TEST_HOOK`` in *env*) injects a
    fault. Never raises for what the ranks do: a crash, hang or wrong answer is in the report.
    """
    from compatlab.errors import UsageError

    if world_size < 1:
        raise UsageError(f"nccl: world size must be at least 1, got {world_size}")
    if backend not in ("nccl", "gloo"):
        raise UsageError(f"nccl: backend must be 'nccl' or 'gloo', got {backend!r}")
    if sweeps < 1 or iters < 1 or warmup < 0:
        raise UsageError(f"nccl: need sweeps >= 1, iters >= 1, warmup >= 0; got {sweeps}, {iters}, {warmup}")
    for name, values, known in (("op", ops, OPS), ("dtype", dtypes, DTYPES)):
        for v in values:
            if v not in known:
                raise UsageError(f"nccl: unknown {name} {v!r}; known: {', '.join(known)}")
    hook_text = test_hook if test_hook is not None else env.get(HOOK_ENV)
    hook = None
    if hook_text:
        try:
            hook = parse_test_hook(hook_text)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    start = time.monotonic()
    notes: list[str] = []
    child_env = _child_env(env, notes)
    child_env.pop(HOOK_ENV, None)
    if hook is not None:
        child_env[HOOK_ENV] = str(hook)
        notes.append(f"test hook active: {hook}")
    if world_size == 1 and sizes:
        notes.append(
            "one rank: busbw is 0 by definition (broadcast's is algbw), and in-place all_reduce "
            "and broadcast move no data, so these figures time launches, not links"
        )
    report = NcclReport(
        state=StageState.PASS,
        reason="",
        world_size=world_size,
        backend=backend,
        env=_recorded_env(child_env),
        topo=_topo(backend),
        notes=notes,
    )

    work_dir = Path(work_dir).resolve()
    work_dir.mkdir(parents=True, exist_ok=True)
    # torch reads the file:// init_method as a URL and mangles '+' (cell ids have local tags like
    # +cu130): the rendezvous file lives in a fresh folder with a plain name.
    rdzv_dir = Path(tempfile.mkdtemp(prefix="compatlab-rdzv-"))
    rendezvous = rdzv_dir / "rendezvous"
    for stale in [*work_dir.glob("rank*.events.jsonl"), *work_dir.glob("rank*.stack"), *work_dir.glob("rank*.log")]:
        stale.unlink(missing_ok=True)
    phases = ["init", "correctness"] + (["bandwidth"] if sizes else [])
    # The process group's own timeout stays out of the way: the parent's verdict, with stacks, comes first.
    pg_timeout = max(timeouts.phase(p) for p in phases) + 60
    cfg = {
        "world_size": world_size,
        "backend": backend,
        "init_method": rendezvous.as_uri(),
        "work_dir": str(work_dir),
        "phases": phases,
        "ops": list(ops),
        "dtypes": list(dtypes),
        "check_counts": [int(c) for c in check_counts],
        "sizes": [int(s) for s in sizes],
        "sweeps": sweeps,
        "warmup": warmup,
        "iters": iters,
        "hook": str(hook) if hook else None,
        "pg_timeout_s": pg_timeout,
        "deadline_s": sum(timeouts.phase(p) for p in phases) + 120,
    }
    config = work_dir / "config.json"
    config.write_text(json.dumps(cfg, indent=2), encoding="utf-8")

    ranks: list[RankProcess] = []
    try:
        for r in range(world_size):
            # The rank changes to work_dir itself (the command starts it in the folder it is imported from).
            command = incell_command(python, "nccl_worker", str(config), str(r))
            log.info("$ %s", shlex.join(command.argv))
            # Tethered (incell/tether.py): a cell killed outright takes its ranks along.
            command = tethered(command.argv, command.cwd)
            argv = command.argv
            logfile = work_dir / f"rank{r}.log"
            with logfile.open("wb") as out:
                proc = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=child_env,
                    cwd=command.cwd,
                    start_new_session=True,
                )
            ranks.append(
                RankProcess(
                    rank=r,
                    proc=proc,
                    events=work_dir / f"rank{r}.events.jsonl",
                    stack=work_dir / f"rank{r}.stack",
                    log=logfile,
                    since=time.monotonic(),
                )
            )
    except OSError as exc:
        _kill(ranks)
        shutil.rmtree(rdzv_dir, ignore_errors=True)
        report.state, report.reason = StageState.ERROR, f"cannot start rank {len(ranks)} with {python}: {exc}"
        report.seconds = time.monotonic() - start
        return report

    try:
        watch_ranks(ranks, timeouts, report)
    finally:
        _kill(ranks)
    shutil.rmtree(rdzv_dir, ignore_errors=True)
    for rank in ranks:
        rank.read(time.monotonic())
    report.ranks = [r.status() for r in ranks]
    dead = sorted((r for r in ranks if r.dead_at is not None), key=lambda r: (r.dead_at, r.error is not None, r.rank))
    if dead:
        # The first to go is the cause; ranks that raised afterwards mostly only noticed it.
        report.crash = {**(report.crash or {}), "dead": [r.rank for r in dead]}
    collect_report(
        ranks, report, ops=list(ops), dtypes=list(dtypes), counts=[int(c) for c in check_counts], sizes=sizes
    )
    judge_report(report, thresholds)
    report.seconds = time.monotonic() - start
    return report


# The stage and the command line


def probe(python: Path, env: Mapping[str, str]) -> dict[str, Any]:
    """What the interpreter's torch sees: GPUs and backends. Raises RuntimeError with its stderr."""
    from compatlab import proc

    command = incell_command(python, "nccl_probe")
    done = proc.run(command.argv, timeout=180, env=env, cwd=command.cwd)
    if not done.ok:
        tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        why = "timed out" if done.timed_out else tail
        raise RuntimeError(f"torch does not load in {python}: {why}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


class _StageStop(Exception):
    def __init__(self, state: StageState, reason: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(reason)
        self.state, self.reason, self.details = state, reason, details or {}


def _stage_report(ctx: CellContext) -> tuple[StageState, str, dict[str, Any]]:
    from compatlab.stages.base import cell_env

    targets = ctx.matrix.targets
    wanted = os.environ.get("COMPATLAB_TARGET")
    if wanted:
        target = next((t for t in targets if t.name == wanted), None)
        if target is None:
            known = ", ".join(t.name for t in targets) or "none"
            raise _StageStop(
                StageState.ERROR, f"COMPATLAB_TARGET={wanted!r} names no target of {ctx.matrix.path} ({known})"
            )
    else:
        target = targets[0] if targets else None
    thresholds = ctx.matrix.thresholds.nccl.for_target(target.name if target else None)
    env = cell_env(ctx.venv, dict(target.nccl_env) if target else None)
    try:
        seen = probe(ctx.python, env)
    except RuntimeError as exc:
        raise _StageStop(StageState.FAIL, str(exc)) from None
    work = ctx.work_dir / "nccl"
    if seen["gpus"] == 0 or not seen["nccl"]:
        why = "no GPU" if seen["gpus"] == 0 else "torch built without NCCL"
        report = run_nccl(
            ctx.python,
            world_size=2,
            backend="gloo",
            env=env,
            timeouts=NcclTimeouts(init=120, correctness=120, bandwidth=120),
            sizes=(64 << 10, MIB),
            thresholds=None,
            work_dir=work,
            check_counts=(1, 1023, 4099),
            warmup=1,
            iters=3,
        )
        details = {**report.details(), "skipped": f"{why}: nccl backend skipped, gloo ran"}
        if report.state == StageState.PASS:
            return StageState.SKIP, f"{why}: nccl backend skipped, gloo ran", details
        return report.state, f"{why}, gloo ran: {report.reason}", details
    want = target.gpus if target else int(seen["gpus"])
    world = min(want, int(seen["gpus"]))
    report = run_nccl(
        ctx.python,
        world_size=world,
        backend="nccl",
        env=env,
        timeouts=NcclTimeouts(),
        sizes=default_sizes(),
        thresholds=thresholds if world == want else None,
        work_dir=work,
    )
    if report.state == StageState.PASS and world < want:
        name = target.name if target else "?"
        reason = f"target {name} wants {want} GPUs, {world} visible: nccl passed on {world}, not judged"
        return StageState.SKIP, reason, report.details()
    return report.state, report.reason, report.details()


def run_nccl_stage(ctx: CellContext) -> StageResult:
    """Stage "nccl": the suite on the target's GPUs with the cell's torch, or gloo on CPUs without GPUs.

    The target is ``COMPATLAB_TARGET`` or the matrix's first; its ``gpus`` is the world size (every
    visible GPU without a target), its ``nccl-env`` goes to the ranks, and ``[thresholds.nccl]`` judges
    all_reduce's busbw. Without a GPU the stage is skipped (the cell is partial) after gloo ran.
    """
    from compatlab.errors import LabError
    from compatlab.runs.model import StageResult

    start = time.monotonic()
    try:
        state, reason, details = _stage_report(ctx)
    except _StageStop as stop:
        state, reason, details = stop.state, stop.reason, stop.details
    except LabError as exc:
        state, reason, details = StageState.ERROR, str(exc), {}
    return StageResult(
        name="nccl",
        state=state,
        reason=reason,
        details=details,
        seconds=time.monotonic() - start,
        required=True,
    )


def parse_size(text: str) -> int:
    """A message size on the command line: 1024, 64K, 1M, 1G."""
    m = re.fullmatch(r"(\d+)\s*([KMG]i?B?|B)?", text.strip(), re.IGNORECASE)
    if not m:
        raise argparse.ArgumentTypeError(f"expected a size like 1MiB or 1073741824, got {text!r}")
    unit = (m.group(2) or "B").upper()[0]
    return int(m.group(1)) * {"B": 1, "K": 1 << 10, "M": MIB, "G": GIB}[unit]


def report_lines(report: NcclReport) -> list[str]:
    """The report as lines for a terminal: verdict, environment, the busbw table per op, notes."""
    out: list[str] = []
    out.append(f"nccl suite: {report.state}: {report.reason}")
    out.append(
        f"  backend {report.backend}, world size {report.world_size}, torch {report.torch_version}, "
        f"nccl {report.nccl_version}, device {report.device}, init {report.init_seconds} s"
    )
    for op, table in report.sweep.items():
        out.append(f"  {op}:")
        out.append(f"    {'size':>10}  {'time us':>10}  {'algbw GB/s':>11}  {'busbw GB/s':>11}  busbw per sweep")
        for size, row in table.items():
            out.append(
                f"    {human_bytes(size):>10}  {row['time_us']:>10.1f}  {row['algbw_gbps']:>11.2f}  "
                f"{row['busbw_gbps']:>11.2f}  {row['busbw_gbps_sweeps']}"
            )
    for note in report.notes:
        out.append(f"  note: {note}")
    return out
