"""Where each load of the import stage runs: a child of a fork server, else a fresh interpreter.

Two kinds of fork server (compatlab.incell.forkserver), one of each per build of the stand-in driver (the
dynamic loader reads ``LD_LIBRARY_PATH`` once, at start): an adopting server, asked first, that imports each
package itself (a child of it only ends the import, as a process that imported it would end), so the loads
after it start with what they need (and answers itself, with no child, a module an adopted package imported
already, when the load allows it: ``imported_ok``); and a server that adopts
nothing, which answers what the adopting one refuses (a load under a package it adopted) and asks again
every failure the adopting one saw (a failure is the verdict of a process that imported only the
prerequisites). An adopting server that closed (an adoption started a thread or initialised CUDA) is
replaced, in the background, by one that adopts what it had, the package that closed it never again (at
most ``_REPLACEMENTS`` times). A server that cannot start leaves the loads to a fresh interpreter each
(loadcheck.load_module), the other kind not tried; an adopting server that dies leaves them to the one that
adopts nothing, and that one dying to a fresh interpreter. The loader's log (``LD_DEBUG``), read when a load
fails without naming a library, is on in the server that adopts nothing: every failure is asked there, by
path (a package: by name) with only the prerequisites before it, which is the load the log is read for, so
its lines are that load's own and no load is made again for them. Where that server gave no answer, a third
server started with the log on loads it once more, else a fresh interpreter.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import sys
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path

from compatlab.incell import forkserver, loadcheck
from compatlab.incell.imports.driver import Driver
from compatlab.incell.imports.labels import site_label
from compatlab.incell.loading.failure import DRIVER_LIBS, LoadFailure
from compatlab.incell.loading.installed import LoadTarget
from compatlab.incell.loading.observed import c_level_failures
from compatlab.incell.proc import Completed

__all__ = ["Loader", "jobs"]

_LD_DEBUG = {"LD_DEBUG": "files"}  # the loader's log: each file it looks for, opens and maps (loading.observed)

# Seconds a child of the adopting server may take to end once it sent its record: an exit that waits on a
# thread an adoption started (which no fork copies) is cut short, and the load asked of the other server.
_EXIT_GRACE = 10.0

_REPLACEMENTS = 4  # adopting servers started again after one closed; then the one that adopts nothing


def jobs(*, fork: bool) -> int:
    """Loads at a time: $COMPATLAB_IMPORT_JOBS, else one a core (at most 16) for forked children (they share
    the server's memory), half the cores (at most 4) for fresh interpreters (each imports torch again)."""
    try:
        return max(1, int(os.environ.get("COMPATLAB_IMPORT_JOBS", "")))
    except ValueError:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 2
        return max(1, min(16, cpus) if fork else min(4, cpus // 2))


class Loader:
    """Loads one target in a child of a fork server (one per build of the stand-in), else in a fresh process."""

    def __init__(self, driver: Driver, pre: list[str], timeout: float, *, fork: bool) -> None:
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
        # Learned from the refusals: an adopted package's distribution -> those whose loads it refused
        # (imports.order: the next run loads them before it).
        self.learned: dict[str, set[str]] = {}
        self.confirmed = 0  # failures in an adopting server's child, asked again of the other
        # A package whose adoption closed a server (it started a thread, or initialised CUDA) is not adopted
        # again: a server adopting what the closed one had, but that, takes over (at most _REPLACEMENTS).
        self.unadoptable: set[str] = set()
        self.retired: list[forkserver.ForkServer] = []
        self._replacing: list[threading.Thread] = []
        # Servers started with the loader's log on (LD_DEBUG), for c_level: (server or None, its log folder).
        self.watched: dict[str, tuple[forkserver.ForkServer | None, Path]] = {}
        # The servers that adopt nothing have the log on too: their log folder, and for each load there with
        # only the prerequisites before it that failed, where its lines are (_Logged), for c_level.
        self.plain_logs: dict[str, Path] = {}
        self.logged: dict[tuple[str, str, str | None], _Logged] = {}
        self.read_logged = 0  # c_level answers read from such a load's own lines
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
                started = env
                if not adopting:
                    log = Path(tempfile.mkdtemp(prefix="compatlab-ld-"))
                    self.plain_logs[key] = log
                    started = {**env, **_LD_DEBUG, "LD_DEBUG_OUTPUT": str(log / "ld")}
                try:
                    servers[key] = forkserver.ForkServer.start(
                        sys.executable, preload=self.pre, env=started, timeout=self.timeout
                    )
                except forkserver.ServerGone as exc:
                    # Both kinds start by importing the prerequisites alone: where one could not, the other
                    # cannot either, and is not tried (nor said twice).
                    servers[key] = None
                    (self.servers if adopting else self.adopting).setdefault(key, None)
                    self.problems.append(f"fork server could not start ({exc}): one process per module")
            return servers[key]

    def load(
        self, target: LoadTarget, preload: Sequence[str] = (), *, adopt: bool = False, imported_ok: bool = False
    ) -> tuple[LoadFailure | None, Completed]:
        """Load *target* after the prerequisites and then the libraries *preload* (absolute paths): asked of
        the adopting server first, and a failure there again of the server that adopts nothing (whose
        verdict is kept); *adopt*: the adopting server imports the package too, for the loads after it;
        *imported_ok*: a module that server imported already (an adopted package did) is loaded there."""
        answer = self.ask_adopting(target, preload, adopt=adopt, imported_ok=imported_ok)
        if answer is not None and answer[0] is None:
            return answer
        if answer is not None:
            self.confirming()
        return self.ask_plain(target, preload)

    def _dist_of(self, name: str) -> str | None:
        """The distribution whose package *name* is (the plan's targets: ``own``); None where it is not one
        distribution's alone (``nvidia``, the namespace every nvidia-* wheel installs into)."""
        owners = [dist for dist, names in self.own.items() if name in names]
        return owners[0] if len(owners) == 1 else None

    def confirming(self) -> None:
        """An adopting server's failure is asked again of the server that adopts nothing: counted."""
        with self._lock:
            self.confirmed += 1

    def ask_adopting(
        self,
        target: LoadTarget,
        preload: Sequence[str] = (),
        *,
        adopt: bool = False,
        imported_ok: bool = False,
        alone: bool = False,
    ) -> tuple[LoadFailure | None, Completed] | None:
        """The adopting server's answer for *target* (see ``load``); None where it gave none: there is none
        (it could not start, closed or died) or it refused (the load's package is imported there). *alone*:
        refused only for the module itself, not for the rest of its distribution (a module imported by its
        name imports its own package first anyway: where that is imported already, the import is the same)."""
        env = self.driver.env()
        adopting = self._server(env, adopting=True) if self.fork else None
        if adopting is None:
            return None
        try:
            return adopting.load(
                path=target.path,
                name=target.name,
                pre_import=self._pre(target, preload),
                timeout=self.timeout,
                own=[target.name] if alone else self.own.get(target.dist, [target.name]),
                adopt=adopt and target.name not in self.unadoptable,
                imported_ok=imported_ok,
                exit_grace=_EXIT_GRACE,
            )
        except forkserver.Refused as refused:
            with self._lock:
                self.refused += 1
                for dist in {self._dist_of(name) for name in refused.by} - {target.dist, None}:
                    self.learned.setdefault(str(dist), set()).add(target.dist)
        except forkserver.ServerGone as exc:  # it died adopting a package: the other answers from now on
            with self._lock:
                if self.adopting.get(env.get("LD_LIBRARY_PATH", "")) is adopting:
                    self.adopting[env.get("LD_LIBRARY_PATH", "")] = None
                    self.retired.append(adopting)
                    self.problems.append(f"adopting fork server lost ({exc}): the others load the rest")
        finally:
            if adopting.closed:
                self._replace(env, adopting)
        return None

    def ask_plain(self, target: LoadTarget, preload: Sequence[str] = ()) -> tuple[LoadFailure | None, Completed]:
        """*target* loaded by a child of the server that adopts nothing (it imported only the prerequisites),
        else by a fresh interpreter: the verdict of a process that has only what the load needs."""
        env = self.driver.env()
        pre = self._pre(target, preload)
        server = self._server(env) if self.fork else None
        if server is not None:
            try:
                return self._plain_load(server, env, target, pre, logged=not preload)
            except forkserver.ServerGone as exc:  # the server itself died, not a child: ask a fresh process
                with self._lock:
                    self.problems.append(f"fork server lost ({exc}): {target.label} loaded in its own process")
        return loadcheck.load_module(
            sys.executable, path=target.path, name=target.name, pre_import=pre, timeout=self.timeout, env=env
        )

    def _pre(self, target: LoadTarget, preload: Sequence[str]) -> list[str]:
        return [m for m in self.pre if m != target.name] + list(preload)

    def _plain_load(
        self, server: forkserver.ForkServer, env: dict[str, str], target: LoadTarget, pre: list[str], *, logged: bool
    ) -> tuple[LoadFailure | None, Completed]:
        """*target* in a child of the server that adopts nothing (its loader's log on). *logged*: the load
        c_level reads the log of (only the prerequisites before it): where it fails, where its lines are is
        kept, with a folder of its own for what the programs it starts write to the log."""
        key = env.get("LD_LIBRARY_PATH", "")
        log = self.plain_logs.get(key)
        if not logged or log is None:
            return server.load(path=target.path, name=target.name, pre_import=pre, timeout=self.timeout)
        folder = Path(tempfile.mkdtemp(prefix="load-", dir=log))
        try:
            failure, done, lines = self._logged_load(server, log, target, pre, folder)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        place = (key, target.label, target.path)
        keep = lines if failure is not None else None
        with self._lock:
            dropped = self.logged.pop(place, None)  # an earlier load of it: the last one is what c_level reads
            if keep is not None:
                self.logged[place] = keep
        for gone in ([dropped.folder] if dropped is not None else []) + ([] if keep is not None else [folder]):
            shutil.rmtree(gone, ignore_errors=True)
        return failure, done

    def _logged_load(
        self, server: forkserver.ForkServer, log: Path, target: LoadTarget, pre: list[str], folder: Path
    ) -> tuple[LoadFailure | None, Completed, _Logged | None]:
        """*target* in a child of *server* (started with the loader's log on, into *log*), what the programs
        the child starts log going to *folder*: its answer, and where the child's own lines are (None when
        its pid is not known)."""
        own = log / f"ld.{server.pid}"
        start = _size(own)
        failure, done = server.load(
            path=target.path,
            name=target.name,
            pre_import=pre,
            timeout=self.timeout,
            environ={"LD_DEBUG_OUTPUT": str(folder / "ld")},
        )
        if done.pid is None:
            return failure, done, None
        # The child has ended: every line of its own is before the file's end now.
        return failure, done, _Logged(own=own, pid=done.pid, start=start, end=_size(own), folder=folder)

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
                        env={**env, **_LD_DEBUG, "LD_DEBUG_OUTPUT": str(log / "ld")},
                        timeout=self.timeout,
                    )
                except forkserver.ServerGone as exc:
                    server = None
                    self.problems.append(f"fork server with the loader's log could not start ({exc})")
                self.watched[key] = (server, log)
            return self.watched[key]

    def _c_level_forked(self, target: LoadTarget, pre: list[str], tmp: Path) -> bool:
        """The load once more in a child of the watched server, its lines of the log copied into *tmp* as
        the fresh interpreter's own file would be (and what it started writes there itself); False when no
        watched server answers."""
        server, log = self._watched(self.driver.env())
        if server is None:
            return False
        try:
            _failure, _done, lines = self._logged_load(server, log, target, pre, tmp)
        except forkserver.ServerGone as exc:
            with self._lock:
                self.problems.append(f"fork server with the loader's log lost ({exc})")
            return False
        if lines is None:
            return False
        lines.extract()
        return True

    def c_level(self, target: LoadTarget) -> list[tuple[str, str]]:
        """What C code tried to load and could not while *target* loaded, with the loader's log on: in a
        child of a server started with it (its lines of the server's log), else in a fresh interpreter
        (loadcheck.c_level_probe)."""
        pre = [m for m in self.pre if m != target.name]
        with self._lock:
            logged = self.logged.pop((self.driver.env().get("LD_LIBRARY_PATH", ""), target.label, target.path), None)
        if logged is not None:  # the failed load's own lines, from the server that adopts nothing
            try:
                logged.extract()
                found = c_level_failures(logged.folder, sys.executable)
            finally:
                shutil.rmtree(logged.folder, ignore_errors=True)
            with self._lock:
                self.read_logged += 1
            return self._own_package(target, found)
        with tempfile.TemporaryDirectory(prefix="compatlab-ld-") as tmp:
            if self.fork and self._c_level_forked(target, pre, Path(tmp)):
                found = c_level_failures(Path(tmp), sys.executable)
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
        return self._own_package(target, found)

    @staticmethod
    def _own_package(target: LoadTarget, found: list[tuple[str, str]]) -> list[tuple[str, str]]:
        # Only what the module's own package asked for: another package's optional load (a plugin it
        # looks for and does without) is not why this one failed.
        top = target.label.split("/", 1)[0].split(".", 1)[0]
        return [
            (n, c)
            for n, c in found
            if not n.startswith(DRIVER_LIBS) and site_label(os.path.realpath(c)).split("/", 1)[0] == top
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
                f"{len(adopting[-1].adopted)} package(s) that it imported itself, a child ending each"
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
                + ", with the loader's log on"
                + (f" (read for {self.read_logged} failure(s) that named no library)" if self.read_logged else "")
            )
        if watched:
            said.append(f"loads again with the loader's log: children of {watched} started with it")
        huge = [s.huge_mib for s in [*adopting, *live]]
        said.append(
            f"{' and '.join(f'{mib} MiB' for mib in huge)} of their memory in 2 MiB pages (a fork costs less)"
            if any(huge)
            else "their memory in 4 KiB pages (none collapsed into 2 MiB ones)"
        )
        return "; ".join(said)

    def cpu(self) -> dict[str, dict[str, float]]:
        """Once closed: the CPU seconds each kind of fork server used (``adopting``, ``plain``: the ones that
        adopt nothing, ``watched``: those started for the loader's log), itself and its children, summed over
        the servers of that kind that told it at their end (``servers``: how many did; one that died told
        nothing). Where the time of the stage goes: the adopting server's own part is its imports and forks,
        one after another; its children's, the loads, side by side."""
        kinds = {
            "adopting": [*self.retired, *self.adopting.values()],
            "plain": list(self.servers.values()),
            "watched": [server for server, _log in self.watched.values()],
        }
        out: dict[str, dict[str, float]] = {}
        for kind, servers in kinds.items():
            told = [s.cpu for s in servers if s is not None and s.cpu is not None]
            if told:
                out[kind] = {
                    "servers": len(told),
                    "self_user": round(sum(c.user for c in told), 2),
                    "self_system": round(sum(c.system for c in told), 2),
                    "children_user": round(sum(c.children_user for c in told), 2),
                    "children_system": round(sum(c.children_system for c in told), 2),
                    "forks": sum(c.forks for c in told),
                    "fork_cpu": round(sum(c.fork_cpu for c in told), 2),
                }
        return out

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
        for log in self.plain_logs.values():
            shutil.rmtree(log, ignore_errors=True)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Logged:
    """Where the lines of one load in a server with the loader's log on are: bytes *start* to *end* of the
    server's log file *own* tagged with the child's *pid* (its siblings write there too), and *folder*, where
    what the programs it started wrote is."""

    own: Path
    pid: int
    start: int
    end: int
    folder: Path

    def extract(self) -> None:
        """The child's own lines into *folder*, as a fresh interpreter's own log file would be there."""
        tag = re.compile(rf"^\s*{self.pid}:")
        try:
            with self.own.open("rb") as file:
                file.seek(self.start)
                text = file.read(max(0, self.end - self.start)).decode("utf-8", "replace")
        except OSError:
            text = ""
        mine = [line for line in text.splitlines() if tag.match(line)]
        (self.folder / f"ld.{self.pid}").write_text("\n".join(mine) + "\n", encoding="utf-8")
