"""The NCCL suite's parent side of each rank: its events, its stacks, and the watch over all of them."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from compatlab.incell.nccl_worker import PHASES

if TYPE_CHECKING:
    from compatlab.config.nccl import NcclTimeouts
    from compatlab.stages.nccl.model import NcclReport

_POLL = 0.05


@dataclasses.dataclass(kw_only=True, slots=True)
class RankProcess:
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
            "rank": self.rank,
            "pid": self.proc.pid,
            "returncode": rc,
            "signal": _signal_name(rc),
            "phase": self.phase,
            "step": self.label,
            "done": self.done,
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


def _capture_stacks(ranks: Sequence[RankProcess], wait: float) -> dict[int, dict[str, str]]:
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


def watch_ranks(ranks: list[RankProcess], timeouts: NcclTimeouts, report: NcclReport) -> None:
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
                    report.notes.append(f"rank {r.rank} finished but did not exit within {timeouts.grace:g} s; killed")
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
                "phase": phase,
                "timeout_s": timeouts.phase(phase),
                "ranks": culprits,
                "where": {r.rank: stacks[r.rank]["where"] for r in stuck},
                "steps": {r.rank: {"phase": r.phase, "steps": r.steps, "step": r.label} for r in stuck},
                "stacks": stacks,
            }
            return
        time.sleep(_POLL)
