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
so the cell's ``sys.path`` is the probe's, and its children do what the probe does (``probe.steps``); its
loop is ``fork/server.py``, what each child does ``fork/child.py``, and this module its entry and client. Its
protocol is JSON lines on descriptors it takes over from stdin and stdout before importing the prerequisites
(fd 1 then points at stderr, so what the modules print cannot corrupt it):

    server -> client   {"ready": true}  or  {"ready": false, "step": ..., "type": ..., "message": ...}
    client -> server   {"id": 1, "path": "/x/m.so" or null, "name": "pkg.m", "pre": ["torch"], "timeout": 180,
                        optional: "environ": {"NAME": "value"} (set in the child first),
                        "own": ["pkg", "pkg.m"] (its distribution's modules), "adopt": true,
                        "imported_ok": true (a module imported here already is loaded: not refused)}
    server -> client   {"id": 1, "pid": ..., "returncode": ..., "stdout": ..., "stderr": ..., "seconds": ...,
                        "timed_out": ..., "record": {"ok": ..., "step": ..., ...} or null,
                        "adopted": 12, "closed": "", "huge_mib": 412 (its memory in 2 MiB pages)}
                       or {"id": 1, "refused": "why", "by": ["adopted.package"]} (no child was forked)
    server -> client   {"ended": true, "cpu": {"user": 3.1, "system": 1.2, "children_user": 40.2,
                        "children_system": 17.9, "forks": 640, "fork_cpu": 6.3}} (seconds; fork_cpu: the
                        part of its own that its forks took), last: the client closed and every child is reaped

Adoption (``"adopt": true`` on a package's import): the server imports the package itself, as a child would
(the probe's steps, what the import writes captured, the exit handlers it registers kept), then forks a child
that only ends it as the child that imported it would have (its exit handlers alone run, so a crash at exit
is seen), and the reply is that import's. The children forked after it start with the package and pay only
for their own part, and the package's import is paid once: the import stage costs about what one
interpreter importing everything costs, not that times the shared dependencies. Isolation is
kept where it matters: a load whose own modules (``"own"``) an adopted package imported is refused, and the
client asks a server that adopts nothing (the refusal names the adoptions that brought them in: the client
orders the next run by them, imports.order), unless it says ``"imported_ok"`` and the module itself is imported
here already (by name, from the same file for a load by path): an adopted package's import loaded it, and its
child finds it loaded as a prerequisite's module is; an adoption that fails is undone (its modules forgotten), and one
that initialised CUDA closes the server to new children. A package that started a thread at import is
named (``"threaded"``): a forked child inherits none of its threads, so the client asks every failure again
of a server that adopts nothing, whose verdict is the one kept. An adoption holds up no child already
running: while it imports, a tick (SIGALRM, every 50 ms, syscalls restarted) reads the children's pipes and
answers those done; requests that come meanwhile are forked after it, and a client gone breaks it off.

Closing the server's stdin ends it: running children are killed with their groups.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import dataclasses
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import IO, Any, TypeGuard

from compatlab.incell.fork.server import run_server
from compatlab.incell.loading.failure import LoadFailure, classify_record
from compatlab.incell.probe import RESULT_TAG
from compatlab.incell.proc import HERE, Completed, bytecode_prefix, module_command

__all__ = ["CpuUsed", "ForkServer", "Refused", "ServerGone", "enabled", "main"]

ENV_SWITCH = "COMPATLAB_IMPORT_FORKSERVER"


def enabled(environ: Mapping[str, str] | None = None) -> bool:
    """True unless $COMPATLAB_IMPORT_FORKSERVER is 0, false, no or off (then every load is a fresh process)."""
    value = (environ if environ is not None else os.environ).get(ENV_SWITCH, "1")
    return value.strip().lower() not in ("0", "false", "no", "off")


def main(argv: Sequence[str] | None = None) -> int:
    """``[PRELOAD [ADOPT]]``: run the server: import the prerequisites (comma-separated), then adopt the
    packages ADOPT (comma-separated; those a server before it adopted), say whether that worked, then serve."""
    args = sys.argv[1:] if argv is None else argv
    preload = args[0] if args else ""
    adopt = [m for m in (args[1] if len(args) > 1 else "").split(",") if m]
    return run_server(preload, adopt)


class ServerGone(Exception):
    """The fork server could not start, or died: the per-process path has to answer."""


class Refused(Exception):
    """The server forked no child for the load: an adopted package imported the module's own already, or
    the server forks no more (``closed``). A server that adopts nothing has to answer. *by*: the adopted
    packages whose imports brought the module's own in (none for a closed server)."""

    def __init__(self, why: str, by: Sequence[str] = ()) -> None:
        super().__init__(why)
        self.by = tuple(by)


@dataclasses.dataclass(frozen=True, kw_only=True)
class CpuUsed:
    """The CPU seconds a server used itself (its prerequisites, its adoptions, its forks: ``fork_cpu`` of
    them, over ``forks`` forks) and its children used (their loads, their exits), as it told them at its end."""

    user: float
    system: float
    children_user: float
    children_system: float
    forks: int = 0
    fork_cpu: float = 0.0

    @classmethod
    def of(cls, told: object) -> CpuUsed | None:
        """From the server's ``"cpu"``; None where that is not four numbers."""
        if not isinstance(told, dict):
            return None
        keys = ("user", "system", "children_user", "children_system")
        values = [v for v in (told.get(key) for key in keys) if _seconds(v)]
        if len(values) != len(keys):
            return None
        user, system, children_user, children_system = (float(v) for v in values)
        forks, fork_cpu = told.get("forks"), told.get("fork_cpu")
        return cls(
            user=user,
            system=system,
            children_user=children_user,
            children_system=children_system,
            forks=forks if isinstance(forks, int) and not isinstance(forks, bool) and forks >= 0 else 0,
            fork_cpu=float(fork_cpu) if _seconds(fork_cpu) else 0.0,
        )


def _seconds(value: object) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0


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
        self.huge_mib = 0  # how much of its memory it has in 2 MiB pages (fork/pages.py), as last told
        self.cpu: CpuUsed | None = None  # what it and its children used, once it ended (None: it never said)
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
        command = module_command(
            python, "forkserver", ",".join(preload), ",".join(adopt), root=HERE, bytecode=bytecode_prefix()
        )
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
            if isinstance(reply.get("huge_mib"), int):
                self.huge_mib = reply["huge_mib"]

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
        imported_ok: bool = False,
        exit_grace: float | None = None,
    ) -> tuple[LoadFailure | None, Completed]:
        """Load one module in a forked child, as ``loadcheck.load_module`` does in a fresh interpreter;
        *environ* is set in the child's environment first (what the programs it starts see). *own*: the
        modules of the module's own distribution (Refused when an adopted package imported one); *adopt*:
        the server imports package *name* itself, and a child ends it (the module's docstring);
        *imported_ok*: a module imported there already (from *path*, when given) is not refused for *own*;
        *exit_grace*: seconds the child may take to end once it has sent its record (else the *timeout*)."""
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
        if imported_ok:
            request["imported_ok"] = True
        if exit_grace is not None:
            request["exit_grace"] = exit_grace
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
            raise Refused(str(reply["refused"]), [str(b) for b in reply.get("by") or []])
        done = Completed(
            argv=[
                self._python,
                f"<fork of server {self.pid}: pid {reply['pid']}>"
                if reply["pid"] is not None
                else f"<server {self.pid}: imported there already>",
                path or "",
                name,
                ",".join(pre_import),
            ],
            returncode=int(reply["returncode"]),
            stdout=str(reply["stdout"]),
            stderr=_stderr(reply),
            seconds=float(reply["seconds"]),
            timed_out=bool(reply["timed_out"]),
            pid=None if reply["pid"] is None else int(reply["pid"]),
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
            if "ended" in message:
                self.cpu = CpuUsed.of(message.get("cpu"))
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
