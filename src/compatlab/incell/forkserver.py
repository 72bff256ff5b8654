"""Load extension modules in children forked from one interpreter that has imported the prerequisites.

The per-process path (``loadcheck.load_module``) starts a fresh interpreter per module, and every one of
them imports torch again: a cell of 13 modules pays 13 imports of torch. Here one server interpreter imports
the prerequisites once and forks a child per module or package to load, so each load pays only its own
cost. The server only imports: it never initialises CUDA (and refuses to serve if the import did), so no
child inherits a CUDA context.

Isolation is what a fresh process gives. Each child is the leader of its own session and process group,
has its own stdout and stderr pipes, and reports one JSON record over a pipe of its own; the server kills
the whole group on timeout, and a crash, hang or exit of a child is that module's verdict while the server
goes on. The child exits the way the probe does (status 0 or 3, through the interpreter's finalisation), so
a module that crashes at exit is seen here too. The client turns each answer into a ``proc.Completed`` and
classifies it with ``loading.failure.classify_record``: the same verdicts as the per-process path.

The server is this module run with the cell's interpreter the way the probe is (``proc.module_command``),
so the cell's ``sys.path`` is the probe's, and its children do what the probe does (``probe.steps``). Its
protocol is JSON lines on descriptors it takes over from stdin and stdout before importing the prerequisites
(fd 1 then points at stderr, so what the modules print cannot corrupt it):

    server -> client   {"ready": true}  or  {"ready": false, "step": ..., "type": ..., "message": ...}
    client -> server   {"id": 1, "path": "/x/m.so" or null, "name": "pkg.m", "pre": ["torch"], "timeout": 180,
                        optional: "environ": {"NAME": "value"} (set in the child first),
                        "own": ["pkg", "pkg.m"] (its distribution's modules), "adopt": true}
    server -> client   {"id": 1, "pid": ..., "returncode": ..., "stdout": ..., "stderr": ..., "seconds": ...,
                        "timed_out": ..., "record": {"ok": ..., "step": ..., ...} or null,
                        "adopted": 12, "closed": ""}
                       or {"id": 1, "refused": "why"} (no child was forked)

Adoption (``"adopt": true`` on a package's import): once the child is forked, the server imports the package
too, so the children forked after it start with it and pay only for their own part: the import stage costs
about what one interpreter importing everything costs, not that times the shared dependencies. Isolation is
kept where it matters: a load whose own modules (``"own"``) an adopted package imported is refused, and the
client asks a server that adopts nothing; an adoption that fails is undone (its modules forgotten), and one
that initialised CUDA closes the server to new children. A package that started a thread at import is
named (``"threaded"``): a forked child inherits none of its threads, so the client asks every failure again
of a server that adopts nothing, whose verdict is the one kept. An adoption holds up no child already
running: while it imports, a tick (SIGALRM, every 50 ms, syscalls restarted) reads the children's pipes and
answers those done; requests that come meanwhile are forked after it, and a client gone breaks it off.

Closing the server's stdin ends it: running children are killed with their groups.
"""

from __future__ import annotations

import atexit
import collections
import concurrent.futures
import contextlib
import ctypes
import gc
import importlib
import itertools
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import IO, Any, NoReturn

from compatlab.incell.loading.failure import LoadFailure, classify_record
from compatlab.incell.probe import RESULT_TAG, steps
from compatlab.incell.proc import HERE, Completed, module_command

__all__ = ["ForkServer", "Refused", "ServerGone", "enabled", "main"]

ENV_SWITCH = "COMPATLAB_IMPORT_FORKSERVER"
_KEEP = 64 * 1024  # bytes of a child's stdout and stderr sent back: the classifier reads the end
_GRACE = 5.0  # seconds to wait for a killed group's pipes to close
_TICK = 0.05  # seconds between looks at the children and the client while an adoption imports


def enabled(environ: Mapping[str, str] | None = None) -> bool:
    """True unless $COMPATLAB_IMPORT_FORKSERVER is 0, false, no or off (then every load is a fresh process)."""
    value = (environ if environ is not None else os.environ).get(ENV_SWITCH, "1")
    return value.strip().lower() not in ("0", "false", "no", "off")


def _die_with_parent() -> None:
    # Linux's PR_SET_PDEATHSIG: a server killed outright (its test run timed out) takes its children along,
    # instead of leaving a hung load running with no one to time it out.
    with contextlib.suppress(AttributeError, OSError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _cuda_initialised() -> bool:
    cuda = sys.modules.get("torch.cuda")
    check = getattr(cuda, "is_initialized", None)
    return bool(check()) if callable(check) else False


class _ExitGuard:
    """How a child ends: as a process that loaded the module would, but for what it inherited.

    A fresh interpreter's exit runs the Python atexit handlers, then the C library's ``exit``: the C atexit
    handlers and C++ static destructors, newest first (a module that crashes at exit crashes there). What
    the child inherited from the server (torch's handlers and destructors) runs the same way in every child,
    and takes 0.2 s: most of a small load. So the inherited Python handlers are dropped at the fork, and a C
    handler registered at the fork ends the process (``_exit``) once the handlers registered after it, the
    module's own, have run. Python's teardown of its modules is not run: a crash there is seen only by the
    per-process path (COMPATLAB_IMPORT_FORKSERVER=0).
    """

    _HANDLER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)

    def __init__(self) -> None:
        atexit._clear()
        self.status, self.armed = 0, False
        self._libc: ctypes.CDLL | None = ctypes.CDLL(None, use_errno=True)
        self._handler = self._HANDLER(self._end)  # held here: the C library keeps only the pointer
        register = getattr(self._libc, "__cxa_atexit", None)  # getattr: a dunder name would be mangled here
        if register is None or register(self._handler, None, None) != 0:
            self._libc = None  # not registered: the child ends by finalising, as the probe does

    def _end(self, _arg: object) -> None:
        if self.armed:  # the module's own exit(5) goes on as any exit does, to its own status
            os._exit(self.status)

    def exit(self, status: int) -> NoReturn:
        self.status, self.armed = status, True
        if self._libc is None:
            raise SystemExit(status)
        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        self._libc.exit(status)
        os._exit(status)  # not reached: the handler above ends the process


class _Job:
    def __init__(self, request: dict[str, Any], pid: int, fds: dict[int, str]) -> None:
        self.request = request
        self.pid = pid
        self.fds = fds  # read end -> "stdout" | "stderr" | "record", while open
        self.data: dict[str, bytearray] = {"stdout": bytearray(), "stderr": bytearray(), "record": bytearray()}
        self.start = time.monotonic()
        self.deadline = self.start + float(request.get("timeout", 180.0))
        self.killed_at: float | None = None
        self.status: int | None = None
        self.seconds = 0.0

    def kill(self) -> None:
        for kill, target in ((os.killpg, self.pid), (os.kill, self.pid)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                kill(target, signal.SIGKILL)

    def reap(self) -> None:
        if self.status is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid == self.pid:
                self.status = status
                self.seconds = time.monotonic() - self.start

    def reply(self) -> dict[str, Any]:
        try:
            record = json.loads(bytes(self.data["record"]).decode("utf-8", "replace"))
        except ValueError:
            record = None
        status = self.status if self.status is not None else 0
        return {
            "id": self.request.get("id"),
            "pid": self.pid,
            "returncode": os.waitstatus_to_exitcode(status),
            "stdout": self.data["stdout"][-_KEEP:].decode("utf-8", "replace"),
            "stderr": self.data["stderr"][-_KEEP:].decode("utf-8", "replace"),
            "seconds": self.seconds,
            "timed_out": self.killed_at is not None,
            "record": record if isinstance(record, dict) else None,
        }


def _os_threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


class _Timeout(BaseException):
    """Raised into an adoption's import: it took too long, or the client is gone (nobody needs it)."""


class _Server:
    def __init__(self, requests: int, replies: int) -> None:
        self.requests = requests
        self.replies = replies
        # Adoption: packages a child has just been forked to import are imported here too, so the children
        # forked after it start with them (what an import of a package that needs them costs drops to its
        # own part). A load whose own modules an adopted package imported is refused (the client asks a
        # server that adopted nothing), so no module is ever loaded where its own package already is.
        self.base = set(sys.modules)
        self.imported: set[str] = set()  # every dotted prefix of a module imported here since the start
        self.adopted: list[str] = []
        self.closed = ""  # why no more children are forked here (an adoption initialised CUDA, or a thread)
        self.closed_by = ""  # the package whose adoption closed it
        self.threads = _os_threads()
        self.threaded: list[str] = []  # adopted packages that started threads
        self.pending = b""
        self._ticking = False  # in _meanwhile (a signal handler may run again inside it)
        self._importing = False  # an adoption's import is under way: _meanwhile may end it
        self.jobs: dict[int, _Job] = {}  # by pid
        self.by_fd: dict[int, _Job] = {}
        self.poll = select.poll()
        self.poll.register(requests, select.POLLIN)
        self.open = True

    def send(self, message: dict[str, Any]) -> None:
        _write_all(self.replies, (json.dumps(message) + "\n").encode())

    def serve(self) -> int | None:
        """The server's loop; returns an exit status in a forked child (None in the server, at the end)."""
        while self.open or self.jobs:
            for fd, _event in self.poll.poll(self._wait()):
                if fd == self.requests:
                    code = self._read_requests()
                    if code is not None:
                        return code
                else:
                    self._read_child(fd)
            self._tend()
        return None

    def _wait(self) -> int | None:
        now = time.monotonic()
        waits: list[float] = []
        for job in self.jobs.values():
            if not job.fds or (job.status is None and job.killed_at is not None):
                waits.append(0.005)  # pipes closed, exit status not yet there: look again soon
            elif job.killed_at is None:
                waits.append(job.deadline - now)
            else:
                waits.append(job.killed_at + _GRACE - now)
        return None if not waits else max(0, int(min(waits) * 1000) + 1)

    def _read_requests(self) -> int | None:
        chunk = os.read(self.requests, 65536)
        if not chunk:
            self._hangup()
            return None
        self.pending += chunk
        # One line at a time: an adoption (in _fork) reads on meanwhile, and what it read is served next.
        while self.open and b"\n" in self.pending:
            line, _, self.pending = self.pending.partition(b"\n")
            if line.strip():
                code = self._fork(json.loads(line))
                if code is not None:
                    return code
        return None

    def _hangup(self) -> None:
        """The client closed (or died): stop, and take the running children down."""
        self.poll.unregister(self.requests)
        self.open = False
        for job in self.jobs.values():
            job.kill()
            job.killed_at = job.killed_at or time.monotonic()

    def _meanwhile(self, deadline: float) -> None:
        """While an adoption imports (SIGALRM every _TICK s): what the children wrote is read, those done
        are answered, those past their time killed, and requests kept for after it; a client gone ends the
        adoption (and, its children killed, the server), as one past *deadline* does."""
        if self._ticking:
            return
        self._ticking = True
        try:
            if self._importing and time.monotonic() >= deadline:
                raise _Timeout
            for fd, _event in self.poll.poll(0):
                if fd != self.requests:
                    self._read_child(fd)
                    continue
                chunk = os.read(fd, 65536)
                if not chunk:
                    self._hangup()
                    if self._importing:
                        raise _Timeout
                    continue
                self.pending += chunk
            self._tend()
        finally:
            self._ticking = False

    def adoption(self) -> dict[str, Any]:
        return {
            "adopted": self.adopted,
            "closed": self.closed,
            "closed_by": self.closed_by,
            "threaded": self.threaded,
        }

    def _refusal(self, request: dict[str, Any]) -> str:
        if self.closed:
            return self.closed
        hit = sorted(str(n) for n in request.get("own") or [] if str(n) in self.imported)
        return f"{', '.join(hit[:3])} imported here already, by an adopted package" if hit else ""

    def _adopt(self, name: str, timeout: float) -> None:
        """Import *name* here too (a child was forked to import it a moment ago): on failure, forget every
        module it added; if it initialised CUDA, fork no more children; if it started a thread, name it."""
        before = set(sys.modules)
        deadline = time.monotonic() + max(timeout, 1.0)
        previous = signal.signal(signal.SIGALRM, lambda _signum, _frame: self._meanwhile(deadline))
        signal.siginterrupt(signal.SIGALRM, False)  # what the import waits on in C is restarted, not failed
        ok, self._importing = False, True
        signal.setitimer(signal.ITIMER_REAL, _TICK, _TICK)
        try:
            try:
                importlib.import_module(name)
                ok = True
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
                self._importing = False  # a tick still due reads on, and raises nothing into what follows
        except BaseException:  # noqa: BLE001 - whatever it raised, the child reports; here it is only undone
            ok = False
            for module in set(sys.modules) - before:
                sys.modules.pop(module, None)
        finally:
            signal.signal(signal.SIGALRM, previous)
        if _cuda_initialised():
            self.closed, self.closed_by = f"importing {name} initialised CUDA", name
            return
        if ok:
            self.adopted.append(name)
        threads = _os_threads()
        if threads > self.threads:  # forked children inherit none of them: said, and failures asked again
            self.threaded.append(name)
            self.threads = threads
        for module in set(sys.modules) - self.base:
            parts = module.split(".")
            self.imported.update(".".join(parts[: i + 1]) for i in range(len(parts)))
        gc.freeze()  # what it made is shared with the children too

    def _fork(self, request: dict[str, Any]) -> int | None:
        refused = self._refusal(request)
        if refused:
            self.send({"id": request.get("id"), "refused": refused, **self.adoption()})
            return None
        code = self._fork_child(request)
        if code is None and request.get("adopt") and request.get("name") and not request.get("path"):
            self._adopt(str(request["name"]), float(request.get("timeout", 180.0)))
        return code

    def _fork_child(self, request: dict[str, Any]) -> int | None:
        pipes = {"stdout": os.pipe(), "stderr": os.pipe(), "record": os.pipe()}
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        server = os.getpid()
        pid = os.fork()
        if pid == 0:
            return self._child(request, pipes, server)
        fds: dict[int, str] = {}
        for what, (read, write) in pipes.items():
            os.close(write)
            fds[read] = what
        job = _Job(request, pid, fds)
        self.jobs[pid] = job
        for fd in fds:
            self.by_fd[fd] = job
            self.poll.register(fd, select.POLLIN)
        return None

    def _child(self, request: dict[str, Any], pipes: dict[str, tuple[int, int]], server: int) -> int:
        try:
            os.setsid()  # its own session and process group: a timeout kills all it started
            _die_with_parent()
            exit_guard = _ExitGuard()
            if os.getppid() != server:  # the server died before the line above
                os._exit(70)
            os.dup2(pipes["stdout"][1], 1)
            os.dup2(pipes["stderr"][1], 2)
            record_fd = pipes["record"][1]
            for fd in [
                self.requests,
                self.replies,
                *self.by_fd,
                pipes["stdout"][1],
                pipes["stderr"][1],
                *(read for read, _ in pipes.values()),
            ]:
                os.close(fd)
            # A fresh interpreter would see what was installed since the server started: forget what the
            # finders cached (directory listings, and path entries that did not exist then).
            importlib.invalidate_caches()
            os.environ.update({str(k): str(v) for k, v in (request.get("environ") or {}).items()})
            pre = [str(m) for m in request.get("pre") or []]
            record = steps(pre, request.get("path") or None, str(request.get("name") or ""))
            _write_all(record_fd, json.dumps(record).encode())
            os.close(record_fd)
        except BaseException:  # noqa: BLE001 - never let a child return into the server's loop
            os._exit(70)  # the server's own code failed in the child: an exit without a record
        exit_guard.exit(0 if record["ok"] else 3)

    def _read_child(self, fd: int) -> None:
        job = self.by_fd[fd]
        chunk = os.read(fd, 65536)
        if chunk:
            buf = job.data[job.fds[fd]]
            buf += chunk
            if len(buf) > 4 * _KEEP:
                del buf[: len(buf) - _KEEP]
        else:
            self._close(job, fd)

    def _close(self, job: _Job, fd: int) -> None:
        self.poll.unregister(fd)
        os.close(fd)
        del self.by_fd[fd]
        del job.fds[fd]

    def _tend(self) -> None:
        now = time.monotonic()
        for pid, job in list(self.jobs.items()):
            job.reap()
            if job.killed_at is None and now >= job.deadline:
                job.kill()
                job.killed_at = now
            if job.killed_at is not None and now >= job.killed_at + _GRACE:
                for fd in list(job.fds):  # something outside the group holds the pipes: let go of them
                    self._close(job, fd)
            if job.status is not None and not job.fds:
                job.kill()  # what the child left behind in its group goes with it
                del self.jobs[pid]
                if self.open:
                    self.send({**job.reply(), **self.adoption()})


def main(argv: Sequence[str] | None = None) -> int:
    """``[PRELOAD [ADOPT]]``: run the server: import the prerequisites (comma-separated), then adopt the
    packages ADOPT (comma-separated; those a server before it adopted), say whether that worked, then serve."""
    args = sys.argv[1:] if argv is None else argv
    preload = args[0] if args else ""
    adopt = [m for m in (args[1] if len(args) > 1 else "").split(",") if m]
    requests, replies = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)
    record = steps([m for m in preload.split(",") if m], None, "")
    if record["ok"] and _cuda_initialised():
        record = {
            "ok": False,
            "step": "import " + preload,
            "type": "RuntimeError",
            "message": "CUDA was initialised while importing: forked children would share its context",
        }
    # Every object alive now is shared with the children until one of them writes to its page. A collection
    # at the child's exit would touch them all (copy-on-write, most of a second with torch): keep it off them.
    gc.freeze()
    server = _Server(requests, replies)
    if not record["ok"]:
        server.send({"ready": False, **record})
        return 0
    for name in adopt:
        server._adopt(name, 180.0)
    if server.closed:
        server.send({"ready": False, "step": "adopt", "type": "RuntimeError", "message": server.closed})
        return 0
    server.send({"ready": True, **server.adoption()})
    code = server.serve()
    return 0 if code is None else code


class ServerGone(Exception):
    """The fork server could not start, or died: the per-process path has to answer."""


class Refused(Exception):
    """The server forked no child for the load: an adopted package imported the module's own already, or
    the server forks no more (``closed``). A server that adopts nothing has to answer."""


class ForkServer:
    """The client: one server process, any number of threads calling ``load`` at once.

    ``ForkServer.start`` returns once the prerequisites are imported, or raises ServerGone saying why not
    (``import torch`` failed, crashed or hung): then load every module the per-process way, whose verdicts
    say the same thing module by module.
    """

    def __init__(self, proc: subprocess.Popen[bytes], python: str) -> None:
        self._proc = proc
        self._python = python
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._pending: dict[int, concurrent.futures.Future[dict[str, Any]]] = {}
        self._ready: concurrent.futures.Future[dict[str, Any]] = concurrent.futures.Future()
        self._stderr: collections.deque[bytes] = collections.deque(maxlen=256)
        self._gone = ""
        self.seconds = 0.0  # how long the prerequisites took to import
        self.adopted: list[str] = []  # packages the server imported itself (``load(adopt=True)``), as last told
        self.closed = ""  # why it forks no more children, once it said so
        self.closed_by = ""  # the package whose adoption closed it
        self.threaded: list[str] = []  # adopted packages that started threads, as last told
        assert proc.stdout is not None
        assert proc.stderr is not None
        self._threads = [
            threading.Thread(target=self._read_replies, args=(proc.stdout,), daemon=True),
            threading.Thread(target=self._read_stderr, args=(proc.stderr,), daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    @property
    def pid(self) -> int:
        return self._proc.pid

    @property
    def returncode(self) -> int | None:
        """The server's exit status once it ended: 0 when it ended itself, -9 when ``close`` had to kill it."""
        return self._proc.returncode

    @classmethod
    def start(
        cls,
        python: str,
        *,
        preload: Sequence[str],
        adopt: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        timeout: float = 180.0,
    ) -> ForkServer:
        """Start a server that has imported *preload*, then adopted *adopt*; ServerGone (with the reason) if
        it could not."""
        started = time.monotonic()
        command = module_command(python, "forkserver", ",".join(preload), ",".join(adopt), root=HERE)
        proc = subprocess.Popen(
            command.argv,
            cwd=command.cwd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=dict(env) if env is not None else None,
            start_new_session=True,
        )
        server = cls(proc, python)
        try:
            ready = server._ready.result(timeout=timeout)
        except concurrent.futures.TimeoutError:
            server.close()
            raise ServerGone(f"importing {', '.join(preload)} took over {timeout:.0f} s") from None
        except ServerGone as exc:
            server.close()
            raise ServerGone(f"the server died while importing {', '.join(preload) or 'nothing'}: {exc}") from None
        if not ready.get("ready"):
            server.close()
            raise ServerGone(f"{ready.get('step', '')} failed: {ready.get('type', '')}: {ready.get('message', '')}")
        server.seconds = time.monotonic() - started
        server._told(ready)
        return server

    def _told(self, reply: dict[str, Any]) -> None:
        with self._lock:
            if isinstance(reply.get("adopted"), list):
                self.adopted = [str(n) for n in reply["adopted"]]
            self.closed = str(reply.get("closed") or "") or self.closed
            self.closed_by = str(reply.get("closed_by") or "") or self.closed_by
            if isinstance(reply.get("threaded"), list):
                self.threaded = [str(n) for n in reply["threaded"]]

    def load(
        self,
        *,
        path: str | None,
        name: str,
        pre_import: Sequence[str] = (),
        timeout: float = 120.0,
        environ: Mapping[str, str] | None = None,
        own: Sequence[str] = (),
        adopt: bool = False,
    ) -> tuple[LoadFailure | None, Completed]:
        """Load one module in a forked child, as ``loadcheck.load_module`` does in a fresh interpreter;
        *environ* is set in the child's environment first (what the programs it starts see). *own*: the
        modules of the module's own distribution (Refused when an adopted package imported one); *adopt*:
        the server imports package *name* itself once the child is forked."""
        ident = next(self._ids)
        future: concurrent.futures.Future[dict[str, Any]] = concurrent.futures.Future()
        request: dict[str, Any] = {
            "id": ident,
            "path": path,
            "name": name,
            "pre": list(pre_import),
            "timeout": timeout,
        }
        if environ:
            request["environ"] = dict(environ)
        if own:
            request["own"] = list(own)
        if adopt:
            request["adopt"] = True
        with self._lock:
            if self._gone:
                raise ServerGone(self._gone)
            self._pending[ident] = future
            try:
                assert self._proc.stdin is not None
                self._proc.stdin.write((json.dumps(request) + "\n").encode())
                self._proc.stdin.flush()
            except OSError as exc:
                self._pending.pop(ident, None)
                raise ServerGone(f"the server stopped reading: {exc}") from None
        try:
            # The server kills the child at *timeout*; this is for a server that stopped answering.
            reply = future.result(timeout=timeout + 60.0)
        except concurrent.futures.TimeoutError:
            self.close()
            raise ServerGone(f"no answer for {path or name} within {timeout + 60:.0f} s") from None
        self._told(reply)
        if "refused" in reply:
            raise Refused(str(reply["refused"]))
        done = Completed(
            argv=[
                self._python,
                f"<fork of server {self.pid}: pid {reply['pid']}>",
                path or "",
                name,
                ",".join(pre_import),
            ],
            returncode=int(reply["returncode"]),
            stdout=str(reply["stdout"]),
            stderr=_stderr(reply),
            seconds=float(reply["seconds"]),
            timed_out=bool(reply["timed_out"]),
            pid=int(reply["pid"]),
        )
        return classify_record(done, reply["record"]), done

    def close(self) -> None:
        """End the server: running children are killed with their groups."""
        with self._lock:
            self._gone = self._gone or "the server was closed"
            with contextlib.suppress(OSError):
                if self._proc.stdin is not None:
                    self._proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=30)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._proc.pid, signal.SIGKILL)
        self._proc.wait()
        if threading.current_thread() not in self._threads:
            for thread in self._threads:
                thread.join(timeout=30)
            for stream in (self._proc.stdout, self._proc.stderr):
                if stream is not None:
                    stream.close()

    def __enter__(self) -> ForkServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _read_replies(self, stream: IO[bytes]) -> None:
        for line in stream:
            try:
                message = json.loads(line)
            except ValueError:
                continue  # the server writes only JSON lines; nothing else can answer a request
            if "ready" in message:
                self._ready.set_result(message)
                continue
            with self._lock:
                future = self._pending.pop(int(message["id"]), None)
            if future is not None:
                future.set_result(message)
        self._proc.wait()
        tail = b"".join(self._stderr).decode("utf-8", "replace").strip().splitlines()
        why = f"exit status {self._proc.returncode}" + (f": {tail[-1]}" if tail else "")
        with self._lock:
            self._gone = self._gone or why
            pending, self._pending = list(self._pending.values()), {}
        for future in [*pending, self._ready]:
            if not future.done():
                future.set_exception(ServerGone(why))

    def _read_stderr(self, stream: IO[bytes]) -> None:
        for line in stream:
            self._stderr.append(line)


def _stderr(reply: dict[str, Any]) -> str:
    """The child's stderr, ending with its record when that says what an import mapped or tried to load, as
    the probe's does (loading.observed.mapped_of and attempts_of read it from either path)."""
    text = str(reply["stderr"])
    record = reply.get("record")
    if isinstance(record, dict) and ("mapped" in record or "attempts" in record):
        text += RESULT_TAG + json.dumps(record) + "\n"
    return text


if __name__ == "__main__":
    raise SystemExit(main())
