"""The fork server's loop: one interpreter that has imported the prerequisites forks a child per request
(``fork/child.py``), tends the children, answers each when it is done, and adopts the packages it is asked to.

It speaks the protocol of ``forkserver``'s docstring (adoption included) on the descriptors it took over from
stdin and stdout (fd 1 then points at stderr, so what the modules print cannot corrupt it), and never
initialises CUDA: a prerequisite or an adoption that did closes it to new children. A child's stdout and stderr
are sent back to their last 64 KiB (the classifier reads the end); a child past its timeout is killed with its
group, and its pipes let go of 5 s later if something outside the group still holds them.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import importlib
import json
import os
import resource
import select
import signal
import sys
import tempfile
import threading
import time
import types
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from compatlab.incell.fork.child import AdoptedHere, ExitGuard, run_child, run_exit_child, write_all
from compatlab.incell.fork.pages import Collapser
from compatlab.incell.probe import steps

__all__ = ["cpu_used", "run_server"]

_KEEP = 64 * 1024  # bytes of a child's stdout and stderr sent back: the classifier reads the end
_GRACE = 5.0  # seconds to wait for a killed group's pipes to close
_TICK = 0.05  # seconds between looks at the children and the client while an adoption imports


_REGISTER = atexit.register
_recording: list[tuple[Any, tuple[Any, ...], dict[str, Any]]] | None = None  # an adoption's, while it imports


def _record_register(func: Any, *args: Any, **kwargs: Any) -> Any:
    """``atexit.register`` in the server: what an adoption's import registers is kept for the child that
    ends it (run_exit_child runs those alone)."""
    if _recording is not None:
        _recording.append((func, args, kwargs))
    return _REGISTER(func, *args, **kwargs)


@contextlib.contextmanager
def _captured() -> Iterator[dict[str, bytes]]:
    """What the server's own fds 1 and 2 get meanwhile, into files; their ends (``_KEEP`` times 4) as
    ``stdout`` and ``stderr`` once it ends."""
    out: dict[str, bytes] = {}
    with tempfile.TemporaryFile() as stdout, tempfile.TemporaryFile() as stderr:
        files = {"stdout": stdout, "stderr": stderr}
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        saved = {fd: os.dup(fd) for fd in (1, 2)}
        os.dup2(stdout.fileno(), 1)
        os.dup2(stderr.fileno(), 2)
        try:
            yield out
        finally:
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()
            for fd, copy in saved.items():
                os.dup2(copy, fd)
                os.close(copy)
            for key, file in files.items():
                size = file.seek(0, os.SEEK_END)
                file.seek(max(0, size - 4 * _KEEP))
                out[key] = file.read()


_MARK = "compatlab-fork-server-mark"  # no import finds it: the hyphen


def _mark() -> None:
    """A mark put at the end of sys.modules before an adoption's import: what follows it then is what the
    import added (``_added``)."""
    sys.modules.pop(_MARK, None)
    sys.modules[_MARK] = types.ModuleType(_MARK)


def _added() -> list[str]:
    """The names sys.modules gained after the mark, which goes: found walking back from its end, so no older
    entry is touched. Touching one writes its count of references, and after a fork each page written is a
    fault that copies it while a child shares it: a set of all of sys.modules twice an adoption took 4.0 s
    of the adopting server's 80 s in a py-spy profile of sglang 0.5.23's stage."""
    added: list[str] = []
    for name in reversed(sys.modules):
        if name == _MARK:
            break
        added.append(name)
    sys.modules.pop(_MARK, None)
    return added


def _cuda_initialised() -> bool:
    cuda = sys.modules.get("torch.cuda")
    check = getattr(cuda, "is_initialized", None)
    return bool(check()) if callable(check) else False


def _imported(request: dict[str, Any]) -> bool:
    """The module *request* loads is imported here already: by name, and from the same file for a load by
    path (an adopted package imported it, so it linked and initialised in this process)."""
    module = sys.modules.get(str(request.get("name") or ""))
    if module is None:
        return False
    path = request.get("path")
    if not path:
        return True
    file = getattr(module, "__file__", None)
    return isinstance(file, str) and os.path.realpath(file) == os.path.realpath(str(path))


class _Job:
    def __init__(self, request: dict[str, Any], pid: int, fds: dict[int, str], start: float | None = None) -> None:
        self.request = request
        self.pid = pid
        self.fds = fds  # read end -> "stdout" | "stderr" | "record", while open
        self.data: dict[str, bytearray] = {"stdout": bytearray(), "stderr": bytearray(), "record": bytearray()}
        self.start = time.monotonic() if start is None else start  # an adoption's: when its import began
        self.deadline = time.monotonic() + float(request.get("timeout", 180.0))
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
        # Adoption: a package asked with "adopt" is imported here, by the server itself, and a child forked
        # after it ends it as the child that imported it would have (run_exit_child), so the children forked
        # after it start with it (what an import of a package that needs them costs drops to its own part),
        # and its import is paid once. A load whose own modules an adopted package imported is refused (the
        # client asks a server that adopted nothing), so no module is ever loaded where its own package
        # already is; but a load by path of a module imported here already, from that file, is answered with
        # no child where the client allows it (``imported_ok``).
        self.seen = set(sys.modules)  # the prerequisites', then those of each adoption as it is counted below
        self.imported: set[str] = set()  # every dotted prefix of a module imported here since the start
        self.brought: dict[str, str] = {}  # each of those -> the adopted package whose import brought it in
        self.adopted: list[str] = []
        self.closed = ""  # why no more children are forked here (an adoption initialised CUDA, or a thread)
        self.closed_by = ""  # the package whose adoption closed it
        self.threads = _os_threads()
        self.threaded: list[str] = []  # adopted packages that started threads
        self.pending = b""
        self._ticking = False  # in _meanwhile (a signal handler may run again inside it)
        self._importing = False  # an adoption's import is under way: _meanwhile may end it
        self._broken_off = False  # _meanwhile ended the last adoption's import (its time, or the client gone)
        self.guards: list[ExitGuard] = []  # one per adoption in place, registered before its import
        self.jobs: dict[int, _Job] = {}  # by pid
        self.by_fd: dict[int, _Job] = {}
        self.poll = select.poll()
        self.poll.register(requests, select.POLLIN)
        self.open = True
        self.forks = 0  # children forked here, and the CPU seconds the forks took (copying the page tables)
        self.fork_cpu = 0.0
        # Its memory in 2 MiB pages as it grows (the prerequisites', then each adoption's): a child costs a
        # third as much to fork and to end (fork/pages.py).
        self.pages = Collapser()
        self.pages.collapse()

    def send(self, message: dict[str, Any]) -> None:
        write_all(self.replies, (json.dumps(message) + "\n").encode())

    def serve(self) -> int | None:
        """The server's loop; returns an exit status in a forked child (None in the server, at the end)."""
        while self.open or self.jobs:
            ready = [fd for fd, _event in self.poll.poll(self._wait())]
            # The children's pipes first, the client's requests last: a request may adopt a package, and
            # while it imports, the tick reads (and closes) the pipes this poll said were ready.
            for fd in ready:
                if fd != self.requests:
                    self._read_child(fd)
            if self.requests in ready:
                code = self._read_requests()
                if code is not None:
                    return code
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
                self._broken_off = True
                raise _Timeout
            for fd, _event in self.poll.poll(0):
                if fd != self.requests:
                    self._read_child(fd)
                    continue
                chunk = os.read(fd, 65536)
                if not chunk:
                    self._hangup()
                    if self._importing:
                        self._broken_off = True
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
            "huge_mib": self.pages.done >> 20,
        }

    def _refusal(self, request: dict[str, Any]) -> tuple[str, list[str]]:
        """Why no child is forked for *request* ("" if one is), and the adopted packages whose imports
        brought its own modules in (the client orders the next run by them)."""
        if self.closed:
            return self.closed, []
        if request.get("imported_ok") and _imported(request):
            return "", []  # its child finds it loaded, as a prerequisite's module is (probe.steps)
        hit = sorted(str(n) for n in request.get("own") or [] if str(n) in self.imported)
        by = sorted({self.brought[n] for n in hit})
        return (f"{', '.join(hit[:3])} imported here already, by the import of {', '.join(by)}" if hit else ""), by

    def _adopt(self, name: str, timeout: float, run: Callable[[], bool] | None = None) -> None:
        """Import *name* here (*run*: the import, True where it worked): on failure, forget every module it
        added; if it initialised CUDA, fork no more children; if it started a thread, name it."""
        _mark()
        deadline = time.monotonic() + max(timeout, 1.0)
        previous = signal.signal(signal.SIGALRM, lambda _signum, _frame: self._meanwhile(deadline))
        signal.siginterrupt(signal.SIGALRM, False)  # what the import waits on in C is restarted, not failed
        ok, self._importing, self._broken_off = False, True, False
        signal.setitimer(signal.ITIMER_REAL, _TICK, _TICK)
        try:
            try:
                ok = run() if run is not None else importlib.import_module(name) is not None
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
                self._importing = False  # a tick still due reads on, and raises nothing into what follows
        except BaseException:  # noqa: BLE001 - whatever it raised, the record says; here it is only undone
            ok = False
        finally:
            signal.signal(signal.SIGALRM, previous)
        added = [module for module in _added() if module not in self.seen]
        if not ok:
            for module in added:
                sys.modules.pop(module, None)
            added = []
        if _cuda_initialised():
            self.closed, self.closed_by = f"importing {name} initialised CUDA", name
            return
        if ok:
            self.adopted.append(name)
        threads = _os_threads()
        if threads > self.threads:  # forked children inherit none of them: said, and failures asked again
            self.threaded.append(name)
            self.threads = threads
        self.seen.update(added)
        for module in added:
            parts = module.split(".")
            for prefix in (".".join(parts[: i + 1]) for i in range(len(parts))):
                if prefix not in self.imported:
                    self.imported.add(prefix)
                    self.brought[prefix] = name
        gc.freeze()  # what it made is shared with the children too
        self.pages.collapse()

    def _fork(self, request: dict[str, Any]) -> int | None:
        refused, by = self._refusal(request)
        if refused:
            self.send({"id": request.get("id"), "refused": refused, "by": by, **self.adoption()})
            return None
        pre = [str(m) for m in request.get("pre") or []]
        if (
            request.get("imported_ok")
            and request.get("path")
            and _imported(request)
            and not request.get("environ")
            and all(m in sys.modules for m in pre)
        ):
            # Loaded here already, from that file, by an adopted package: it linked and initialised in this
            # process. A child would import and load nothing (probe.steps) and end with no exit handler of its
            # own: the server answers what it would, with no fork (pid None).
            record = {"ok": True, "step": f"load {request['path']}", "attempts": []}
            reply = {"id": request.get("id"), "pid": None, "returncode": 0, "stdout": "", "stderr": ""}
            self.send({**reply, "seconds": 0.0, "timed_out": False, "record": record, **self.adoption()})
            return None
        if (
            request.get("adopt")
            and request.get("name")
            and not request.get("path")
            and not request.get("environ")
            and not any(os.path.isabs(m) for m in pre)  # libraries loaded first are the child's alone
        ):
            return self._adopt_in_place(request, pre)
        return self._fork_child(request)

    def _adopt_in_place(self, request: dict[str, Any], pre: list[str]) -> int | None:
        """The package *request* names imported by the server itself after the modules *pre*, as a child
        would import it (``probe.steps``, what it writes captured, the exit handlers it registers kept), then
        a child forked to end it (run_exit_child): its reply is the import's, and tells what the adoption
        did. Nobody is answered once the client is gone."""
        global _recording  # noqa: PLW0603 - the server's one atexit.register, and one adoption at a time
        name = str(request["name"])
        guard = ExitGuard(clear=False)  # its C handler is older than every one the import registers
        self.guards.append(guard)
        handlers: list[tuple[Any, tuple[Any, ...], dict[str, Any]]] = []
        record: dict[str, Any] | None = None

        def run() -> bool:
            nonlocal record
            record = steps(pre, None, name)
            return bool(record["ok"])

        started = time.monotonic()
        importlib.invalidate_caches()  # a fresh child would see what was installed since the server started
        _recording = handlers
        try:
            with _captured() as out:
                self._adopt(name, float(request.get("timeout", 180.0)), run)
        finally:
            _recording = None
        if not self.open:
            return None
        told = AdoptedHere(
            record=None if self._broken_off else record,
            stdout=out["stdout"],
            stderr=out["stderr"],
            handlers=handlers,
            guard=guard,
        )
        return self._fork_child(request, told, started)

    def _fork_child(
        self, request: dict[str, Any], adopted: AdoptedHere | None = None, started: float | None = None
    ) -> int | None:
        """A child for *request*; *adopted*: the server imported its package itself (since *started*), and
        the child only ends it."""
        pipes = {"stdout": os.pipe(), "stderr": os.pipe(), "record": os.pipe()}
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        server = os.getpid()
        cpu = time.thread_time()
        pid = os.fork()
        if pid == 0:
            inherited = [self.requests, self.replies, *self.by_fd]
            if adopted is not None:
                return run_exit_child(adopted, pipes, server, inherited)
            return run_child(request, pipes, server, inherited)
        self.forks += 1
        self.fork_cpu += time.thread_time() - cpu
        fds: dict[int, str] = {}
        for what, (read, write) in pipes.items():
            os.close(write)
            fds[read] = what
        job = _Job(request, pid, fds, started)
        if adopted is not None and adopted.record is None:
            job.killed_at = time.monotonic()  # broken off at its time limit: the child ends as a killed one
        self.jobs[pid] = job
        for fd in fds:
            self.by_fd[fd] = job
            self.poll.register(fd, select.POLLIN)
        return None

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
        what = job.fds.pop(fd)
        grace = job.request.get("exit_grace")
        if what == "record" and isinstance(grace, (int, float)) and grace >= 0:
            # Its record is sent: what is left is its exit. In a server that adopted packages, an exit that
            # waits on a thread an adoption started (onnxruntime's destructors) waits for ever, the fork having
            # copied no thread: killed after *grace*, not at the load's own time limit (the client asks the
            # load again where every thread is the process's own).
            job.deadline = min(job.deadline, time.monotonic() + float(grace))

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


def cpu_used() -> dict[str, float]:
    """The CPU this process used (user and system seconds), and what its reaped children used."""
    own, reaped = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return {
        "user": own.ru_utime,
        "system": own.ru_stime,
        "children_user": reaped.ru_utime,
        "children_system": reaped.ru_stime,
    }


def run_server(preload: str, adopt: Sequence[str]) -> int:
    """Run the server: take over stdin and stdout for the protocol, import the prerequisites *preload*
    (comma-separated), then adopt the packages *adopt*, say whether that worked, then serve until the client
    closes, and say what CPU it and its children used (``cpu_used``); the exit status."""
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
    atexit.register = _record_register  # type: ignore[assignment]  # what each adoption registers: kept
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
    if code is None:  # the server, its children all reaped: what it and they used, for the client's figures
        with contextlib.suppress(OSError):  # a client gone reads nothing
            server.send({"ended": True, "cpu": {**cpu_used(), "forks": server.forks, "fork_cpu": server.fork_cpu}})
    if code is None and server.guards:
        # The guards of its adoptions in place are C exit handlers that call into Python: run after the
        # interpreter's finalisation, they would crash it. The server has nothing left to finalise.
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(0)
    return 0 if code is None else code
