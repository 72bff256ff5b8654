"""What a child of the fork server does, from the fork to its exit.

It is the leader of its own session and process group (a timeout kills all it started), dies with the server
(Linux's PR_SET_PDEATHSIG), writes to its own stdout and stderr pipes, closes every descriptor of the server's,
forgets what the finders cached, sets the environment the request names, does what the probe does
(``probe.steps``) and sends its record as JSON down a pipe of its own. It ends the way the probe does (status 0
or 3, through the C library's exit), but for what it inherited (``ExitGuard``).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import dataclasses
import importlib
import json
import os
import signal
import sys
from typing import Any, NoReturn

from compatlab.incell.probe import steps

__all__ = ["ExitGuard", "die_with_parent", "run_child", "run_exit_child", "write_all"]


def die_with_parent() -> None:
    # Linux's PR_SET_PDEATHSIG: a server killed outright (its test run timed out) takes its children along,
    # instead of leaving a hung load running with no one to time it out.
    with contextlib.suppress(AttributeError, OSError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class ExitGuard:
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

    def __init__(self, *, clear: bool = True) -> None:
        if clear:  # at the fork: what the child inherited is not its own (an adoption keeps them: run_exit_child)
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


def _become_child(pipes: dict[str, tuple[int, int]], server: int, inherited: list[int]) -> int:
    """The child's start: its own session, death with the server, its own stdout and stderr pipes, none of
    the server's descriptors; its record's descriptor."""
    os.setsid()  # its own session and process group: a timeout kills all it started
    die_with_parent()
    if os.getppid() != server:  # the server died before the line above
        os._exit(70)
    os.dup2(pipes["stdout"][1], 1)
    os.dup2(pipes["stderr"][1], 2)
    record_fd = pipes["record"][1]
    for fd in [
        *inherited,
        pipes["stdout"][1],
        pipes["stderr"][1],
        *(read for read, _ in pipes.values()),
    ]:
        os.close(fd)
    return record_fd


def run_exit_child(
    adoption: AdoptedHere,
    pipes: dict[str, tuple[int, int]],
    server: int,
    inherited: list[int],
) -> NoReturn:
    """The child forked once the server itself imported a package (an adoption in place): what the import
    wrote goes down this child's stdout and stderr, its record down the record pipe, and the child ends as
    the child that imported it would have: only the handlers the import registered run (the Python ones it
    registered, and the C ones newer than the guard the server registered just before it), then the exit
    status. An import broken off at its time limit ends the child as a killed one does (SIGKILL)."""
    try:
        record_fd = _become_child(pipes, server, inherited)
        record = adoption.record
        if record is None:
            os.kill(os.getpid(), signal.SIGKILL)
            os._exit(70)  # not reached
        atexit._clear()
        for func, args, kwargs in adoption.handlers:
            atexit.register(func, *args, **kwargs)
        write_all(1, adoption.stdout)
        write_all(2, adoption.stderr)
        write_all(record_fd, json.dumps(record).encode())
        os.close(record_fd)
        ok = bool(record.get("ok"))
    except BaseException:  # noqa: BLE001 - never let a child return into the server's loop
        os._exit(70)
    adoption.guard.exit(0 if ok else 3)


@dataclasses.dataclass(frozen=True)
class AdoptedHere:
    """What the server's own import of a package left for the child that ends it (run_exit_child): the
    probe's record (None: broken off at its time limit), what it wrote, the Python exit handlers it
    registered, and the guard registered just before it."""

    record: dict[str, Any] | None
    stdout: bytes
    stderr: bytes
    handlers: list[tuple[Any, tuple[Any, ...], dict[str, Any]]]
    guard: ExitGuard


def run_child(request: dict[str, Any], pipes: dict[str, tuple[int, int]], server: int, inherited: list[int]) -> int:
    """Be the child the server forked for *request*: do what the probe does (``probe.steps``), send the record
    down its pipe, and end as ``ExitGuard`` says (never return into the server's loop). *inherited*: the
    server's own descriptors (its protocol's, the other children's pipes), closed here."""
    try:
        record_fd = _become_child(pipes, server, inherited)
        exit_guard = ExitGuard()
        # A fresh interpreter would see what was installed since the server started: forget what the
        # finders cached (directory listings, and path entries that did not exist then).
        importlib.invalidate_caches()
        os.environ.update({str(k): str(v) for k, v in (request.get("environ") or {}).items()})
        pre = [str(m) for m in request.get("pre") or []]
        record = steps(pre, request.get("path") or None, str(request.get("name") or ""))
        write_all(record_fd, json.dumps(record).encode())
        os.close(record_fd)
    except BaseException:  # noqa: BLE001 - never let a child return into the server's loop
        os._exit(70)  # the server's own code failed in the child: an exit without a record
    exit_guard.exit(0 if record["ok"] else 3)
