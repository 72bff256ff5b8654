"""One perf server's life: started in its own process group, polled for health, always stopped."""

from __future__ import annotations

import contextlib
import http.client
import logging
import os
import shlex
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from compatlab.errors import LabError
from compatlab.stages.perf.client import get_json

if TYPE_CHECKING:
    from compatlab.config.perf import ServerSpec

# The name these records always had, before the server moved out of compatlab.stages.perf.stage: filters keep working.
log = logging.getLogger("compatlab.stages.perf.stage")

_LOG_TAIL = 40


class ServerFailure(LabError):
    """A server failed; *state* is how the stage reports it (fail: it died; error: it hung or timed out).

    Exiting is a fail because the stack could not serve; a timeout or stall is an error because the lab
    cannot tell a broken stack from a slow or busy box.
    """

    def __init__(self, state: str, message: str, tail: str = "") -> None:
        super().__init__(message)
        self.state = state
        self.tail = tail


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServerProcess:
    """A server in its own process group, its output in a log file; a context manager that always stops it.

    ``argv`` may hold ``{port}``; ``spec.port`` None picks a free loopback port.
    """

    def __init__(self, spec: ServerSpec, argv: list[str], env: dict[str, str], log_path: Path) -> None:
        self.spec = spec
        self.port = spec.port or _free_port()
        self.argv = [a.replace("{port}", str(self.port)) for a in argv]
        self.env = env
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self.returncode: int | None = None

    def __enter__(self) -> ServerProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("wb")
        log.info("$ %s", shlex.join(self.argv))
        try:
            self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=self._log,
                                         stderr=subprocess.STDOUT, env=self.env, start_new_session=True)
        except OSError as exc:
            self._log.close()
            raise ServerFailure("fail", f"{self.spec.name} server could not start: {exc}") from None
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def tail(self, lines: int = _LOG_TAIL) -> str:
        try:
            data = self.log_path.read_bytes()[-200 * lines:]
        except OSError:
            return ""
        return "\n".join(data.decode("utf-8", "replace").splitlines()[-lines:])

    def died(self, when: str) -> ServerFailure | None:
        """A failure if the process has exited."""
        assert self.proc is not None
        code = self.proc.poll()
        if code is None:
            return None
        self.returncode = code
        how = _describe_exit(code)
        return ServerFailure("fail", f"{self.spec.name} server exited with {how} {when}", self.tail())

    def wait_ready(self) -> dict[str, Any]:
        """Poll health, then the model info, until ``startup-timeout``; return the model info."""
        deadline = time.monotonic() + self.spec.startup_timeout
        pause = 0.02
        while True:
            failure = self.died("before it became healthy")
            if failure:
                raise failure
            left = deadline - time.monotonic()
            if left <= 0:
                raise ServerFailure("error", f"{self.spec.name} server did not become healthy within "
                                        f"{self.spec.startup_timeout:g} s ({self.spec.health} on port "
                                        f"{self.port})", self.tail())
            try:
                status, _ = get_json("127.0.0.1", self.port, self.spec.health, timeout=min(5.0, left))
                if status == 200:
                    for path in ("/get_model_info", "/model_info"):
                        status, info = get_json("127.0.0.1", self.port, path, timeout=min(5.0, left))
                        if status == 200 and isinstance(info, dict):
                            return info
            except (OSError, http.client.HTTPException):
                pass
            time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
            pause = min(pause * 1.5, 1.0)

    def server_accept_length(self) -> float | None:
        for path in ("/get_server_info", "/server_info"):
            try:
                status, info = get_json("127.0.0.1", self.port, path, timeout=10.0)
            except (OSError, http.client.HTTPException):
                return None
            if status == 200 and isinstance(info, dict):
                states = info.get("internal_states")
                state = states[0] if isinstance(states, list) and states else info
                value = state.get("avg_spec_accept_length") if isinstance(state, dict) else None
                return float(value) if isinstance(value, (int, float)) and value > 0 else None
        return None

    def _signal(self, sig: signal.Signals) -> None:
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)

    def stop(self) -> None:
        """SIGTERM the group, wait ``stop-timeout``, then SIGKILL whatever of the group is left."""
        if self.proc is None:
            return
        try:
            if self.proc.poll() is None:
                self._signal(signal.SIGTERM)
                try:
                    self.proc.wait(timeout=self.spec.stop_timeout)
                except subprocess.TimeoutExpired:
                    log.warning("%s server did not stop within %g s of SIGTERM; killing its process group",
                                self.spec.name, self.spec.stop_timeout)
            # Workers (tensor-parallel ranks) can outlive the leader: the group goes whole.
            self._signal(signal.SIGKILL)
            self.proc.wait(timeout=30)
            if self.returncode is None:
                self.returncode = self.proc.returncode
        finally:
            if self._log is not None:
                self._log.close()
