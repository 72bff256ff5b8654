"""The NCCL suite's figures and verdict: nccl-tests' arithmetic, the report collected from the ranks' output
(model.py's NcclReport), and how a run is judged."""

from __future__ import annotations

import re
import statistics
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from compatlab.incell.nccl_worker import GIB, MIB, OPS, human_bytes
from compatlab.runs.model import StageState
from compatlab.stages.nccl.model import NcclReport

if TYPE_CHECKING:
    from compatlab.config.nccl import NcclThresholds
    from compatlab.stages.nccl.ranks import RankProcess


# The arithmetic is nccl-tests' (GB = 1e9 bytes).


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


def _sig(x: float, digits: int = 5) -> float:
    return float(f"{x:.{digits}g}")


def collect_report(
    ranks: list[RankProcess],
    report: NcclReport,
    *,
    ops: list[str],
    dtypes: list[str],
    counts: list[int],
    sizes: Sequence[int],
) -> None:
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
                got = {
                    r.rank: c
                    for r in ranks
                    for c in r.checks
                    if (c["op"], c["dtype"], c["count"]) == (op, dtype, count)
                }
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
                        msg = (
                            f"{where}: element {c['index']} expected {c['expected']}, got {c['got']} "
                            f"({c['mismatches']} of {c['elements']} elements differ)"
                        )
                    failures.append(
                        {**{k: v for k, v in c.items() if k not in ("event", "t")}, "rank": rank, "message": msg}
                    )
                report.correctness.append(
                    {
                        "op": op,
                        "dtype": dtype,
                        "count": count,
                        "ok": not failures and len(got) == n,
                        "ranks": len(got),
                        "failures": failures,
                    }
                )
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
                "bytes": nbytes,
                "time_us": _sig(med * 1e6),
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


def judge_report(report: NcclReport, thresholds: NcclThresholds | None) -> None:
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
        report.state, report.reason = StageState.FAIL, reason
        return
    if report.hang is not None:
        h = report.hang
        culprits = h["ranks"]
        where = "; ".join(f"rank {r} at {h['where'].get(r) or 'unknown place'}" for r in culprits)
        others = sorted(set(h["where"]) - set(culprits))
        waiting = f" ({_ranks(others)} waiting)" if others else ""
        report.state = StageState.FAIL
        report.reason = f"hang in {h['phase']} after {h['timeout_s']:g} s: {where}{waiting}"
        return
    missing = [s["rank"] for s in report.ranks if not s["done"]]
    if missing:  # exited 0 without saying done: treat as a crash we could not classify
        report.state, report.reason = StageState.ERROR, f"ranks {missing} exited without finishing"
        return
    failures = report.failures
    if failures:
        more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
        report.state, report.reason = StageState.FAIL, f"wrong result: {failures[0]}{more}"
        return
    if thresholds is not None and thresholds.min_busbw_gbps is not None:
        floor = thresholds.min_busbw_gbps
        ar = report.sweep.get("all_reduce")
        if report.world_size == 1:
            report.threshold = {
                "min_busbw_gbps": floor,
                "judged": False,
                "why": "busbw is 0 by definition with one rank",
            }
        elif not ar:
            report.threshold = {"min_busbw_gbps": floor, "judged": False, "why": "all_reduce not measured"}
        else:
            size = max(ar)
            got = ar[size]["busbw_gbps"]
            ok = got >= floor
            report.threshold = {
                "min_busbw_gbps": floor,
                "judged": True,
                "ok": ok,
                "size_bytes": size,
                "busbw_gbps": got,
                "source": thresholds.source,
            }
            if not ok:
                report.state = StageState.FAIL
                report.reason = (
                    f"all_reduce busbw {got:.1f} GB/s at {human_bytes(size)} is below "
                    f"the floor of {floor:g} GB/s ({thresholds.source})"
                )
                return
    report.state = StageState.PASS
    bw = f", all_reduce busbw {report.busbw_gbps:.1f} GB/s" if report.busbw_gbps is not None else ""
    checks = len(report.correctness)
    report.reason = f"{report.world_size} ranks ({report.backend}): {checks} checks right{bw}"
