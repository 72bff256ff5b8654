"""import stage: every extension module of the stack, loaded in its own process with the cell's interpreter.

Runs inside the cell (see conftest.py). Each extension module is loaded by file path after ``import torch``,
as its package would load it, in a child forked from one interpreter that has imported torch once
(compatlab.incell.forkserver); with COMPATLAB_IMPORT_FORKSERVER=0, or when that interpreter cannot import torch, in
a fresh interpreter each. Either way two builds of one module (sgl_kernel's sm90/ and sm100/) never share a
process, and a crash or a hang takes only its own process down. On a machine with no NVIDIA driver a
stand-in libcuda.so.1 answers CUDA_ERROR_NO_DEVICE, so an ABI break still shows.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import fnmatch
import importlib.metadata
import json
import os
import re
import shutil
import sys
import tempfile
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from compatlab.incell import fakecuda, forkserver, loadcheck, reach
from compatlab.incell.context import SuiteContext, TargetInfo
from compatlab.incell.entries import ImportEntry
from compatlab.incell.proc import Completed

_DRIVER_SYMBOL = re.compile(r"^cu[A-Z][A-Za-z0-9_]*$")


def _jobs(*, fork: bool) -> int:
    """Loads at a time: $COMPATLAB_IMPORT_JOBS, else one a core (at most 16) for forked children (they share
    the server's memory), half the cores (at most 4) for fresh interpreters (each imports torch again)."""
    try:
        return max(1, int(os.environ.get("COMPATLAB_IMPORT_JOBS", "")))
    except ValueError:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 2
        return max(1, min(16, cpus) if fork else min(4, cpus // 2))


def _ignored(label: str, targets: Sequence[TargetInfo]) -> bool:
    """True when every target says this module need not run there (e.g. sm100/ builds on an H100 box)."""
    if not targets:
        return False
    return all(any(fnmatch.fnmatch(label, g) for g in t.not_needed) for t in targets)


class _Driver:
    """The real driver, or a stand-in grown on demand with the driver symbols the modules import."""

    def __init__(self, work_dir: str | None, elf_files: list[str]) -> None:
        self.cache = fakecuda.cache_dir(work_dir)
        self.real = fakecuda.real_driver()
        self.problem = ""
        self.lib_dir: Path | None = None
        self.symbols: set[str] = set()
        self._lock = threading.Lock()
        if self.real is None:
            self.symbols = fakecuda.driver_symbols(elf_files)
            self._build()

    def _build(self) -> None:
        try:
            self.lib_dir = fakecuda.build_stand_in(self.symbols, self.cache)
        except fakecuda.StandInError as exc:
            self.problem, self.lib_dir = str(exc), None

    def add(self, symbol: str) -> bool:
        """Grow the stand-in by one symbol it lacked; False when that cannot help."""
        with self._lock:
            if symbol in self.symbols:
                return True  # another load added it meanwhile
            if self.lib_dir is None or not _DRIVER_SYMBOL.match(symbol):
                return False
            self.symbols.add(symbol)
            self._build()
            return self.lib_dir is not None

    def env(self) -> dict[str, str]:
        base = dict(os.environ)
        return fakecuda.stand_in_env(self.lib_dir, base) if self.lib_dir is not None else base

    def describe(self) -> str:
        if self.real is not None:
            return f"real ({self.real})"
        if self.lib_dir is not None:
            return fakecuda.STAND_IN
        return f"none ({self.problem})"


class _Loader:
    """Loads one target in a child of a fork server (one per build of the stand-in), else in a fresh process."""

    def __init__(self, driver: _Driver, pre: list[str], timeout: float, *, fork: bool) -> None:
        self.driver = driver
        self.pre = pre
        self.timeout = timeout
        self.fork = fork
        self.servers: dict[str, forkserver.ForkServer | None] = {}
        # The servers that adopt packages (forkserver's docstring), tried first; then those above, which
        # adopt nothing and answer what these refuse.
        self.adopting: dict[str, forkserver.ForkServer | None] = {}
        self.own: dict[str, list[str]] = {}  # distribution -> the names of its modules to load
        self.refused = 0
        self.confirmed = 0  # failures in an adopting server's child, asked again of the other
        # A package whose adoption closed a server (it started a thread, or initialised CUDA) is not adopted
        # again: a server adopting what the closed one had, but that, takes over (at most _REPLACEMENTS).
        self.unadoptable: set[str] = set()
        self.retired: list[forkserver.ForkServer] = []
        self._replacing: list[threading.Thread] = []
        # Servers started with the loader's log on (LD_DEBUG), for c_level: (server or None, its log folder).
        self.watched: dict[str, tuple[forkserver.ForkServer | None, Path]] = {}
        self.problems: list[str] = []
        self._lock = threading.Lock()
        self._starting: threading.Thread | None = None

    def prestart(self) -> None:
        """Start the fork server now, in the background, for the stand-in as it is: the first load finds it
        ready, or waits for it (a grown stand-in starts another)."""
        if self.fork:
            self._starting = threading.Thread(target=self._server, args=(self.driver.env(), True), daemon=True)
            self._starting.start()

    def _replace(self, env: dict[str, str], closed: forkserver.ForkServer) -> None:
        """Once per closed adopting server: start, in the background, one that adopts what it had; loads go
        to the server that adopts nothing meanwhile."""
        key = env.get("LD_LIBRARY_PATH", "")
        with self._lock:
            if self.adopting.get(key) is not closed:
                return  # replaced already
            self.adopting[key] = None
            self.retired.append(closed)
            self.unadoptable.add(closed.closed_by)
            if len(self.retired) > _REPLACEMENTS:
                return

        def start() -> None:
            try:
                server: forkserver.ForkServer | None = forkserver.ForkServer.start(
                    sys.executable, preload=self.pre, adopt=closed.adopted, env=env, timeout=self.timeout
                )
            except forkserver.ServerGone as exc:
                server = None
                with self._lock:
                    self.problems.append(f"adopting fork server could not start again ({exc})")
            with self._lock:
                self.adopting[key] = server

        thread = threading.Thread(target=start, daemon=True)
        with self._lock:
            self._replacing.append(thread)
        thread.start()

    def _server(self, env: dict[str, str], adopting: bool = False) -> forkserver.ForkServer | None:
        # The dynamic loader reads LD_LIBRARY_PATH once, at start: a grown stand-in needs a new server.
        key = env.get("LD_LIBRARY_PATH", "")
        servers = self.adopting if adopting else self.servers
        with self._lock:
            if key not in servers:
                try:
                    servers[key] = forkserver.ForkServer.start(
                        sys.executable, preload=self.pre, env=env, timeout=self.timeout
                    )
                except forkserver.ServerGone as exc:
                    # Both kinds start by importing the prerequisites alone: where one could not, the other
                    # cannot either, and is not tried (nor said twice).
                    servers[key] = None
                    (self.servers if adopting else self.adopting).setdefault(key, None)
                    self.problems.append(f"fork server could not start ({exc}): one process per module")
            return servers[key]

    def load(
        self, target: loadcheck.LoadTarget, preload: Sequence[str] = (), *, adopt: bool = False
    ) -> tuple[loadcheck.LoadFailure | None, Completed]:
        """Load *target* after the prerequisites and then the libraries *preload* (absolute paths); *adopt*:
        the adopting server imports the package too, for the loads after it."""
        env = self.driver.env()
        pre = [m for m in self.pre if m != target.name] + list(preload)
        adopting = self._server(env, adopting=True) if self.fork else None
        if adopting is not None:
            try:
                failure, done = adopting.load(
                    path=target.path,
                    name=target.name,
                    pre_import=pre,
                    timeout=self.timeout,
                    own=self.own.get(target.dist, [target.name]),
                    adopt=adopt and target.name not in self.unadoptable,
                )
                if failure is None:
                    return failure, done
                # A failure is the verdict of a process that had imported only the prerequisites: asked
                # again below, whatever the adopted packages changed (what they tried to load, a thread).
                with self._lock:
                    self.confirmed += 1
            except forkserver.Refused:
                with self._lock:
                    self.refused += 1
            except forkserver.ServerGone as exc:  # it died adopting a package: the other answers from now on
                with self._lock:
                    if self.adopting.get(env.get("LD_LIBRARY_PATH", "")) is adopting:
                        self.adopting[env.get("LD_LIBRARY_PATH", "")] = None
                        self.retired.append(adopting)
                        self.problems.append(f"adopting fork server lost ({exc}): the others load the rest")
            finally:
                if adopting.closed:
                    self._replace(env, adopting)
        server = self._server(env) if self.fork else None
        if server is not None:
            try:
                return server.load(path=target.path, name=target.name, pre_import=pre, timeout=self.timeout)
            except forkserver.ServerGone as exc:  # the server itself died, not a child: ask a fresh process
                with self._lock:
                    self.problems.append(f"fork server lost ({exc}): {target.label} loaded in its own process")
        return loadcheck.load_module(
            sys.executable, path=target.path, name=target.name, pre_import=pre, timeout=self.timeout, env=env
        )

    def _watched(self, env: dict[str, str]) -> tuple[forkserver.ForkServer | None, Path]:
        # The loader reads LD_DEBUG once, at start: a server of its own, started with it on. Its children's
        # lines go to the server's log file (the descriptor is inherited), each tagged with the child's pid.
        key = env.get("LD_LIBRARY_PATH", "")
        with self._lock:
            if key not in self.watched:
                log = Path(tempfile.mkdtemp(prefix="compatlab-ld-"))
                try:
                    server: forkserver.ForkServer | None = forkserver.ForkServer.start(
                        sys.executable,
                        preload=self.pre,
                        env={**env, "LD_DEBUG": "files", "LD_DEBUG_OUTPUT": str(log / "ld")},
                        timeout=self.timeout,
                    )
                except forkserver.ServerGone as exc:
                    server = None
                    self.problems.append(f"fork server with the loader's log could not start ({exc})")
                self.watched[key] = (server, log)
            return self.watched[key]

    def _c_level_forked(self, target: loadcheck.LoadTarget, pre: list[str], tmp: Path) -> bool:
        """The load once more in a child of the watched server, its lines of the log copied into *tmp* as
        the fresh interpreter's own file would be (and what it started writes there itself); False when no
        watched server answers."""
        server, log = self._watched(self.driver.env())
        if server is None:
            return False
        own = log / f"ld.{server.pid}"
        start = own.stat().st_size if own.exists() else 0
        try:
            _failure, done = server.load(
                path=target.path,
                name=target.name,
                pre_import=pre,
                timeout=self.timeout,
                environ={"LD_DEBUG_OUTPUT": str(tmp / "ld")},
            )
        except forkserver.ServerGone as exc:
            with self._lock:
                self.problems.append(f"fork server with the loader's log lost ({exc})")
            return False
        tag = re.compile(rf"^\s*{done.pid}:")
        with own.open("rb") as file:
            file.seek(start)
            mine = [line for line in file.read().decode("utf-8", "replace").splitlines() if tag.match(line)]
        (tmp / f"ld.{done.pid}").write_text("\n".join(mine) + "\n", encoding="utf-8")
        return True

    def c_level(self, target: loadcheck.LoadTarget) -> list[tuple[str, str]]:
        """What C code tried to load and could not while *target* loaded, with the loader's log on: in a
        child of a server started with it (its lines of the server's log), else in a fresh interpreter
        (loadcheck.c_level_probe)."""
        pre = [m for m in self.pre if m != target.name]
        with tempfile.TemporaryDirectory(prefix="compatlab-ld-") as tmp:
            if self.fork and self._c_level_forked(target, pre, Path(tmp)):
                found = loadcheck.c_level_failures(Path(tmp), sys.executable)
            else:
                found = loadcheck.c_level_probe(
                    sys.executable,
                    path=target.path,
                    name=target.name,
                    pre_import=pre,
                    timeout=self.timeout,
                    env=self.driver.env(),
                    debug_dir=Path(tmp),
                )
        # Only what the module's own package asked for: another package's optional load (a plugin it
        # looks for and does without) is not why this one failed.
        top = target.label.split("/", 1)[0].split(".", 1)[0]
        return [
            (n, c)
            for n, c in found
            if not n.startswith(loadcheck.DRIVER_LIBS) and _site_label(os.path.realpath(c)).split("/", 1)[0] == top
        ]

    def describe(self) -> str:
        adopting = [s for s in self.adopting.values() if s is not None]
        live = [s for s in self.servers.values() if s is not None]
        if not live and not adopting:
            return "one process per module"
        watched = sum(s is not None for s, _log in self.watched.values())
        said = []
        adopting = [*self.retired, *adopting]
        if adopting:
            closed = [s.closed for s in adopting if s.closed]
            said.append(
                f"fork server: children of {len(adopting)} interpreter(s) that imported "
                f"{', '.join(self.pre) or 'nothing'} once ({adopting[0].seconds:.1f} s), then "
                f"{len(adopting[-1].adopted)} package(s) as their children imported them"
                + (f" (each closed to new children when {'; '.join(closed)}, and one took over)" if closed else "")
            )
            threaded = sorted({n for s in adopting for n in s.threaded})
            if threaded:
                said.append(
                    f"{len(threaded)} of them started threads at import ({', '.join(threaded[:4])}"
                    + (", …)" if len(threaded) > 4 else ")")
                )
        if live:
            said.append(
                f"{'and ' if adopting else 'fork server: '}children of {len(live)} interpreter(s) that imported "
                f"{', '.join(self.pre) or 'nothing'} once ({live[0].seconds:.1f} s)"
                + (
                    f" for {self.refused} load(s) whose own package the first had imported and "
                    f"{self.confirmed} that failed there (a failure is always this one's)"
                    if adopting
                    else ""
                )
            )
        if watched:
            said.append(f"loads again with the loader's log: children of {watched} started with it")
        return "; ".join(said)

    def close(self) -> None:
        if self._starting is not None:
            self._starting.join()  # a server still starting would be left running
        for thread in list(self._replacing):
            thread.join()  # a server still starting would be left running
        for server in [*self.retired, *self.adopting.values(), *self.servers.values()]:
            if server is not None:
                server.close()
        for watched, log in self.watched.values():
            if watched is not None:
                watched.close()
            shutil.rmtree(log, ignore_errors=True)


class _Progress:
    """Every COMPATLAB_PROGRESS_SECONDS (10) while the loads run, a line on the file descriptor the lab
    passed as COMPATLAB_PROGRESS_FD: modules done of all, and the slowest load so far. Nothing without it."""

    def __init__(self, total: int) -> None:
        fd = os.environ.get("COMPATLAB_PROGRESS_FD", "")
        self.fd = int(fd) if fd.isdigit() else None
        try:
            self.every = float(os.environ.get("COMPATLAB_PROGRESS_SECONDS", "10"))
        except ValueError:
            self.every = 10.0
        self.total, self.done, self.slowest = total, 0, ("", 0.0)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> _Progress:
        if self.fd is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def tick(self, loaded: tuple[ImportEntry, list[str] | None]) -> tuple[ImportEntry, list[str] | None]:
        entry = loaded[0]
        with self._lock:
            self.done += 1
            if entry.seconds > self.slowest[1]:
                self.slowest = (entry.module, entry.seconds)
        return loaded

    def _loop(self) -> None:
        last = ""
        while not self._stop.wait(self.every):
            with self._lock:
                line = f"{self.done}/{self.total} modules loaded"
                if self.slowest[0]:
                    line += f", slowest so far {self.slowest[0]} {self.slowest[1]:.1f} s"
            if line == last:
                continue  # nothing moved: a line repeated says nothing
            last = line
            try:
                os.write(self.fd, (line + "\n").encode())  # type: ignore[arg-type]
            except OSError:
                return  # the lab stopped listening


def _load(target: loadcheck.LoadTarget, driver: _Driver, loader: _Loader) -> tuple[ImportEntry, list[str] | None]:
    """The module's entry, and for a package's import the paths of what it mapped (None otherwise)."""
    for _attempt in range(4):
        # A package's import is adopted by the server (its dependents' children start with it); the retries
        # below are not (the server has it by then, and refuses them to the server that adopts nothing).
        failure, done = loader.load(target, adopt=target.path is None and _attempt == 0)
        if failure is not None and failure.kind == "undefined-symbol" and failure.symbol and driver.add(failure.symbol):
            continue  # the stand-in lacked a driver entry point, not the stack a symbol
        break
    by_name, first = False, failure
    if failure is not None and failure.kind in ("import-error", "signal") and target.path is not None:
        # Python refused the module loaded by path beside its package (numpy's _multiarray_umath imports
        # numpy, which loads it again: "cannot load module more than once"), or its init crashed because
        # its package had not set it up first (h5py's defs, jaxlib's MLIR dialects); it linked, so import
        # it by its name, in a process of its own, as its package does. A link failure is never retried.
        again, _done = loader.load(loadcheck.LoadTarget(dist=target.dist, label=target.label, name=target.name))
        if again is None:
            failure, by_name = None, True
    before = None
    sibling = _own_library(target, failure)
    if sibling is not None:
        # It needs a library of its own package that no RUNPATH finds: its package loads that one first
        # (torchaudio's libtorchaudio.so, by torch.ops.load_library), so load it first too. Then the
        # failure, if any, is the library's own (libtorchaudio.so cannot find libcudart.so.12).
        before = first
        failure, _done = loader.load(target, preload=[sibling])
    failed_loads: list[dict[str, Any]] = []
    if target.path is None:
        failure, failed_loads = _judge_attempts(target, failure, loadcheck.attempts_of(done) or [])
    if failure is not None and failure.kind in ("import-error", "exit"):
        # The load failed and said no library: C code may have dlopen()ed one itself, which no Python door
        # sees. The fallback: the load once more with the loader's own log (LD_DEBUG).
        unseen = loader.c_level(target)
        if unseen:
            symptom = failure.message if failure.kind == "import-error" else loadcheck.describe(target.label, failure)
            name, caller = unseen[0]
            step = f"load {target.path}" if target.path is not None else f"import {target.name}"
            failure = loadcheck.c_level_failure(name, caller, step=step, outer=(symptom, *failure.outer))
            failed_loads += [
                {
                    "name": n,
                    "how": "dlopen (C)",
                    "error": f"not loaded; asked by {_site_label(os.path.realpath(c))}",
                    "kind": "missing-library",
                    "cause": loadcheck.c_level_failure(n, c, step="", outer=()).cause,
                    "judged": "cause" if i == 0 else "absent",
                }
                for i, (n, c) in enumerate(unseen)
            ]
    entry = ImportEntry(
        module=target.label,
        dist=target.dist,
        ok=failure is None,
        failed_loads=tuple(failed_loads) or None,
        cause=failure.cause if failure is not None else None,
        preloaded=_site_label(sibling) if sibling is not None else None,
        seconds=round(done.seconds, 2),
        loaded=(
            f"by name (import {target.name}): by path, {loadcheck.describe(target.label, first)}"
            if by_name and first is not None
            else f"after {_site_label(sibling)}, a library of its own package it needs: loaded alone, "
            f"{loadcheck.describe(target.label, before)}"
            if sibling is not None and before is not None and failure is None
            else None
        ),
        failure=failure.to_json() if failure is not None else None,
        reason=_reason(target, failure, failed_loads) if failure is not None else None,
    )
    # What a package's import mapped: reduced to its own distribution's shared objects afterwards.
    return entry, loadcheck.mapped_of(done) if failure is None and target.path is None else None


def _own_library(target: loadcheck.LoadTarget, failure: loadcheck.LoadFailure | None) -> str | None:
    """The file of the module's own top-level package named as the library *failure* could not find
    (``torchaudio/lib/_torchaudio.so`` needs ``libtorchaudio.so``, in the same folder but on no RUNPATH);
    None when the failure is another or the package has no such file."""
    if (
        failure is None
        or failure.kind != "missing-library"
        or target.path is None
        or not failure.library
        or "/" in failure.library
        or "/" not in target.label
    ):
        return None
    real = os.path.realpath(target.path)
    top = Path(real).parent
    for _ in target.label.split("/")[1:-1]:  # up to the top-level folder the label starts with
        top = top.parent
    seen = 0
    for folder, _dirs, files in os.walk(top):
        if failure.library in files:
            found = os.path.join(folder, failure.library)
            return found if "," not in found and os.path.realpath(found) != real else None
        seen += len(files)
        if seen > 20000:  # a package this large is not searched further
            break
    return None


def _reason(target: loadcheck.LoadTarget, failure: loadcheck.LoadFailure, failed_loads: list[dict[str, Any]]) -> str:
    """The entry's one line: for an import whose failed load was the cause, which file and then the symptom."""
    cause = next((f for f in failed_loads if f["judged"] == "cause"), None)
    if cause is None or not failure.outer:
        return loadcheck.describe(target.label, failure)
    said = loadcheck.describe(target.label, failure).removeprefix(target.label)
    return f"{target.label} (it loads {cause['name']}){said}; then {failure.outer[0]}"


def _site_label(path: str) -> str:
    for entry in sorted((e for e in sys.path if e), key=len, reverse=True):
        if path.startswith(entry.rstrip("/") + "/"):
            return path[len(entry.rstrip("/")) + 1 :]
    return path


def _judge_attempts(
    target: loadcheck.LoadTarget, failure: loadcheck.LoadFailure | None, attempts: list[dict[str, Any]]
) -> tuple[loadcheck.LoadFailure | None, list[dict[str, Any]]]:
    """What a package's import tried to load and could not, judged (ImportEntry.failed_loads), and the
    import's failure, told by its real cause where a failed load was it.

    A file of the environment that failed to load is *needed* by the import that tried: when the import
    failed too, the load's error is the cause and the import's own exception the symptom (torchvision's
    ``_C.so`` with an undefined symbol, then "operator torchvision::nms does not exist"); when the import
    worked without it, what needs that library will not (a warning), unless the package loaded another
    build from the same folder right after it (one build per CUDA major, picked at run time: "not-picked").
    A bare name that did not load (``ctypes.CDLL("libfoo.so.1")``) is the package looking for something
    this machine may lack: "absent", the import's own outcome says whether that mattered.
    """
    judged: list[dict[str, Any]] = []
    cause: loadcheck.LoadFailure | None = None
    alternatives = _tried_alternatives(target, failure, attempts)
    for i, attempt in enumerate(attempts):
        lf = loadcheck.classify_attempt(attempt)
        if lf is None:
            continue
        name = str(attempt.get("name", ""))
        real = os.path.realpath(name) if os.path.isabs(name) else ""
        label = _site_label(real) if real else name
        folder = os.path.dirname(real)
        picked = next(
            (
                str(b["name"])
                for b in attempts[i + 1 :]
                if b.get("ok")
                and os.path.isabs(str(b.get("name", "")))
                and real
                and os.path.dirname(os.path.realpath(str(b["name"]))) == folder
            ),
            None,
        )
        if not real or not os.path.isfile(real):
            verdict = "absent"
        elif picked is not None:
            verdict = "not-picked"
        elif failure is not None and lf.stack and folder not in alternatives:
            verdict = "cause"
            cause = cause or lf
        else:
            verdict = "feature"
        judged.append(
            {
                "name": label,
                "how": attempt.get("how", ""),
                "error": str(attempt.get("error", "")),
                "kind": lf.kind,
                "cause": lf.cause,
                "judged": verdict,
                **({"instead": _site_label(os.path.realpath(picked))} if picked else {}),
            }
        )
    if failure is not None and cause is not None and cause.message not in failure.message:
        symptom = failure.message if failure.kind == "import-error" else loadcheck.describe(target.label, failure)
        failure = dataclasses.replace(
            cause, step=f"import {target.name}", outer=(symptom, *failure.outer), raw=failure.raw
        )
    return failure, judged


def _tried_alternatives(
    target: loadcheck.LoadTarget, failure: loadcheck.LoadFailure | None, attempts: list[dict[str, Any]]
) -> set[str]:
    """Folders of another package in which the import tried two or more libraries that did not load (torchcodec
    tries one build per FFmpeg major; its other libraries load): that package looking for something optional. Such
    a folder is not why *target*'s import failed unless the failure names that package; its loads are told as
    a feature that will not work."""
    tried: dict[str, set[str]] = {}
    for attempt in attempts:
        name = str(attempt.get("name", ""))
        if os.path.isabs(name) and not attempt.get("ok"):
            real = os.path.realpath(name)
            tried.setdefault(os.path.dirname(real), set()).add(real)
    said = (failure.message + " " + " ".join(failure.outer)) if failure is not None else ""
    top = target.name.split(".", 1)[0]
    out = set()
    for folder, files in tried.items():
        owner = _site_label(folder).split("/", 1)[0]
        if len(files) >= 2 and owner != top and owner not in said:
            out.add(folder)
    return out


def _feature_warnings(entries: list[ImportEntry]) -> list[str]:
    """One warning per folder of libraries that imports tried, could not load and worked without: what
    needs them will not work (torchcodec tries one build per FFmpeg major; none loads without FFmpeg). Told
    once, by the first import that tried, however many imports tried the same files."""
    seen: set[str] = set()
    out: list[str] = []
    for entry in entries:
        folders: dict[str, list[Mapping[str, Any]]] = {}
        for f in entry.failed_loads or ():
            if f.get("judged") == "feature" and f["name"] not in seen:
                seen.add(f["name"])
                folders.setdefault(os.path.dirname(f["name"]), []).append(f)
        for folder, failed in folders.items():
            first = failed[0]
            lf = loadcheck.classify_attempt({"ok": False, "error": first["error"], "name": first["name"]})
            what = loadcheck.describe(first["name"], lf) if lf is not None else first["name"]
            many = f"none of the {len(failed)} libraries it tried in {folder}/ loads: " if len(failed) > 1 else ""
            out.append(
                f"{entry.dist}: `import {entry.module}` works, but {many}{what}: what needs "
                f"{'them' if len(failed) > 1 else 'it'} will not work"
            )
    return out


def _label(path: str, targets: list[loadcheck.LoadTarget]) -> str:
    """A shared object's label as its distribution's RECORD spells it (relative to site-packages)."""
    for t in targets:
        if t.path is not None and os.path.realpath(t.path) == os.path.realpath(path):
            return t.label
    for entry in sys.path:
        if entry and path.startswith(entry.rstrip("/") + "/"):
            return path[len(entry.rstrip("/")) + 1 :]
    return path


def _own_mapped(
    loaded: list[tuple[ImportEntry, list[str] | None]], owned: dict[str, dict[str, str]]
) -> list[ImportEntry]:
    """The entries, each package import's with what it mapped of its own distribution's shared objects (by
    label)."""

    def own(entry: ImportEntry, paths: list[str]) -> ImportEntry:
        mine = owned.get(entry.dist, {})
        return dataclasses.replace(
            entry, mapped=tuple(sorted({mine[p] for p in map(os.path.realpath, paths) if p in mine}))
        )

    return [entry if paths is None else own(entry, paths) for entry, paths in loaded]


def _reach(site_packages: str | None, label: str, device_code: bool) -> dict[str, str] | None:
    """What the package's import graph says of a module static did not judge: {package, why, feature,
    needed} when the import stage may find `import <package>` does not need it, else None."""
    if not site_packages or not label.endswith(".so") or "/" not in label:
        return None
    sp = Path(site_packages)
    top = reach.package_of(sp, label)
    need = reach.ImportGraph(sp, top).need(reach.dotted_name(label))
    if not need.confirmable(label, device_code=device_code):
        return None
    return {"package": top, "why": need.why, "feature": need.feature, "needed": need.needed}


def _loaded_by_package(entries: list[ImportEntry]) -> list[ImportEntry]:
    """A module that fails loaded alone, but that its package's own `import` loaded (mapped, and the import
    succeeded), loads as users load it: opencv's cv2.abi3.so is only ever loaded by cv2/__init__.py's
    bootstrap, under the name `cv2`. It counts as loaded, saying so."""
    imports = [e for e in entries if e.is_package and e.ok]

    def judged(entry: ImportEntry) -> ImportEntry:
        if entry.failure is None or entry.is_package:
            return entry
        by = next((p for p in imports if p.dist == entry.dist and entry.module in (p.mapped or ())), None)
        if by is None:
            return entry
        return dataclasses.replace(
            entry,
            ok=True,
            loaded=f"by `import {by.module}`, which maps it; loaded alone, {entry.reason}",
            alone=entry.failure,
            failure=None,
            reason=None,
        )

    return [judged(e) for e in entries]


def _predicted(work_dir: str | None) -> dict[str, dict[str, str]] | None:
    """static/not-needed.json: the modules static left to this stage; None when no static stage ran."""
    file = Path(work_dir or ".") / "static" / "not-needed.json"
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None if not file.parent.is_dir() else {}
    return data if isinstance(data, dict) else {}


def _undecided(predicted: dict[str, dict[str, str]] | None, entries: list[ImportEntry]) -> list[str]:
    """Modules static could not judge (`import P` may need them) that this stage did not load: no one has
    looked, so they stay failures."""
    loaded = {e.module for e in entries}
    return [
        f"{label}: static could not tell whether `import {guess.get('package')}` needs it, and the import "
        "stage did not load it"
        for label, guess in sorted((predicted or {}).items())
        if guess.get("needed") == "unknown" and label not in loaded
    ]


def _confirm_not_needed(
    predicted: dict[str, dict[str, str]] | None,
    entries: list[ImportEntry],
    site_packages: str | None = None,
    paths: dict[str, str] | None = None,
) -> list[ImportEntry]:
    """The entries, each failed module that its distribution's imports were *seen* not to need marked
    ``needed=False`` (a warning, not a failure), and the others told why they stay needed.

    Observed, whichever stages ran: a module is needed when one of its distribution's package imports tried
    to load it (mapped it, or recorded a failed attempt of it), or failed itself (it may need it), or when
    the distribution has no package to import. A module that every one of those imports left alone, the
    imports having worked, is not needed by ``import``: a lazily loaded part, another build the package did
    not pick (sm100 on this box, one CUDA major of two). The static stage's reading of the import graph
    (static/not-needed.json), or the graph read here, only adds what the package says the module is for.
    """
    imports: dict[str, list[ImportEntry]] = {}
    for e in entries:
        if e.is_package:
            imports.setdefault(e.dist, []).append(e)
    return [_confirmed(e, predicted or {}, imports.get(e.dist, []), site_packages, paths) for e in entries]


def _tried(package: ImportEntry, module: str) -> bool:
    return module in (package.mapped or ()) or any(f.get("name") == module for f in package.failed_loads or ())


def _confirmed(
    entry: ImportEntry,
    predicted: dict[str, dict[str, str]],
    packages: list[ImportEntry],
    site_packages: str | None,
    paths: dict[str, str] | None,
) -> ImportEntry:
    if entry.failure is None or entry.is_package or entry.failure.get("kind") not in loadcheck.STACK_KINDS:
        return entry  # only a failure of the stack is weighed: one for want of a GPU needs a GPU to judge
    if not packages:
        return dataclasses.replace(entry, needed_why=f"{entry.dist} has no package to import it: it is loaded alone")
    tried = next((p for p in packages if _tried(p, entry.module)), None)
    if tried is not None:
        how = "loads it" if entry.module in (tried.mapped or ()) else "tried to load it and failed on it"
        return dataclasses.replace(entry, needed_why=f"`import {tried.module}` {how}")
    failed = next((p for p in packages if not p.ok or p.mapped is None), None)
    if failed is not None:
        return dataclasses.replace(entry, needed_why=f"`import {failed.module}` did not load, so it may need it")
    guess = predicted.get(entry.module)
    if guess is None:  # static did not judge it: read the file once, for both questions
        path = (paths or {}).get(entry.module)
        symbols = loadcheck.dynamic_symbols(path) if path else None
        device_code = symbols is None or symbols.device_code
        guess = _reach(site_packages, entry.module, device_code)
    if guess is None and reach.picked_by_gpu(entry.module, device_code=device_code):
        return dataclasses.replace(
            entry,
            needed_why=f"a build its package may pick by GPU: whether `import {packages[0].module}` loads it here "
            "says nothing of the target's GPU",
        )
    package = packages[0].module if guess is None else guess.get("package", packages[0].module)
    said = f"; {guess['package']} says it is for: {guess['feature']}" if guess and guess.get("feature") else ""
    if guess is None:
        verdict = f"{entry.reason}; `import {package}` does not need it: it loads without trying to load it"
    elif guess.get("needed") == "unknown":  # the code could not say; what `import` did here does
        verdict = (
            f"{entry.reason}; `import {package}` does not need it here: it loads "
            f"without mapping it, though {guess.get('why', '')}{said}"
        )
    else:
        verdict = (
            f"{entry.reason}; `import {package}` does not need it: it loads "
            f"without mapping it ({guess.get('why', '')}){said}"
        )
    return dataclasses.replace(entry, needed=False, verdict=verdict)


_REPLACEMENTS = 4  # adopting servers started again after one closed; then the one that adopts nothing
_REQUIREMENT_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _by_requirements(surveyed: Mapping[str, loadcheck.Installed]) -> list[str]:
    """The distributions, each after those of them it requires (its METADATA's Requires-Dist, extras left
    out): the order in which an adopting server has what a package needs before the package is imported.
    A circle is broken where it is met; an unreadable METADATA requires nothing."""
    names = {_canonical(d): d for d in surveyed}
    needs: dict[str, list[str]] = {}
    for dist, survey in surveyed.items():
        try:
            requires = survey.dist.requires or []
        except Exception:  # noqa: BLE001 - broken metadata is said elsewhere; here it orders nothing
            requires = []
        found = (_REQUIREMENT_NAME.match(r) for r in requires if "extra" not in r.partition(";")[2])
        needs[dist] = [names[_canonical(m.group(1))] for m in found if m and _canonical(m.group(1)) in names]
    order: list[str] = []
    seen: set[str] = set()

    def visit(dist: str) -> None:
        if dist in seen:
            return
        seen.add(dist)
        for need in needs.get(dist, []):
            visit(need)
        order.append(dist)

    for dist in sorted(surveyed):
        visit(dist)
    return order


def test_stack_imports(compat_context: SuiteContext, stage: Any) -> None:
    packages = dict(compat_context.packages)
    targets = compat_context.targets
    timeout = compat_context.threshold("import-timeout", 180)
    missing: list[str] = []
    surveyed: dict[str, loadcheck.Installed] = {}
    for dist, version in packages.items():
        try:
            surveyed[dist] = loadcheck.Installed(dist)
        except importlib.metadata.PackageNotFoundError:
            missing.append(f"{dist} {version} is declared but not installed in the cell")
    installed = {dist: survey.version for dist, survey in surveyed.items()}
    driver = _Driver(compat_context.work_dir, [f for s in surveyed.values() for f in s.elf_files])
    stage.note(driver=driver.describe(), installed=installed, python=sys.executable)
    if missing:
        stage.fail(missing[0] + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""), missing=missing)
    fork = forkserver.enabled()
    loader = _Loader(driver, ["torch"] if "torch" in surveyed else [], timeout, fork=fork)
    loader.prestart()  # the server imports torch while the modules to load are found
    plan: list[loadcheck.LoadTarget] = []
    owned: dict[str, dict[str, str]] = {}  # dist -> real path of each shared object it installed -> label
    other_python: list[str] = []
    try:
        for dist, survey in surveyed.items():
            found = survey.targets
            other_python.extend(
                f"{label}: built for another Python; {sys.implementation.cache_tag} never imports "
                "it, so it was not loaded"
                for label in survey.other_python
            )
            # Hostile or broken metadata: said for this distribution, the rest of it still loaded.
            other_python.extend(
                f"{dist}: its RECORD names {label}, outside the environment: never read nor loaded"
                for label in survey.outside
            )
            other_python.extend([f"{dist} {survey.version}: {survey.problem}"] if survey.problem else [])
            owned[dist] = {os.path.realpath(f): _label(f, found) for f in survey.elf_files}
            plan.extend(found)
        # Extension modules first: their failures name the file; a package's import failure repeats them.
        plan.sort(key=lambda t: t.path is None)
        with (
            concurrent.futures.ThreadPoolExecutor(max_workers=_jobs(fork=fork)) as pool,
            _Progress(len(plan)) as progress,
        ):
            # Distributions in the order of their requirements (what others need first), each one's modules
            # before its package's import, which the server then adopts: a module is never loaded after its
            # own package, and a package's import after those it needs. The entries keep the plan's order.
            rank = {dist: i for i, dist in enumerate(_by_requirements(surveyed))}
            order = sorted(range(len(plan)), key=lambda i: (rank[plan[i].dist], plan[i].path is None))
            for target in plan:
                loader.own.setdefault(target.dist, []).append(target.name)
            done = dict(
                zip(order, pool.map(lambda i: progress.tick(_load(plan[i], driver, loader)), order), strict=True)
            )
            loaded = [done[i] for i in range(len(plan))]
    finally:
        loader.close()
    stage.note(loader=loader.describe(), loader_problems=loader.problems)
    if driver.lib_dir is not None:
        stage.note(stand_in=str(driver.lib_dir / "libcuda.so.1"), stand_in_symbols=len(driver.symbols))
    entries = _loaded_by_package(_own_mapped(loaded, owned))
    paths = {t.label: t.path for t in plan if t.path is not None}
    predicted = _predicted(compat_context.work_dir)
    entries = _confirm_not_needed(predicted, entries, compat_context.site_packages, paths)
    broken: list[str] = []
    ignored: list[str] = []
    unjudged: list[str] = []
    needs_gpu: list[str] = []
    undeclared: list[str] = []
    codes: list[str] = []  # the cause code of each of broken, in incell/causes.py
    for entry in entries:
        failure, reason = entry.failure, entry.reason or entry.module
        if failure is None:
            continue
        if failure["kind"] == "missing-dependency" or entry.needed is False:
            undeclared.append(entry.verdict or reason)
        elif failure["kind"] in loadcheck.STACK_KINDS:
            if _ignored(entry.module, targets):
                ignored.append(reason)
            else:
                broken.append(reason)
                codes.append(entry.cause or "unclassified")
        elif failure.get("library"):  # the loader found no libcuda.so.1: nothing could be judged
            unjudged.append(reason)
        else:  # linked fine; its initialisation wants a GPU (the stand-in said CUDA_ERROR_NO_DEVICE)
            needs_gpu.append(reason)
    stage.note(
        modules=[e.to_json() for e in entries],
        loaded=sum(e.ok for e in entries),
        total=len(entries),
        ignored=ignored,
        needs_gpu=needs_gpu,
        warnings=undeclared
        + _feature_warnings(entries)
        + other_python
        + [f"needs a GPU to judge: {r}" for r in needs_gpu],
    )
    undecided = _undecided(predicted, entries)
    broken += undecided
    codes += ["unclassified"] * len(undecided)
    if broken:
        more = f" (and {len(broken) - 1} more)" if len(broken) > 1 else ""
        causes = [{"cause": c, "reason": r} for c, r in zip(codes, broken, strict=True)]
        stage.fail(broken[0] + more, failures=broken, cause=codes[0], causes=causes)
    if unjudged:
        more = f" (and {len(unjudged) - 1} more)" if len(unjudged) > 1 else ""
        stage.error(f"could not judge {unjudged[0]}{more}: {driver.describe()}", failures=unjudged)
    if not entries:
        stage.error("nothing to load: the cell declares no installed package with modules", packages=packages)
