"""The serve stage: the cell's own SGLang serves the target's architecture on the GPU, baseline and EAGLE-3.

What breaks a box owner's day happens after import, when SGLang starts: a kernel JIT that fails, an
attention or MoE kernel without code for the GPU, CUDA-graph capture, the EAGLE-3 draft path, a module
SGLang imports at start. So each live cell starts ``python -m sglang.launch_server --load-format dummy``
with its own interpreter on a model made from ``[serve]`` (see ``model.py``), twice: a baseline and
``--speculative-algorithm EAGLE3`` with a draft. Each server, in its own process group:

1. becomes healthy (``/health_generate`` 200 after SGLang's own warm-up) within ``startup-timeout``;
2. ``/server_info`` shows EAGLE3 on the one and no speculation on the other;
3. ``/generate`` streams exactly ``output-len`` tokens for every request, at each concurrency level;
4. ``/flush_cache`` answers 200;
5. is stopped (SIGTERM, then SIGKILL to the group) and waited for until the port is free.

The verdict: pass when both servers do all of it. fail names the cause from the server's own log (the
root exception and the package it came from, see ``causes.py``). error for what is not the stack's
fault: a time-out, out of GPU memory, a port in use, a model file [serve] names that is not there, an
answer the lab cannot believe (JSON of the wrong shape, over a size cap, a token count other than asked:
``compatlab.net``, ``sglang/client.py``).
What SGLang compiles at start is cached per exact stack, driver and arch (``jit_cache``), shared by the two
servers, and kept between runs that passed: a second run pays no JIT.
Figures (start-up seconds, GPU memory, tok/s and TTFT at each level) are those of the stack's kernels on
random weights: a random draft accepts about one token a step, so there is no speedup verdict here
(that is ``nox -s gpu8_perf``'s, on real weights). Without a GPU the stage does not run and says so
(the cell stays partial); a cell without SGLang has nothing to serve (not required).
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import logging
import os
import re
import shutil
import statistics
import tempfile
import time
from collections.abc import Sequence
from email.parser import HeaderParser
from pathlib import Path
from typing import Any

from compatlab import net
from compatlab.config.perf import ServerSpec, load_prompts
from compatlab.config.serve import ServeConfig
from compatlab.incell.files import read_text
from compatlab.incell.proc import run
from compatlab.proc import default_cache_dir
from compatlab.runs.model import StageResult, StageState
from compatlab.runs.records.serve import ServeDetails
from compatlab.stages.base import CellContext, cell_env, stack_of
from compatlab.stages.bytecode import bytecode_env
from compatlab.stages.serve.causes import Cause, Phase, find_cause
from compatlab.stages.serve.model import ModelFiles, SetupError, make_model
from compatlab.stages.sglang.client import LevelResult, Target, run_level
from compatlab.stages.sglang.server import ServerFailure, ServerProcess, check_speculation, group_members

__all__ = ["Gpu", "logged_accept_length", "probe_gpus", "run_serve_stage"]

log = logging.getLogger(__name__)

SERVERS = ("baseline", "eagle3")
_BEFORE_MODEL = (Phase.IMPORT, Phase.START)  # a baseline failing there fails EAGLE-3 the same way
# As on the GPU box's NCCL: NVLink multicast off (SGLang's custom all-reduce and symmetric memory use it).
_ENV = {"PYTHONUNBUFFERED": "1", "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Gpu:
    index: int
    name: str
    arch: str  # sm_90
    memory_mib: int


def probe_gpus(env: dict[str, str]) -> tuple[list[Gpu], str]:
    """The GPUs ``nvidia-smi`` (on the cell's PATH) lists, and why there are none when there are none."""
    smi = shutil.which("nvidia-smi", path=env.get("PATH"))
    if smi is None:
        return [], "no NVIDIA GPU on this machine (no nvidia-smi on PATH)"
    done = run(
        [smi, "--query-gpu=index,name,compute_cap,memory.total", "--format=csv,noheader,nounits"], timeout=60, env=env
    )
    if not done.ok:
        first = (done.stderr or done.stdout).strip().splitlines()[:1]
        return [], f"no usable NVIDIA GPU on this machine (nvidia-smi: {first[0] if first else done.returncode})"
    gpus = []
    for line in done.stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 4:
            continue
        try:
            major, minor = parts[2].split(".")
            gpus.append(
                Gpu(
                    index=int(parts[0]),
                    name=parts[1],
                    arch=f"sm_{int(major)}{int(minor)}",
                    memory_mib=int(float(parts[3])),
                )
            )
        except ValueError:
            continue
    return gpus, "" if gpus else "no NVIDIA GPU on this machine (nvidia-smi lists none)"


def _memory_mib(env: dict[str, str], pgid: int) -> int | None:
    """GPU memory the server's process group holds now, from nvidia-smi's compute apps; None if unknown."""
    smi = shutil.which("nvidia-smi", path=env.get("PATH"))
    if smi is None:
        return None
    done = run([smi, "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"], timeout=60, env=env)
    if not done.ok:
        return None
    members = set(group_members(pgid))
    total, seen = 0, False
    for line in done.stdout.splitlines():
        pid, _, mib = (p.strip() for p in line.partition(","))
        if pid.isdigit() and int(pid) in members:
            seen = True
            total += int(float(mib)) if mib.replace(".", "", 1).isdigit() else 0
    return total if seen else None


def _sglang_version(ctx: CellContext) -> str | None:
    """SGLang's version as the cell's site-packages say; a venv over another one's packages has two."""
    sites = [ctx.site_packages] if ctx.site_packages is not None else []
    sites += sorted(ctx.venv.glob("lib/python3*/site-packages"))
    for meta in sorted(m for site in sites for m in site.glob("sglang-*.dist-info/METADATA")):
        try:  # read_text: a regular file of bounded size only (a FIFO named METADATA is never opened)
            version = HeaderParser().parsestr(read_text(meta), headersonly=True).get("Version")
        except OSError:
            continue
        if version:
            return str(version).strip()
    return None


_ACCEPT_LEN = re.compile(r"accept len: ([0-9]+(?:\.[0-9]+)?)")


def logged_accept_length(lines: Sequence[str]) -> float | None:
    """The last ``accept len: X`` SGLang's scheduler logged (its "Decode batch." line), or None."""
    for line in reversed(lines):
        if m := _ACCEPT_LEN.search(line):
            value = float(m.group(1))
            return value if value > 0 else None
    return None


def _argv(ctx: CellContext, config: ServeConfig, files: ModelFiles, name: str, tp: int) -> list[str]:
    argv = [
        str(ctx.python),
        "-m",
        "sglang.launch_server",
        "--model-path",
        str(files.target),
        "--load-format",
        "dummy",
        "--host",
        "127.0.0.1",
        "--port",
        "{port}",
        "--tp-size",
        str(tp),
        *config.args,
    ]
    if name == "eagle3":
        assert files.draft is not None
        argv += [
            "--speculative-algorithm",
            "EAGLE3",
            "--speculative-draft-model-path",
            str(files.draft),
            *config.eagle3_args,
        ]
    return argv


class _Failed(Exception):
    """A server's verdict other than pass: its state, reason and the cause read from its log."""

    def __init__(self, state: StageState, reason: str, cause: Cause | None = None) -> None:
        super().__init__(reason)
        self.state = state
        self.reason = reason
        self.cause = cause


def _explain(server: ServerProcess, failure: ServerFailure, arch: str) -> _Failed:
    """A ServerFailure as the stage says it: the log's cause when it shows one, else the failure itself."""
    try:
        text = server.log_path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    cause = find_cause(text, arch=arch)
    name = server.spec.name
    if cause is None:
        last = next((line.strip() for line in reversed(failure.tail.splitlines()) if line.strip()), "")
        return _Failed(failure.state, f"{failure}; its log's last line: {last[:200]}" if last else str(failure))
    if (
        failure.state == StageState.ERROR
        and cause.state == StageState.FAIL
        and server.proc is not None
        and server.proc.poll() is None
    ):
        # Alive but not healthy, with an exception in its log: a child died and the launcher waits.
        return _Failed(StageState.FAIL, f"{name} server: {cause.reason} (it never became healthy)", cause)
    return _Failed(
        cause.state if failure.state == StageState.FAIL else StageState.ERROR, f"{name} server: {cause.reason}", cause
    )


def _level(server: ServerProcess, config: ServeConfig, prompts: list[str], concurrency: int) -> LevelResult:
    level = run_level(
        Target(port=server.port),
        prompts,
        concurrency=concurrency,
        requests=concurrency * config.requests,
        output_len=config.output_len,
        timeout=config.request_timeout,
        idle=min(config.request_timeout, 120.0),
    )
    name = server.spec.name
    if level.errors:
        first = level.errors[0]
        time.sleep(0.2)  # a dying server may need a moment to be reaped
        died = server.died(f"at concurrency {concurrency} ({first.error})")
        if died:
            raise died
        # The client checks every count against output-len: one it cannot believe is the server's error.
        raise _Failed(
            StageState.ERROR if first.untrusted else StageState.FAIL,
            f"{name} server failed a request at concurrency {concurrency}: {first.error[:300]}",
        )
    return level


def _serve(
    ctx: CellContext,
    config: ServeConfig,
    files: ModelFiles,
    name: str,
    *,
    tp: int,
    arch: str,
    env: dict[str, str],
    out: Path,
    prompts: list[str],
) -> dict[str, Any]:
    """One server's life; its record. Raises _Failed."""
    spec = ServerSpec(
        name=name,
        argv=(),
        startup_timeout=config.startup_timeout,
        stop_timeout=60.0,
        release_timeout=120.0,
        health="/health_generate",
    )
    server = ServerProcess(spec, _argv(ctx, config, files, name, tp), env, out / "logs" / f"{name}.log")
    record: dict[str, Any] = {"log": str(server.log_path), "port": server.port}
    try:
        with server:
            record["pid"] = server.pid
            start = time.monotonic()
            info = server.wait_ready()
            record["startup_s"] = round(time.monotonic() - start, 2)
            record["model"] = info.get("model_path")
            check_speculation(server, name, record, argv_key="serve (the lab's own launch arguments)")
            record["gpu_memory_mib"] = _memory_mib(env, server.pid)
            for c in config.concurrency:
                level = _level(server, config, prompts, c)
                record[f"tok_s_c{c}"] = round(level.tok_s, 2)
                record[f"median_ttft_ms_c{c}"] = round(statistics.median(level.ttfts) * 1000, 2)
                itls = level.itls
                record[f"median_itl_ms_c{c}"] = round(statistics.median(itls) * 1000, 3) if itls else None
            if name == "eagle3":
                # Before /flush_cache, which resets SGLang's lifetime figure; else the scheduler's last logged
                # "accept len: X" line, which the flush does not take back.
                value, why = server.server_accept_length()
                source = "/server_info"
                if value is None:
                    value = logged_accept_length(server.tail(400).splitlines())
                    source = "the server's log" if value is not None else (why or "not reported")
                record["accept_length"], record["accept_length_source"] = value, source
            try:
                server.flush_cache("after the requests")
            except ServerFailure as refused:  # the server is up and idle: refusing is the stack's own failure
                raise _Failed(StageState.FAIL, str(refused)) from None
        if server.leftover:
            raise _Failed(StageState.ERROR, server.leftover)
    except ServerFailure as failure:
        raise _explain(server, failure, arch) from None
    except (OSError, net.HttpError) as exc:
        raise _Failed(StageState.ERROR, f"{name} server: the lab's client failed: {exc}") from None
    finally:
        record["exit"] = server.returncode
        record["log_tail"] = server.tail(20)
    return record


def _tp(ctx: CellContext, config: ServeConfig, gpus: list[Gpu]) -> tuple[int, str | None]:
    want = config.tp_size(t.gpus for t in ctx.matrix.targets)
    if want <= len(gpus):
        return want, None
    return len(gpus), (f"the target has {want} GPUs, this machine {len(gpus)}: served with --tp-size {len(gpus)}")


def _figures(records: dict[str, dict[str, Any]]) -> dict[str, float]:
    figures: dict[str, float] = {}
    for name, rec in records.items():
        for key, value in rec.items():
            if (
                key.startswith(("tok_s_", "median_")) or key in ("startup_s", "gpu_memory_mib", "accept_length")
            ) and isinstance(value, (int, float)):
                figures[f"{name}_{key}"] = value
    return figures


# The JIT caches of what SGLang compiles at start (Triton's kernels, torch.compile's, flashinfer's JIT, the
# driver's PTX cache), one folder per exact stack (every distribution and version), driver and GPU arch.
_CACHE_VARS = {
    "TRITON_CACHE_DIR": "triton",
    "TORCHINDUCTOR_CACHE_DIR": "inductor",
    "FLASHINFER_WORKSPACE_BASE": "flashinfer",
    "CUDA_CACHE_PATH": "cuda",
}
_COMPLETE = ".compatlab-complete"


def _driver(env: dict[str, str]) -> str:
    smi = shutil.which("nvidia-smi", path=env.get("PATH"))
    if smi is None:
        return "unknown"
    done = run([smi, "--query-gpu=driver_version", "--format=csv,noheader"], timeout=60, env=env)
    first = done.stdout.strip().splitlines()[:1] if done.ok else []
    return first[0].strip() if first and re.fullmatch(r"\d+(\.\d+)+", first[0].strip()) else "unknown"


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class JitCache:
    """Where one stack's JIT caches live, and what they held when the servers started.

    The stack's folder is held (``flock`` on ``<key>.lock`` beside it) from here to ``finish``: a second run
    of the very same stack at that time (two runs of ``compatlab check`` on one environment, a check beside a
    matrix cell) would otherwise empty it as unfinished under the first one's servers, or drop it when it
    fails. That second run compiles in a folder of its own instead (``busy``), held (``flock`` on the folder)
    until it is removed at its end; one whose run was killed first is removed by the next serve stage there
    (``swept``)."""

    root: Path
    key: str
    reused_files: int  # files in it from earlier runs of this very stack that ended well
    lock: int | None = None  # the held lock's descriptor (not inherited by the servers), closed by finish
    busy: bool = False  # another run held the stack's folder: this one's is its own, never kept
    swept: int = 0  # busy folders of runs that ended before removing theirs, removed here

    def env(self) -> dict[str, str]:
        return {var: str(self.root / sub) for var, sub in _CACHE_VARS.items()}

    def files(self) -> int:
        return sum(1 for p in self.root.rglob("*") if p.is_file() and p.name != _COMPLETE)

    def finish(self, ok: bool) -> dict[str, Any]:
        """Keep it for the next run when both servers did all they must; else drop it (it may be partial)."""
        added = self.files() - self.reused_files
        keep = ok and not self.busy
        try:
            if keep:
                (self.root / _COMPLETE).write_text(self.key + "\n", encoding="utf-8")
            else:
                shutil.rmtree(self.root, ignore_errors=True)
        finally:
            if self.lock is not None:
                os.close(self.lock)
        return {
            "path": str(self.root),
            "key": self.key,
            "reused_files": self.reused_files,
            "compiled_files": max(added, 0),
            "kept": keep,
            **({"busy": True} if self.busy else {}),
            **({"swept": self.swept} if self.swept else {}),
        }


_BUSY = "-busy-"
_BUSY_GRACE_S = 60.0  # a busy folder this young may not be held yet (made, then locked): never swept


def _sweep_busy(base: Path) -> int:
    """Remove the busy folders under *base* that no run holds (theirs was killed before its ``finish``); how
    many were removed."""
    swept = 0
    try:
        entries = [e for e in os.scandir(base) if e.name.startswith(".") and _BUSY in e.name]
    except OSError:
        return 0
    for entry in entries:
        try:
            if not entry.is_dir(follow_symlinks=False) or time.time() - entry.stat().st_mtime < _BUSY_GRACE_S:
                continue
            fd = os.open(entry.path, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # held: its run is still serving
        else:
            shutil.rmtree(entry.path, ignore_errors=True)
            swept += 1
        finally:
            os.close(fd)
    return swept


def jit_cache(ctx: CellContext, arch: str, env: dict[str, str]) -> JitCache:
    """The stack's cache folder: under the venvs folder for a matrix cell (``ctx.caches``: kept across runs,
    pruned with the venvs), under ``$COMPATLAB_CACHE`` for an existing environment. One that an earlier run
    left unfinished (its servers failed, or it was killed) is emptied: a cache is used only as a run that
    ended well left it. Held until ``finish``; one another run holds is not touched (``JitCache.busy``)."""
    key = hashlib.sha256(f"{stack_of(ctx)}\n{_driver(env)}\n{arch}".encode()).hexdigest()[:16]
    base = ctx.caches / ".jit-cache" if ctx.caches is not None else default_cache_dir() / "jit"
    base.mkdir(parents=True, exist_ok=True)
    swept = _sweep_busy(base)
    lock = os.open(base / f"{key}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(lock)
        own = Path(tempfile.mkdtemp(prefix=f".{key}{_BUSY}", dir=base))
        held = os.open(own, os.O_RDONLY | os.O_DIRECTORY)
        fcntl.flock(held, fcntl.LOCK_EX)  # not yet swept: it is younger than the grace
        return JitCache(root=own, key=key, reused_files=0, lock=held, busy=True, swept=swept)
    except OSError:
        os.close(lock)
        raise
    try:
        root = base / key
        stamp = root / _COMPLETE
        if root.exists() and not (stamp.is_file() and stamp.read_text(encoding="utf-8").strip() == key):
            shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True, exist_ok=True)
        if stamp.exists():
            stamp.unlink()  # until this run ends well
        cache = JitCache(root=root, key=key, reused_files=0, lock=lock, swept=swept)
        return dataclasses.replace(cache, reused_files=cache.files())
    except BaseException:
        os.close(lock)
        raise


def run_serve_stage(ctx: CellContext) -> StageResult:
    """Serve the target's architecture with the cell's SGLang: baseline, then EAGLE-3 (see the module)."""
    start = time.monotonic()

    def result(state: StageState, reason: str, details: dict[str, Any], *, required: bool = True) -> StageResult:
        return StageResult(
            name="serve",
            state=state,
            reason=reason,
            details=details,
            seconds=round(time.monotonic() - start, 3),
            required=required,
        )

    version = _sglang_version(ctx)
    if version is None:
        return result(StageState.SKIP, "skipped: the cell has no SGLang to serve with", {}, required=False)
    # Bytecode compiled once for both servers, kept outside the environment (bytecode.py): from source, each
    # of a server's processes paid ~20 s of its start-up.
    env = bytecode_env(ctx, cell_env(ctx.venv, _ENV))
    gpus, why = probe_gpus(env)
    if not gpus:
        return result(
            StageState.SKIP,
            f"skipped: {why}; SGLang {version} was not started",
            ServeDetails(sglang=version).to_details(),
        )
    config = ctx.matrix.serve
    tp, fewer = _tp(ctx, config, gpus)
    out = ctx.work_dir / "serve"
    notes: list[str] = [fewer] if fewer else []
    servers: dict[str, dict[str, Any]] = {}
    found = ServeDetails(
        sglang=version,
        gpus=tuple(dataclasses.asdict(g) for g in gpus),
        tp=tp,
        notes=(),
        servers={},
        weights="random (--load-format dummy): figures of the kernels, no speedup "
        "verdict (a random draft accepts about one token a step)",
    )

    def details() -> dict[str, Any]:
        return dataclasses.replace(found, notes=tuple(notes), servers=servers).to_details()

    try:
        files = make_model(
            out / "model",
            model=config.model,
            layers=config.layers,
            tokenizer=config.tokenizer,
            draft=config.draft,
            draft_layers=config.draft_layers,
            eagle3=config.eagle3,
        )
    except SetupError as exc:
        return result(StageState.ERROR, f"the serve model could not be made: {exc}", details())
    found = dataclasses.replace(
        found, architecture=files.architecture, layers=files.layers, model_notes=tuple(files.notes)
    )
    prompts = load_prompts()
    arch = gpus[0].arch
    cache: JitCache | None = None
    try:
        cache = jit_cache(ctx, arch, env)
        env = {**env, **cache.env()}
        if cache.busy:
            notes.append(
                "the stack's JIT cache is in use by another run of this very stack: the servers compile in a "
                "folder of their own, dropped at the end"
            )
        if cache.swept:
            notes.append(
                f"removed {cache.swept} JIT cache folder(s) that runs killed while serving left under "
                f"{cache.root.parent}"
            )
    except OSError as exc:  # an unwritable cache folder costs the JIT again, never the verdict
        where = f"{exc.filename}: " if exc.filename else ""
        notes.append(f"no JIT cache ({where}{exc.strerror or exc}): the servers compile afresh")
    failures: list[_Failed] = []
    for name in SERVERS if config.eagle3 else SERVERS[:1]:
        log.info(
            "serve: %s server (SGLang %s, %s, %d layers, tp %d)", name, version, files.architecture, files.layers, tp
        )
        try:
            servers[name] = _serve(ctx, config, files, name, tp=tp, arch=arch, env=env, out=out, prompts=prompts)
        except _Failed as failed:
            servers[name] = {
                "state": failed.state,
                "reason": failed.reason,
                **({"cause": dataclasses.asdict(failed.cause)} if failed.cause else {}),
                "log": str(out / "logs" / f"{name}.log"),
            }
            failures.append(failed)
            if failed.state == StageState.ERROR:
                break  # a time-out or the machine's fault: the next server would meet it again
            if name == "baseline" and failed.cause is not None and failed.cause.phase in _BEFORE_MODEL:
                # The same interpreter, the same imports, nothing of the draft yet: EAGLE-3 would fail the same
                # way after the same ~30 s of SGLang's own import. Not started, and said so.
                skipped = (
                    f"eagle3 server not started: the baseline failed at {failed.cause.phase}, before the model "
                    "loads, where EAGLE-3 starts the same way"
                )
                servers["eagle3"] = {"state": StageState.SKIP, "reason": skipped}
                failures.append(_Failed(StageState.SKIP, skipped))
                break
    figures = _figures({n: r for n, r in servers.items() if "state" not in r})
    if cache is not None:
        kept = cache.finish(not failures)
        found = dataclasses.replace(found, jit_cache=kept)
        if not failures:
            figures["jit_cache_reused_files"] = cache.reused_files
            figures["jit_cache_compiled_files"] = kept["compiled_files"]
    found = dataclasses.replace(found, figures=figures)
    if failures:
        first = next((f for f in failures if f.state == StageState.FAIL), failures[0])
        if len(failures) == 2 and failures[1].state == StageState.SKIP:
            return result(first.state, f"{first.reason}; {failures[1].reason}", details())
        if len(failures) == len(SERVERS) and len({f.reason.split(" server: ", 1)[-1] for f in failures}) == 1:
            return result(first.state, "both servers: " + first.reason.split(" server: ", 1)[-1], details())
        others = [f.reason for f in failures if f is not first]
        more = f"; also {others[0]}" if others else ""
        return result(first.state, first.reason + more, details())
    served = servers
    parts = [
        f"{n} {served[n].get('tok_s_c1', 0):.0f} tok/s c1"
        + (f", {served[n][f'tok_s_c{c}']:.0f} c{c}" if (c := config.concurrency[-1]) != 1 else "")
        + f" (start-up {served[n]['startup_s']:.0f} s)"
        for n in served
    ]
    return result(
        StageState.PASS,
        f"SGLang {version} serves {files.architecture} ({files.layers} layers, tp {tp}, dummy "
        f"weights): {'; '.join(parts)}",
        details(),
    )
