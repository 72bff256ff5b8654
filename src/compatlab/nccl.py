"""The NCCL suite: ranks come up, collectives give right answers, bandwidth is what the links carry.

One process per GPU, started the way PyTorch's own multi-GPU tests start them: a file-based rendezvous,
``init_process_group(..., device_id=...)`` so that init errors show at once, and a parent that watches the
ranks through their event files. A hang is a verdict: each phase has a hard timeout, after which the
parent asks every rank for its Python stack (faulthandler on SIGUSR1), kills every rank's process group,
and says which rank was stuck where. Without GPUs the same suite runs on the gloo backend.

This module has two halves. The parent (``run_nccl``, ``run_nccl_stage``, ``main``) runs in the lab. The
worker runs in a cell's venv with torch and the standard library only, so the module's top level imports
nothing else, and the worker is loaded by file path: importing the ``compatlab`` package there would pull
in the lab's own dependencies, which a cell's venv does not have.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import difflib
import faulthandler
import importlib
import json
import logging
import math
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .results import StageResult
    from .stages import CellContext

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
    "main",
    "nccl_thresholds",
    "parse_test_hook",
    "run_nccl",
    "run_nccl_stage",
]

log = logging.getLogger(__name__)

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
DTYPES = ("float32", "bfloat16", "float16", "int32")
# Elements per rank: one, an odd count, and a large count that is not a power of two.
CHECK_COUNTS = (1, 1023, (1 << 20) + 3)
PHASES = ("init", "correctness", "bandwidth")
MIB = 1 << 20
GIB = 1 << 30
HOOK_ENV = "COMPATLAB_NCCL_TEST_HOOK"
# NVLink multicast can take a shared host's GPUs out of service: it stays off in every child, whatever
# the caller's environment or the target's nccl-env say.
SAFETY_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
_RECORDED_PREFIXES = ("NCCL_", "TORCH_NCCL_", "TORCH_SYMM_MEM_", "NVSHMEM_", "GLOO_", "COMPATLAB_NCCL_")
_RECORDED_NAMES = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")
_BW_DTYPE = "float32"  # as nccl-tests does by default
_POLL = 0.05


# ---------------------------------------------------------------------------------------------------
# Arithmetic (nccl-tests' definitions, GB = 1e9 bytes)


def bus_factor(op: str, world_size: int) -> float:
    """nccl-tests' bus bandwidth factor: what each link carries relative to the algorithm bandwidth."""
    n = world_size
    if n < 1:
        raise ValueError(f"world size must be at least 1, got {n}")
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter"):
        return (n - 1) / n
    if op == "broadcast":
        return 1.0
    raise ValueError(f"unknown collective {op!r}; known: {', '.join(OPS)}")


def algbw_gbps(size_bytes: int, seconds: float) -> float:
    """Algorithm bandwidth in GB/s: the buffer size over the time of one operation."""
    if seconds <= 0:
        raise ValueError(f"time must be positive, got {seconds}")
    return size_bytes / seconds / 1e9


def busbw_gbps(op: str, size_bytes: int, seconds: float, world_size: int) -> float:
    """Bus bandwidth in GB/s, comparable across world sizes (and with NVLink's rated figure)."""
    return algbw_gbps(size_bytes, seconds) * bus_factor(op, world_size)


def default_sizes(lo: int = MIB, hi: int = GIB, step: int = 2) -> tuple[int, ...]:
    """Buffer sizes in bytes from *lo* to *hi* inclusive, each *step* times the one before."""
    if lo < 1 or hi < lo or step < 2:
        raise ValueError(f"bad size range {lo}..{hi} step {step}")
    out = []
    size = lo
    while size <= hi:
        out.append(size)
        size *= step
    return tuple(out)


def _human_bytes(n: int) -> str:
    for unit, scale in (("GiB", GIB), ("MiB", MIB), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


# ---------------------------------------------------------------------------------------------------
# Test hook: COMPATLAB_NCCL_TEST_HOOK=corrupt:rank1[:op] | hang:rankN:phase | die:rankN:phase[:code|SIGNAME]


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class NcclHook:
    """A fault injected into one rank so that tests see a wrong result, a hang or a death."""

    action: str
    rank: int
    phase: str | None = None
    op: str | None = None
    exit: str = "3"  # die: an exit code or a signal name

    def __str__(self) -> str:
        parts = [self.action, f"rank{self.rank}"]
        if self.action == "corrupt":
            parts += [self.op] if self.op else []
        else:
            parts.append(self.phase or "")
            if self.action == "die":
                parts.append(self.exit)
        return ":".join(parts)


def parse_test_hook(text: str) -> NcclHook:
    """Parse a hook spec; ValueError says what a valid one looks like."""
    usage = (
        f"{HOOK_ENV}={text!r}: expected corrupt:rankN[:OP], hang:rankN:PHASE or "
        f"die:rankN:PHASE[:EXITCODE|SIGNAME] (PHASE: {', '.join(PHASES)})"
    )
    parts = text.strip().split(":")
    if len(parts) < 2 or not re.fullmatch(r"rank\d+", parts[1]):
        raise ValueError(usage)
    action, rank = parts[0], int(parts[1][4:])
    if action == "corrupt" and len(parts) in (2, 3):
        op = parts[2] if len(parts) == 3 else None
        if op is not None and op not in OPS:
            raise ValueError(f"{usage}; unknown OP {op!r} (known: {', '.join(OPS)})")
        return NcclHook(action=action, rank=rank, op=op)
    if action in ("hang", "die") and len(parts) >= 3 and parts[2] in PHASES:
        if action == "hang" and len(parts) == 3:
            return NcclHook(action=action, rank=rank, phase=parts[2])
        if action == "die" and len(parts) in (3, 4):
            how = parts[3] if len(parts) == 4 else "3"
            if not (how.isdigit() or (how.startswith("SIG") and hasattr(signal, how))):
                raise ValueError(f"{usage}; {how!r} is neither an exit code nor a signal name")
            return NcclHook(action=action, rank=rank, phase=parts[2], exit=how)
    raise ValueError(usage)


# ---------------------------------------------------------------------------------------------------
# Worker: runs in the cell's venv, torch and the standard library only.


class _Events:
    """Append-only JSON lines the parent reads to know each rank's phase, progress and results."""

    def __init__(self, path: Path) -> None:
        self._fh = path.open("a", encoding="utf-8")

    def emit(self, event: str, **data: Any) -> None:
        self._fh.write(json.dumps({"event": event, "t": time.time(), **data}) + "\n")
        self._fh.flush()


def _injected_hang() -> None:
    while True:  # the stack the parent captures ends here, which is the point
        time.sleep(3600)


def _fire_hook(hook: NcclHook | None, rank: int, phase: str) -> None:
    if hook is None or hook.rank != rank or hook.phase != phase:
        return
    if hook.action == "hang":
        _injected_hang()
    elif hook.action == "die":
        if hook.exit.isdigit():
            os._exit(int(hook.exit))
        os.kill(os.getpid(), getattr(signal, hook.exit))
        time.sleep(10)  # the signal is on its way
        os._exit(70)


def _watch_parent(parent: int) -> None:
    # Ranks live in their own sessions: if the parent is gone nobody would ever reap them.
    while True:
        time.sleep(1.0)
        if os.getppid() != parent:
            os._exit(70)


def _as_number(value: Any) -> int | float:
    f = float(value)
    return int(f) if math.isfinite(f) and f == int(f) else f


class _Worker:
    def __init__(self, cfg: dict[str, Any], rank: int, ev: _Events) -> None:
        self.cfg = cfg
        self.rank = rank
        self.n = int(cfg["world_size"])
        self.ev = ev
        self.hook = parse_test_hook(cfg["hook"]) if cfg.get("hook") else None
        self.torch: Any = None
        self.dist: Any = None
        self.device: Any = None
        self.cuda = cfg["backend"] == "nccl"

    def _sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize(self.device)

    def init(self) -> None:
        t0 = time.perf_counter()
        torch = self.torch = importlib.import_module("torch")
        dist = self.dist = importlib.import_module("torch.distributed")
        import_seconds = time.perf_counter() - t0
        _fire_hook(self.hook, self.rank, "init")
        self.ev.emit("step", label="init_process_group")
        kwargs: dict[str, Any] = {}
        if self.cuda:
            self.device = torch.device("cuda", self.rank)
            torch.cuda.set_device(self.device)
            kwargs["device_id"] = self.device  # eager communicator: init errors show here, not later
        else:
            self.device = torch.device("cpu")
        from datetime import timedelta

        t1 = time.perf_counter()
        dist.init_process_group(
            self.cfg["backend"], init_method=self.cfg["init_method"], rank=self.rank, world_size=self.n,
            timeout=timedelta(seconds=float(self.cfg["pg_timeout_s"])), **kwargs,
        )
        one = torch.ones(1, device=self.device)
        dist.all_reduce(one)
        self._sync()
        seconds = time.perf_counter() - t1
        info: dict[str, Any] = {"torch_version": str(torch.__version__), "host": os.uname().nodename}
        if self.cuda:
            info["nccl_version"] = ".".join(str(x) for x in torch.cuda.nccl.version())
            info["cuda_version"] = torch.version.cuda
            info["device"] = torch.cuda.get_device_name(self.device)
        if float(one.item()) != self.n:
            raise RuntimeError(f"first all_reduce of ones gave {one.item()}, expected {self.n}")
        self.ev.emit("init", seconds=seconds, import_seconds=import_seconds, **info)

    def _pattern(self, count: int) -> Any:
        return self.torch.arange(count, device=self.device, dtype=self.torch.int64) % 11

    def check(self, op: str, dtype_name: str, count: int) -> dict[str, Any]:
        """One collective on integer-valued data (sums stay exact in every dtype), compared exactly."""
        torch, dist, n, r = self.torch, self.dist, self.n, self.rank
        dtype = getattr(torch, dtype_name)
        a = self._pattern(count)
        if op == "all_reduce":
            out = (a + r + 1).to(dtype)
            dist.all_reduce(out)
            expected = a * n + n * (n + 1) // 2
        elif op == "all_gather":
            out = torch.empty(n * count, dtype=dtype, device=self.device)
            dist.all_gather_into_tensor(out, (a + r).to(dtype))
            expected = torch.cat([a + s for s in range(n)])
        elif op == "reduce_scatter":
            out = torch.empty(count, dtype=dtype, device=self.device)
            dist.reduce_scatter_tensor(out, torch.cat([a + j + r for j in range(n)]).to(dtype))
            expected = a * n + r * n + n * (n - 1) // 2
        elif op == "broadcast":
            src = n - 1  # a root other than 0 where there is one
            out = (a + 1 + src).to(dtype) if r == src else torch.full_like(a, -1).to(dtype)
            dist.broadcast(out, src=src)
            expected = a + 1 + src
        else:
            raise ValueError(op)
        hook = self.hook
        if hook and hook.action == "corrupt" and hook.rank == r and hook.op in (None, op):
            out.view(-1)[0] += 1
        self._sync()
        expected = expected.to(dtype)
        bad = out != expected
        if not bool(bad.any()):
            return {"ok": True}
        index = int(bad.nonzero()[0][0])
        return {
            "ok": False, "index": index, "mismatches": int(bad.sum()), "elements": int(out.numel()),
            "expected": _as_number(expected[index].item()), "got": _as_number(out[index].item()),
        }

    def correctness(self) -> None:
        _fire_hook(self.hook, self.rank, "correctness")
        for op in self.cfg["ops"]:
            for dtype in self.cfg["dtypes"]:
                for count in self.cfg["check_counts"]:
                    self.ev.emit("step", label=f"{op} {dtype} × {count}")
                    try:
                        res = self.check(op, dtype, count)
                    except Exception as exc:  # noqa: BLE001 - any failure of a collective is a result
                        res = {"ok": False, "error": f"{type(exc).__name__}: {str(exc).strip()[:500]}"}
                        self.ev.emit("check", op=op, dtype=dtype, count=count, **res)
                        # An unsupported dtype raises on every rank alike and the group lives on;
                        # a broken group (a peer gone) fails a plain all_reduce too, and that ends the run.
                        self.dist.all_reduce(self.torch.zeros(1, device=self.device))
                        self._sync()
                        continue
                    self.ev.emit("check", op=op, dtype=dtype, count=count, **res)

    def _timed(self, op: str, size: int) -> tuple[float, int] | None:
        torch, dist, n = self.torch, self.dist, self.n
        dtype = getattr(torch, _BW_DTYPE)
        elt = torch.tensor([], dtype=dtype).element_size()
        # nccl-tests' size: the whole buffer (all_gather's output, reduce_scatter's input).
        chunk = size // (elt * n) if op in ("all_gather", "reduce_scatter") else size // elt
        if chunk == 0:
            return None
        dev = self.device
        fn: Callable[[], object]
        if op == "all_reduce":
            buf = torch.zeros(chunk, dtype=dtype, device=dev)  # zeros: repeated sums stay finite
            nbytes = chunk * elt
            fn = lambda: dist.all_reduce(buf)  # noqa: E731
        elif op == "all_gather":
            inp = torch.zeros(chunk, dtype=dtype, device=dev)
            out = torch.empty(chunk * n, dtype=dtype, device=dev)
            nbytes = chunk * n * elt
            fn = lambda: dist.all_gather_into_tensor(out, inp)  # noqa: E731
        elif op == "reduce_scatter":
            inp = torch.zeros(chunk * n, dtype=dtype, device=dev)
            out = torch.empty(chunk, dtype=dtype, device=dev)
            nbytes = chunk * n * elt
            fn = lambda: dist.reduce_scatter_tensor(out, inp)  # noqa: E731
        else:
            buf = torch.zeros(chunk, dtype=dtype, device=dev)
            nbytes = chunk * elt
            fn = lambda: dist.broadcast(buf, src=0)  # noqa: E731
        for _ in range(int(self.cfg["warmup"])):
            fn()
        self._sync()
        dist.all_reduce(torch.zeros(1, device=dev))  # line the ranks up before the clock starts
        self._sync()
        iters = int(self.cfg["iters"])
        if self.cuda:
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                fn()
            end.record()
            end.synchronize()
            seconds = start.elapsed_time(end) / 1e3 / iters
        else:
            t0 = time.perf_counter()
            for _ in range(iters):
                fn()
            seconds = (time.perf_counter() - t0) / iters
        return seconds, nbytes

    def bandwidth(self) -> None:
        _fire_hook(self.hook, self.rank, "bandwidth")
        # Sweeps outermost: the repeats of one size lie apart in time, so their median means something.
        for sweep in range(int(self.cfg["sweeps"])):
            for op in self.cfg["ops"]:
                for size in self.cfg["sizes"]:
                    self.ev.emit("step", label=f"bandwidth {op} {_human_bytes(size)} sweep {sweep + 1}")
                    timed = self._timed(op, size)
                    if timed is not None:
                        self.ev.emit("bw", op=op, size=size, sweep=sweep, seconds=timed[0], bytes=timed[1])


def _worker_main(argv: Sequence[str]) -> int:
    """``worker CONFIG RANK``: one rank of the suite. Its progress goes to events; crashes to stderr."""
    config, rank = Path(argv[1]), int(argv[2])
    cfg = json.loads(config.read_text(encoding="utf-8"))
    work = Path(cfg["work_dir"])
    # Before anything slow: a SIGUSR1 from the parent must find the handler installed.
    stack_file = (work / f"rank{rank}.stack").open("w", encoding="utf-8")
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
    faulthandler.enable()
    faulthandler.dump_traceback_later(float(cfg["deadline_s"]), exit=True)
    ev = _Events(work / f"rank{rank}.events.jsonl")
    ev.emit("started", pid=os.getpid(), main_thread=threading.get_ident())
    threading.Thread(target=_watch_parent, args=(os.getppid(),), daemon=True).start()
    w = _Worker(cfg, rank, ev)
    phase = "init"
    try:
        for phase in cfg["phases"]:
            ev.emit("phase", phase=phase)
            getattr(w, phase)()
        ev.emit("done")
    except BaseException as exc:  # noqa: BLE001 - the parent must learn of every way a rank ends
        ev.emit("error", phase=phase, type=type(exc).__name__, message=str(exc).strip()[:2000],
                traceback=traceback.format_exc()[-4000:])
        return 1
    if w.dist is not None and w.dist.is_initialized():
        w.dist.destroy_process_group()
    return 0


# Loads this file under a private name: importing the compatlab package would need the lab's own
# dependencies, which a cell's venv does not have.
_BOOTSTRAP = (
    "import importlib.util as u, sys\n"
    "s = u.spec_from_file_location('_compatlab_nccl_worker', sys.argv[1])\n"
    "m = u.module_from_spec(s); sys.modules[s.name] = m; s.loader.exec_module(m)\n"
    "sys.exit(m._worker_main(sys.argv[2:]))\n"
)


# ---------------------------------------------------------------------------------------------------
# Parent: configuration


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class NcclTimeouts:
    """Hard limits in seconds per phase; init counts from the start of the rank's process."""

    init: float = 180.0
    correctness: float = 180.0
    bandwidth: float = 600.0
    grace: float = 5.0  # how long the others may take to notice a dead rank before they count as hung
    stack: float = 3.0  # how long to wait for the stacks a rank writes on SIGUSR1

    def phase(self, name: str) -> float:
        return float(getattr(self, name))


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class NcclThresholds:
    """``[thresholds.nccl]``: a floor for all_reduce's busbw at the largest size."""

    min_busbw_gbps: float | None = None
    source: str = ""  # the key it came from, for messages


_THRESHOLD_KEYS = frozenset({"min-busbw-gbps"})


def _show(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "a table"
    return type(value).__name__


def nccl_thresholds(
    thresholds: Mapping[str, Any], *, target: str | None = None, targets: Iterable[str] = (),
    path: str = "matrix.toml",
) -> NcclThresholds:
    """Read ``[thresholds.nccl]`` (and ``[thresholds.nccl.<target>]``), raising ConfigError on any problem."""
    from .errors import ConfigError

    raw = thresholds.get("nccl")
    if raw is None:
        return NcclThresholds()
    if not isinstance(raw, dict):
        raise ConfigError(path, [f"thresholds.nccl: expected a table, got {_show(raw)}"])
    known_targets = sorted(targets)
    problems: list[str] = []

    def number(table: Mapping[str, Any], where: str) -> float | None:
        value = table.get("min-busbw-gbps")
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            problems.append(f"{where}.min-busbw-gbps: expected a positive number of GB/s, got {_show(value)}")
            return None
        return float(value)

    def unknown(name: str, where: str, allowed: Iterable[str]) -> None:
        close = difflib.get_close_matches(name, sorted(allowed), n=1, cutoff=0.6)
        hint = (f"; perhaps you meant {close[0]!r}?" if close
                else f"; allowed keys: {', '.join(sorted(_THRESHOLD_KEYS))}")
        problems.append(f"{where}.{name}: unknown key{hint}")

    top = number(raw, "thresholds.nccl")
    per_target: dict[str, float | None] = {}
    for key, value in raw.items():
        if key in _THRESHOLD_KEYS:
            continue
        if isinstance(value, dict):
            where = f"thresholds.nccl.{key}"
            if known_targets and key not in known_targets:
                close = difflib.get_close_matches(key, known_targets, n=1, cutoff=0.6)
                hint = f"; perhaps you meant {close[0]!r}?" if close else f" ({', '.join(known_targets)})"
                problems.append(f"{where}: not a target{hint}")
                continue
            for name in value:
                if name not in _THRESHOLD_KEYS:
                    unknown(name, where, _THRESHOLD_KEYS)
            per_target[key] = number(value, where)
        else:
            unknown(key, "thresholds.nccl", _THRESHOLD_KEYS)
    if problems:
        raise ConfigError(path, problems)
    if target is not None and per_target.get(target) is not None:
        return NcclThresholds(min_busbw_gbps=per_target[target],
                              source=f"{path}: thresholds.nccl.{target}.min-busbw-gbps")
    if top is not None:
        return NcclThresholds(min_busbw_gbps=top, source=f"{path}: thresholds.nccl.min-busbw-gbps")
    return NcclThresholds()


# ---------------------------------------------------------------------------------------------------
# Parent: the report


@dataclasses.dataclass(kw_only=True, slots=True)
class NcclReport:
    """What one run of the suite found; ``details()`` is what goes into the stage result."""

    state: str  # pass | fail | error
    reason: str
    world_size: int
    backend: str
    env: dict[str, str]
    nccl_version: str | None = None
    torch_version: str | None = None
    device: str | None = None
    topo: str | None = None
    init_seconds: float | None = None
    correctness: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    sweep: dict[str, dict[int, dict[str, Any]]] = dataclasses.field(default_factory=dict)
    busbw_gbps: float | None = None
    threshold: dict[str, Any] | None = None
    hang: dict[str, Any] | None = None
    crash: dict[str, Any] | None = None
    ranks: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    seconds: float = 0.0

    def details(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        for key in ("state", "reason", "seconds"):
            data.pop(key)
        return data

    @property
    def failures(self) -> list[str]:
        """One message per wrong collective result: op, dtype, size, rank, expected vs got."""
        out = []
        for entry in self.correctness:
            for f in entry["failures"]:
                out.append(f["message"])
        return out


@dataclasses.dataclass(kw_only=True, slots=True)
class _Rank:
    rank: int
    proc: subprocess.Popen[bytes]
    events: Path
    stack: Path
    log: Path
    phase: str = "init"
    since: float = 0.0
    steps: int = 0
    label: str = ""
    started: bool = False
    done: bool = False
    main_thread: int | None = None
    error: dict[str, Any] | None = None
    init: dict[str, Any] | None = None
    dead_at: float | None = None
    offset: int = 0
    checks: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    bw: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    def read(self, now: float) -> None:
        try:
            with self.events.open("rb") as fh:
                fh.seek(self.offset)
                chunk = fh.read()
        except FileNotFoundError:
            return
        end = chunk.rfind(b"\n") + 1  # only whole lines; a half-written one waits for the next poll
        self.offset += end
        for line in chunk[:end].splitlines():
            ev = json.loads(line)
            kind = ev["event"]
            if kind == "started":
                self.started, self.main_thread = True, int(ev["main_thread"])
            elif kind == "phase":
                self.phase, self.since, self.steps, self.label = ev["phase"], now, 0, ""
            elif kind == "step":
                self.steps += 1
                self.label = ev["label"]
            elif kind == "init":
                self.init = ev
            elif kind == "check":
                self.checks.append(ev)
            elif kind == "bw":
                self.bw.append(ev)
            elif kind == "error":
                self.error = ev
            elif kind == "done":
                self.done = True

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def status(self) -> dict[str, Any]:
        rc = self.proc.returncode
        return {
            "rank": self.rank, "pid": self.proc.pid, "returncode": rc,
            "signal": _signal_name(rc), "phase": self.phase, "step": self.label, "done": self.done,
            "error": None if self.error is None else f"{self.error['type']}: {self.error['message']}",
            "log_tail": self.log_tail(),
        }


def _signal_name(rc: int | None) -> str | None:
    if rc is None or rc >= 0:
        return None
    try:
        return signal.Signals(-rc).name
    except ValueError:
        return f"signal {-rc}"


_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')
_THREAD = re.compile(r"^(?:Current thread|Thread) (0x[0-9a-fA-F]+)")


def _main_stack(dump: str, main_thread: int | None) -> tuple[str, str]:
    """The main thread's part of a faulthandler dump, and its innermost frame as ``file:line in func``."""
    blocks: list[tuple[int | None, list[str]]] = []
    for line in dump.splitlines():
        m = _THREAD.match(line)
        if m or not blocks:
            blocks.append((int(m.group(1), 16) if m else None, [line]))
        else:
            blocks[-1][1].append(line)
    chosen = next((b for b in blocks if b[0] is not None and b[0] == main_thread), None)
    if chosen is None:
        current = (b for b in blocks if b[1] and b[1][0].startswith("Current thread"))
        chosen = next(current, blocks[0] if blocks else None)
    if chosen is None:
        return "", ""
    text = "\n".join(chosen[1]).strip()
    for line in chosen[1]:
        f = _FRAME.match(line)
        if f:  # most recent call first: the first frame is where it is
            return text, f"{Path(f['file']).name}:{f['line']} in {f['func']}"
    return text, ""


# ---------------------------------------------------------------------------------------------------
# Parent: running the ranks


_THIS = Path(__file__).resolve()


def _src_dir() -> Path:
    return _THIS.parents[1]


def _child_env(env: Mapping[str, str], notes: list[str]) -> dict[str, str]:
    child = dict(env)
    for key, value in SAFETY_ENV.items():
        if child.get(key, value) != value:
            notes.append(f"{key}={child[key]} overridden to {value}: NVLink multicast stays off")
        child[key] = value
    src = str(_src_dir())
    old = child.get("PYTHONPATH")
    child["PYTHONPATH"] = src if not old else f"{src}{os.pathsep}{old}"
    child["PYTHONUNBUFFERED"] = "1"
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


def _kill(ranks: Iterable[_Rank]) -> None:
    for r in ranks:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(r.proc.pid, signal.SIGKILL)
    for r in ranks:
        try:
            r.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            log.warning("rank %d (pid %d) survived SIGKILL", r.rank, r.proc.pid)


def _capture_stacks(ranks: Sequence[_Rank], wait: float) -> dict[int, dict[str, str]]:
    """Ask every live rank for its stacks (SIGUSR1 → faulthandler) and read what they wrote."""
    asked = []
    for r in ranks:
        if r.proc.poll() is None and r.started:
            try:
                os.kill(r.proc.pid, signal.SIGUSR1)
                asked.append(r)
            except ProcessLookupError:
                pass
    sizes: dict[int, int] = {}
    deadline = time.monotonic() + wait
    while asked and time.monotonic() < deadline:
        time.sleep(0.1)
        now_sizes = {r.rank: r.stack.stat().st_size if r.stack.exists() else 0 for r in asked}
        if all(now_sizes[k] > 0 for k in now_sizes) and now_sizes == sizes:
            break  # everyone wrote something and nothing grew in the last tick
        sizes = now_sizes
    out: dict[int, dict[str, str]] = {}
    for r in ranks:
        if r not in asked:
            why = "process had exited" if r.proc.poll() is not None else "worker had not started"
            out[r.rank] = {"stack": "", "where": "", "note": f"no stack: {why}"}
            continue
        dump = r.stack.read_text(encoding="utf-8", errors="replace") if r.stack.exists() else ""
        text, where = _main_stack(dump, r.main_thread)
        out[r.rank] = {"stack": text, "where": where, "all_threads": dump}
        if not dump:
            out[r.rank]["note"] = "no stack: the rank did not answer SIGUSR1"
    return out


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
    from .errors import UsageError

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
        notes.append("one rank: busbw is 0 by definition (broadcast's is algbw), and in-place all_reduce "
                     "and broadcast move no data, so these figures time launches, not links")
    report = NcclReport(state="pass", reason="", world_size=world_size, backend=backend,
                        env=_recorded_env(child_env), topo=_topo(backend), notes=notes)

    work_dir = Path(work_dir).resolve()
    work_dir.mkdir(parents=True, exist_ok=True)
    rendezvous = work_dir / "rendezvous"
    for stale in [rendezvous, *work_dir.glob("rank*.events.jsonl"), *work_dir.glob("rank*.stack"),
                  *work_dir.glob("rank*.log")]:
        stale.unlink(missing_ok=True)
    phases = ["init", "correctness"] + (["bandwidth"] if sizes else [])
    # The process group's own timeout stays out of the way: the parent's verdict, with stacks, comes first.
    pg_timeout = max(timeouts.phase(p) for p in phases) + 60
    cfg = {
        "world_size": world_size, "backend": backend, "init_method": rendezvous.as_uri(),
        "work_dir": str(work_dir), "phases": phases, "ops": list(ops), "dtypes": list(dtypes),
        "check_counts": [int(c) for c in check_counts], "sizes": [int(s) for s in sizes],
        "sweeps": sweeps, "warmup": warmup, "iters": iters, "hook": str(hook) if hook else None,
        "pg_timeout_s": pg_timeout, "deadline_s": sum(timeouts.phase(p) for p in phases) + 120,
    }
    config = work_dir / "config.json"
    config.write_text(json.dumps(cfg, indent=2), encoding="utf-8")

    ranks: list[_Rank] = []
    try:
        for r in range(world_size):
            argv = [str(python), "-c", _BOOTSTRAP, str(_THIS), "worker", str(config), str(r)]
            log.info("$ %s", shlex.join(argv))
            logfile = work_dir / f"rank{r}.log"
            with logfile.open("wb") as out:
                proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                        env=child_env, cwd=work_dir, start_new_session=True)
            ranks.append(_Rank(rank=r, proc=proc, events=work_dir / f"rank{r}.events.jsonl",
                               stack=work_dir / f"rank{r}.stack", log=logfile, since=time.monotonic()))
    except OSError as exc:
        _kill(ranks)
        report.state, report.reason = "error", f"cannot start rank {len(ranks)} with {python}: {exc}"
        report.seconds = time.monotonic() - start
        return report

    try:
        _watch(ranks, timeouts, report)
    finally:
        _kill(ranks)
    rendezvous.unlink(missing_ok=True)
    for rank in ranks:
        rank.read(time.monotonic())
    report.ranks = [r.status() for r in ranks]
    dead = sorted((r for r in ranks if r.dead_at is not None),
                  key=lambda r: (r.dead_at, r.error is not None, r.rank))
    if dead:
        # The first to go is the cause; ranks that raised afterwards mostly only noticed it.
        report.crash = {**(report.crash or {}), "dead": [r.rank for r in dead]}
    _collect(ranks, report, ops=list(ops), dtypes=list(dtypes), counts=[int(c) for c in check_counts],
             sizes=sizes)
    _judge(report, thresholds)
    report.seconds = time.monotonic() - start
    return report


def _watch(ranks: list[_Rank], timeouts: NcclTimeouts, report: NcclReport) -> None:
    """Poll the ranks until all finish, one dies (plus grace), or one overstays its phase."""
    first_death: float | None = None
    while True:
        now = time.monotonic()
        for r in ranks:
            r.read(now)
            if r.dead_at is None and r.proc.poll() is not None and (r.proc.returncode != 0 or not r.done):
                r.dead_at = now
                first_death = first_death or now
        live = [r for r in ranks if r.proc.poll() is None]
        if not live:
            break
        if all(r.done for r in ranks):
            # Finished, but a rank that does not leave destroy_process_group is not worth a verdict.
            deadline = now + timeouts.grace
            while any(r.proc.poll() is None for r in ranks) and time.monotonic() < deadline:
                time.sleep(_POLL)
            for r in ranks:
                if r.proc.poll() is None:
                    report.notes.append(
                        f"rank {r.rank} finished but did not exit within {timeouts.grace:g} s; killed")
            return
        if first_death is not None and now - first_death > timeouts.grace:
            stuck = [r for r in live if not r.done]
            report.crash = {"stacks_of_survivors": _capture_stacks(stuck, timeouts.stack)} if stuck else {}
            return
        overdue = [r for r in live if not r.done and now - r.since > timeouts.phase(r.phase)]
        if first_death is None and overdue:
            phase = overdue[0].phase
            stuck = [r for r in live if not r.done]
            stacks = _capture_stacks(stuck, timeouts.stack)
            # The ranks furthest behind hold up the rest, which wait for them inside a collective.
            order = {p: i for i, p in enumerate(PHASES)}
            behind = min((order[r.phase], r.steps) for r in stuck)
            culprits = [r.rank for r in stuck if (order[r.phase], r.steps) == behind]
            report.hang = {
                "phase": phase, "timeout_s": timeouts.phase(phase), "ranks": culprits,
                "where": {r.rank: stacks[r.rank]["where"] for r in stuck},
                "steps": {r.rank: {"phase": r.phase, "steps": r.steps, "step": r.label} for r in stuck},
                "stacks": stacks,
            }
            return
        time.sleep(_POLL)


def _sig(x: float, digits: int = 5) -> float:
    return float(f"{x:.{digits}g}")


def _collect(ranks: list[_Rank], report: NcclReport, *, ops: list[str], dtypes: list[str],
             counts: list[int], sizes: Sequence[int]) -> None:
    n = report.world_size
    inits = [r.init for r in ranks if r.init is not None]
    if inits:
        report.init_seconds = round(max(float(i["seconds"]) for i in inits), 3)
        first = inits[0]
        report.torch_version = first.get("torch_version")
        report.nccl_version = first.get("nccl_version")
        report.device = first.get("device")
    for op in ops:
        for dtype in dtypes:
            for count in counts:
                got = {r.rank: c for r in ranks for c in r.checks
                       if (c["op"], c["dtype"], c["count"]) == (op, dtype, count)}
                if not got:
                    continue
                failures = []
                for rank, c in sorted(got.items()):
                    if c["ok"]:
                        continue
                    where = f"{op} {dtype} × {count} elements on rank {rank}"
                    if "error" in c:
                        msg = f"{where}: raised {c['error']}"
                    else:
                        msg = (f"{where}: element {c['index']} expected {c['expected']}, got {c['got']} "
                               f"({c['mismatches']} of {c['elements']} elements differ)")
                    failures.append({**{k: v for k, v in c.items() if k not in ("event", "t")},
                                     "rank": rank, "message": msg})
                report.correctness.append({"op": op, "dtype": dtype, "count": count,
                                           "ok": not failures and len(got) == n,
                                           "ranks": len(got), "failures": failures})
    for op in ops:
        table: dict[int, dict[str, Any]] = {}
        for size in sizes:
            per_sweep: dict[int, list[tuple[float, int]]] = {}
            for r in ranks:
                for b in r.bw:
                    if b["op"] == op and b["size"] == size:
                        timed = (float(b["seconds"]), int(b["bytes"]))
                        per_sweep.setdefault(int(b["sweep"]), []).append(timed)
            # A sweep counts once every rank has timed it; its time is the slowest rank's, as it must be.
            done = {s: v for s, v in per_sweep.items() if len(v) == n}
            if not done:
                continue
            nbytes = next(iter(done.values()))[0][1]
            times = [max(t for t, _ in v) for _, v in sorted(done.items())]
            med = statistics.median(times)
            table[size] = {
                "bytes": nbytes, "time_us": _sig(med * 1e6),
                "algbw_gbps": _sig(algbw_gbps(nbytes, med)),
                "busbw_gbps": _sig(busbw_gbps(op, nbytes, med, n)),
                "busbw_gbps_sweeps": [_sig(busbw_gbps(op, nbytes, t, n)) for t in times],
            }
        if table:
            report.sweep[op] = table
    ar = report.sweep.get("all_reduce")
    if ar:
        report.busbw_gbps = ar[max(ar)]["busbw_gbps"]


# Lines worth quoting from a dead rank's log: faulthandler's and the C++ runtime's last words.
_FATAL = re.compile(r"Fatal Python error|terminate called|Segmentation fault|Aborted|NCCL WARN|CUDA error")


def _ranks(ranks: Sequence[int]) -> str:
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"


def _judge(report: NcclReport, thresholds: NcclThresholds | None) -> None:
    if report.crash is not None:
        first = next(st for st in report.ranks if st["rank"] == report.crash["dead"][0])
        if first["error"]:
            error = first["error"].splitlines()[0][:300]
            reason = f"rank {first['rank']} failed in {first['phase']}: {error}"
        else:
            how = f"killed by {first['signal']}" if first["signal"] else f"exit code {first['returncode']}"
            reason = f"rank {first['rank']} died in {first['phase']} ({how})"
            fatal = [line for line in first["log_tail"].splitlines() if _FATAL.search(line)]
            if fatal:
                reason += f": {fatal[0].strip()[:300]}"
        others = list(report.crash["dead"][1:])
        if others:
            reason += f"; {_ranks(others)} stopped too"
        survivors = sorted(report.crash.get("stacks_of_survivors", {}))
        if survivors:
            reason += f"; {_ranks(survivors)} hung after it"
        keys = ("rank", "phase", "returncode", "signal", "error", "log_tail")
        report.crash.update({k: first[k] for k in keys})
        report.state, report.reason = "fail", reason
        return
    if report.hang is not None:
        h = report.hang
        culprits = h["ranks"]
        where = "; ".join(f"rank {r} at {h['where'].get(r) or 'unknown place'}" for r in culprits)
        others = sorted(set(h["where"]) - set(culprits))
        waiting = f" ({_ranks(others)} waiting)" if others else ""
        report.state = "fail"
        report.reason = f"hang in {h['phase']} after {h['timeout_s']:g} s: {where}{waiting}"
        return
    missing = [s["rank"] for s in report.ranks if not s["done"]]
    if missing:  # exited 0 without saying done: treat as a crash we could not classify
        report.state, report.reason = "error", f"ranks {missing} exited without finishing"
        return
    failures = report.failures
    if failures:
        more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
        report.state, report.reason = "fail", f"wrong result: {failures[0]}{more}"
        return
    if thresholds is not None and thresholds.min_busbw_gbps is not None:
        floor = thresholds.min_busbw_gbps
        ar = report.sweep.get("all_reduce")
        if report.world_size == 1:
            report.threshold = {"min_busbw_gbps": floor, "judged": False,
                                "why": "busbw is 0 by definition with one rank"}
        elif not ar:
            report.threshold = {"min_busbw_gbps": floor, "judged": False, "why": "all_reduce not measured"}
        else:
            size = max(ar)
            got = ar[size]["busbw_gbps"]
            ok = got >= floor
            report.threshold = {"min_busbw_gbps": floor, "judged": True, "ok": ok, "size_bytes": size,
                                "busbw_gbps": got, "source": thresholds.source}
            if not ok:
                report.state = "fail"
                report.reason = (f"all_reduce busbw {got:.1f} GB/s at {_human_bytes(size)} is below "
                                 f"the floor of {floor:g} GB/s ({thresholds.source})")
                return
    report.state = "pass"
    bw = f", all_reduce busbw {report.busbw_gbps:.1f} GB/s" if report.busbw_gbps is not None else ""
    checks = len(report.correctness)
    report.reason = f"{report.world_size} ranks ({report.backend}): {checks} checks right{bw}"


# ---------------------------------------------------------------------------------------------------
# The stage and the command line


_PROBE = (
    "import json, torch, torch.distributed as d\n"
    "c = torch.cuda.device_count() if torch.cuda.is_available() else 0\n"
    "print(json.dumps({'gpus': c, 'nccl': bool(d.is_available() and d.is_nccl_available()),"
    " 'gloo': bool(d.is_available() and d.is_gloo_available()), 'torch': torch.__version__}))\n"
)


def _probe(python: Path, env: Mapping[str, str]) -> dict[str, Any]:
    """What the interpreter's torch sees: GPUs and backends. Raises RuntimeError with its stderr."""
    from . import proc

    done = proc.run([str(python), "-c", _PROBE], timeout=180, env=env)
    if not done.ok:
        tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        why = "timed out" if done.timed_out else tail
        raise RuntimeError(f"torch does not load in {python}: {why}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


class _StageStop(Exception):
    def __init__(self, state: str, reason: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(reason)
        self.state, self.reason, self.details = state, reason, details or {}


def _stage_report(ctx: CellContext) -> tuple[str, str, dict[str, Any]]:
    from .errors import ConfigError
    from .stages import cell_env

    targets = ctx.matrix.targets
    wanted = os.environ.get("COMPATLAB_TARGET")
    if wanted:
        target = next((t for t in targets if t.name == wanted), None)
        if target is None:
            known = ", ".join(t.name for t in targets) or "none"
            raise _StageStop("error", f"COMPATLAB_TARGET={wanted!r} names no target of "
                                      f"{ctx.matrix.path} ({known})")
    else:
        target = targets[0] if targets else None
    try:
        thresholds = nccl_thresholds(ctx.matrix.thresholds, target=target.name if target else None,
                                     targets=[t.name for t in targets], path=ctx.matrix.path)
    except ConfigError as exc:
        raise _StageStop("error", str(exc)) from None
    env = cell_env(ctx.venv, dict(target.nccl_env) if target else None)
    try:
        seen = _probe(ctx.python, env)
    except RuntimeError as exc:
        raise _StageStop("fail", str(exc)) from None
    work = ctx.work_dir / "nccl"
    if seen["gpus"] == 0 or not seen["nccl"]:
        why = "no GPU" if seen["gpus"] == 0 else "torch built without NCCL"
        report = run_nccl(ctx.python, world_size=2, backend="gloo", env=env,
                          timeouts=NcclTimeouts(init=120, correctness=120, bandwidth=120),
                          sizes=(64 << 10, MIB), thresholds=None, work_dir=work,
                          check_counts=(1, 1023, 4099), warmup=1, iters=3)
        details = {**report.details(), "skipped": f"{why}: nccl backend skipped, gloo ran"}
        if report.state == "pass":
            return "skip", f"{why}: nccl backend skipped, gloo ran", details
        return report.state, f"{why}, gloo ran: {report.reason}", details
    want = target.gpus if target else int(seen["gpus"])
    world = min(want, int(seen["gpus"]))
    report = run_nccl(ctx.python, world_size=world, backend="nccl", env=env, timeouts=NcclTimeouts(),
                      sizes=default_sizes(), thresholds=thresholds if world == want else None,
                      work_dir=work)
    if report.state == "pass" and world < want:
        name = target.name if target else "?"
        reason = f"target {name} wants {want} GPUs, {world} visible: nccl passed on {world}, not judged"
        return "skip", reason, report.details()
    return report.state, report.reason, report.details()


def run_nccl_stage(ctx: CellContext) -> StageResult:
    """Stage "nccl": the suite on the target's GPUs with the cell's torch, or gloo on CPUs without GPUs.

    The target is ``COMPATLAB_TARGET`` or the matrix's first; its ``gpus`` is the world size (every
    visible GPU without a target), its ``nccl-env`` goes to the ranks, and ``[thresholds.nccl]`` judges
    all_reduce's busbw. Without a GPU the stage is skipped (the cell is partial) after gloo ran.
    """
    from .errors import LabError
    from .results import StageResult

    start = time.monotonic()
    try:
        state, reason, details = _stage_report(ctx)
    except _StageStop as stop:
        state, reason, details = stop.state, stop.reason, stop.details
    except LabError as exc:
        state, reason, details = "error", str(exc), {}
    return StageResult(name="nccl", state=state, reason=reason, details=details,
                       seconds=time.monotonic() - start, required=True)


def _size(text: str) -> int:
    m = re.fullmatch(r"(\d+)\s*([KMG]i?B?|B)?", text.strip(), re.IGNORECASE)
    if not m:
        raise argparse.ArgumentTypeError(f"expected a size like 1MiB or 1073741824, got {text!r}")
    unit = (m.group(2) or "B").upper()[0]
    return int(m.group(1)) * {"B": 1, "K": 1 << 10, "M": MIB, "G": GIB}[unit]


def _print_report(report: NcclReport) -> None:
    print(f"nccl suite: {report.state}: {report.reason}")
    print(f"  backend {report.backend}, world size {report.world_size}, torch {report.torch_version}, "
          f"nccl {report.nccl_version}, device {report.device}, init {report.init_seconds} s")
    for op, table in report.sweep.items():
        print(f"  {op}:")
        print(f"    {'size':>10}  {'time us':>10}  {'algbw GB/s':>11}  {'busbw GB/s':>11}  busbw per sweep")
        for size, row in table.items():
            print(f"    {_human_bytes(size):>10}  {row['time_us']:>10.1f}  {row['algbw_gbps']:>11.2f}  "
                  f"{row['busbw_gbps']:>11.2f}  {row['busbw_gbps_sweeps']}")
    for note in report.notes:
        print(f"  note: {note}")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m compatlab.nccl``: run the suite with this interpreter's torch and print the figures."""
    args_in = list(sys.argv[1:] if argv is None else argv)
    if args_in[:1] == ["worker"]:
        return _worker_main(args_in)
    from .errors import LabError
    from .results import write_json_atomic

    p = argparse.ArgumentParser(prog="python -m compatlab.nccl", description=main.__doc__)
    p.add_argument("--world-size", type=int, default=None, help="ranks (default: every visible GPU; gloo: 2)")
    p.add_argument("--backend", choices=("auto", "nccl", "gloo"), default="auto")
    p.add_argument("--python", type=Path, default=Path(sys.executable),
                   help="interpreter with torch for the ranks")
    p.add_argument("--min-size", type=_size, default=MIB)
    p.add_argument("--max-size", type=_size, default=GIB)
    p.add_argument("--step", type=int, choices=(2, 4), default=2)
    p.add_argument("--no-bandwidth", action="store_true")
    p.add_argument("--check-counts", type=lambda t: tuple(int(x) for x in t.split(",")), default=CHECK_COUNTS,
                   help="elements per rank for the correctness checks, comma-separated")
    p.add_argument("--sweeps", type=int, default=3)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--min-busbw-gbps", type=float, default=None)
    p.add_argument("--timeout-init", type=float, default=180.0)
    p.add_argument("--timeout-correctness", type=float, default=180.0)
    p.add_argument("--timeout-bandwidth", type=float, default=600.0)
    p.add_argument("--work-dir", type=Path, default=None)
    p.add_argument("--json", type=Path, default=None, help="write the report here")
    p.add_argument("--debug", action="store_true")
    args = p.parse_args(args_in)
    logging.basicConfig(level=logging.INFO if args.debug else logging.WARNING, format="%(message)s")
    try:
        env = dict(os.environ)
        backend = args.backend
        if backend == "auto" or args.world_size is None:
            seen = _probe(args.python, env)
            if backend == "auto":
                backend = "nccl" if seen["gpus"] > 0 and seen["nccl"] else "gloo"
        world = args.world_size or (seen["gpus"] if backend == "nccl" else 2)
        if args.work_dir is None:
            import tempfile

            work = Path(tempfile.mkdtemp(prefix="compatlab-nccl-"))
        else:
            work = args.work_dir
        report = run_nccl(
            args.python, world_size=world, backend=backend, env=env,
            timeouts=NcclTimeouts(init=args.timeout_init, correctness=args.timeout_correctness,
                                  bandwidth=args.timeout_bandwidth),
            sizes=() if args.no_bandwidth else default_sizes(args.min_size, args.max_size, args.step),
            thresholds=NcclThresholds(min_busbw_gbps=args.min_busbw_gbps, source="--min-busbw-gbps"),
            work_dir=work, sweeps=args.sweeps, iters=args.iters, warmup=args.warmup,
            check_counts=args.check_counts,
        )
    except (LabError, RuntimeError, ValueError) as exc:
        if args.debug:
            raise
        print(f"error: {exc}", file=sys.stderr)
        return getattr(exc, "exit_code", 2)
    if args.json is not None:
        write_json_atomic(args.json, {"state": report.state, "reason": report.reason,
                                      "seconds": report.seconds, **report.details()})
    _print_report(report)
    return 0 if report.state == "pass" else 1


if __name__ == "__main__":
    raise SystemExit(main())
