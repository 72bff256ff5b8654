"""The NCCL suite's rank worker: the code that runs inside each rank's process.

It runs in a cell's venv with torch and the standard library only, so the module's top level imports
nothing else: ``python -m compatlab.incell.nccl_worker CONFIG RANK`` (``proc.incell_command``). The
parent side imports the constants and the test hook from here, so both halves agree on them.
"""

from __future__ import annotations

import dataclasses
import faulthandler
import importlib
import json
import math
import os
import re
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
PHASES = ("init", "correctness", "bandwidth")
MIB = 1 << 20
GIB = 1 << 30
HOOK_ENV = "COMPATLAB_NCCL_TEST_HOOK"
_BW_DTYPE = "float32"  # as nccl-tests does by default


def human_bytes(n: int) -> str:
    for unit, scale in (("GiB", GIB), ("MiB", MIB), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


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
            self.cfg["backend"],
            init_method=self.cfg["init_method"],
            rank=self.rank,
            world_size=self.n,
            timeout=timedelta(seconds=float(self.cfg["pg_timeout_s"])),
            **kwargs,
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
            "ok": False,
            "index": index,
            "mismatches": int(bad.sum()),
            "elements": int(out.numel()),
            "expected": _as_number(expected[index].item()),
            "got": _as_number(out[index].item()),
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
                    self.ev.emit("step", label=f"bandwidth {op} {human_bytes(size)} sweep {sweep + 1}")
                    timed = self._timed(op, size)
                    if timed is not None:
                        self.ev.emit("bw", op=op, size=size, sweep=sweep, seconds=timed[0], bytes=timed[1])


def main(argv: Sequence[str] | None = None) -> int:
    """``CONFIG RANK``: one rank of the suite. Its progress goes to events; crashes to stderr.

    It works in the config's ``work_dir`` (it is started in the folder it is imported from)."""
    config_arg, rank_arg = sys.argv[1:3] if argv is None else argv
    config, rank = Path(config_arg), int(rank_arg)
    cfg = json.loads(config.read_text(encoding="utf-8"))
    work = Path(cfg["work_dir"])
    os.chdir(work)
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
        ev.emit(
            "error",
            phase=phase,
            type=type(exc).__name__,
            message=str(exc).strip()[:2000],
            traceback=traceback.format_exc()[-4000:],
        )
        return 1
    if w.dist is not None and w.dist.is_initialized():
        w.dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
