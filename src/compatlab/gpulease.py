"""GPU leases: two cells never use one GPU at once, however many run side by side.

A cell's GPU stages (cuda: one GPU; serve: the target's tensor-parallel size; perf and nccl: every GPU) each
take a lease on that many GPUs of the machine before they start and give it back when they end. A lease is
an exclusive ``flock`` on one file per GPU in a folder of the machine (``$COMPATLAB_LEASES``, default
``/tmp/compatlab-gpu-leases-<uid>``), so it holds across every lab process on the box (the cells of one
``nox -s matrix -- -j N``, and two runs started by two people), and the kernel drops it when its holder dies,
``kill -9`` included: no lease outlives its cell. A stage takes all its GPUs or none (it never holds some
while it waits for others, so two waiters cannot block each other), waits with a line that names who holds
them, and runs with ``CUDA_VISIBLE_DEVICES`` set to its GPUs.

Every lease taken is appended to ``leases.jsonl`` in the folder (gpu, holder, start, end, waited), which is
how a test proves no two stages shared a GPU. ``$COMPATLAB_GPUS`` sets the machine's GPU count where
``nvidia-smi`` cannot say (a stand-in for tests); otherwise ``nvidia-smi -L`` counts them, and a machine
without GPUs gives leases of nothing (its GPU stages skip themselves).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from compatlab.errors import LabError, UsageError
from compatlab.incell.proc import run

__all__ = ["GPU_STAGES", "Lease", "gpu_count", "lease", "lease_dir"]

# The stages that use GPUs, and how many each needs: a number, "tp" (the target's tensor-parallel size) or "all".
# perf is "all": its servers' argv ([perf.servers]) say their own tensor-parallel size, and a throughput figure
# must not share a GPU with another cell.
GPU_STAGES: dict[str, str] = {"cuda": "1", "serve": "tp", "perf": "all", "nccl": "all"}
_POLL = 0.5
_SAY_EVERY = 30.0


@dataclasses.dataclass(frozen=True, slots=True)
class Lease:
    """The GPUs a stage holds (their indexes) and how long it waited for them."""

    gpus: tuple[int, ...]
    waited_s: float

    @property
    def visible(self) -> str:
        return ",".join(str(g) for g in self.gpus)


def lease_dir() -> Path:
    given = os.environ.get("COMPATLAB_LEASES")
    return Path(given) if given else Path(tempfile.gettempdir()) / f"compatlab-gpu-leases-{os.getuid()}"


def gpu_count() -> int:
    """The machine's GPUs: ``$COMPATLAB_GPUS``, else ``nvidia-smi -L``'s lines, else 0."""
    given = os.environ.get("COMPATLAB_GPUS")
    if given is not None:
        if not given.isdigit() or int(given) > 1024:
            raise UsageError(f"COMPATLAB_GPUS={given!r}: a GPU count from 0 to 1024 is expected")
        return int(given)
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0
    done = run([smi, "-L"], timeout=60)
    return sum(1 for line in done.stdout.splitlines() if line.startswith("GPU ")) if done.ok else 0


def _holder(fd: int) -> str:
    try:
        return os.pread(fd, 512, 0).decode("utf-8", "replace").strip() or "another lab process"
    except OSError:
        return "another lab process"


@contextlib.contextmanager
def lease(
    count: int,
    holder: str,
    *,
    total: int | None = None,
    say: Callable[[str], None] | None = None,
    folder: Path | None = None,
) -> Iterator[Lease]:
    """Hold *count* of the machine's *total* GPUs (all or none) until the block ends; *holder* names this
    stage in the waiting lines of others (``cell torch2.9.1-… serve``). *count* 0 holds nothing."""
    total = gpu_count() if total is None else total
    count = min(count, total)
    if count <= 0:
        yield Lease(gpus=(), waited_s=0.0)
        return
    where = folder or lease_dir()
    try:
        where.mkdir(parents=True, exist_ok=True, mode=0o700)
        fds = [os.open(where / f"gpu{i}.lock", os.O_RDWR | os.O_CREAT, 0o600) for i in range(total)]
    except OSError as exc:
        raise LabError(
            f"{where}: the GPU lease folder cannot be written ({exc.strerror or exc}); set COMPATLAB_LEASES to a "
            "folder this user can write, the same for every lab process on the machine"
        ) from None
    start = time.monotonic()
    said = start - _SAY_EVERY
    held: list[int] = []
    try:
        while True:
            held = []
            for i, fd in enumerate(fds):
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue
                held.append(i)
                if len(held) == count:
                    break
            if len(held) == count:
                break
            for i in held:  # all or none: never hold some while waiting for the rest
                fcntl.flock(fds[i], fcntl.LOCK_UN)
            now = time.monotonic()
            if say is not None and now - said >= _SAY_EVERY:
                busy = sorted({_holder(fd) for i, fd in enumerate(fds) if i not in held})
                say(f"waiting for {count} of {total} GPUs ({now - start:.0f} s): held by {'; '.join(busy)}")
                said = now
            time.sleep(_POLL)
        for i in held:
            os.ftruncate(fds[i], 0)
            os.pwrite(fds[i], f"{holder} (pid {os.getpid()})".encode(), 0)
        got = Lease(gpus=tuple(held), waited_s=round(time.monotonic() - start, 3))
        began = time.time()
        try:
            yield got
        finally:
            record = {"gpus": list(got.gpus), "holder": holder, "start": began, "end": time.time()}
            with contextlib.suppress(OSError), open(where / "leases.jsonl", "a", encoding="utf-8") as log:
                log.write(json.dumps({**record, "waited_s": got.waited_s}) + "\n")
            for i in held:
                with contextlib.suppress(OSError):
                    os.ftruncate(fds[i], 0)
    finally:
        for fd in fds:
            os.close(fd)  # closing drops the flock
