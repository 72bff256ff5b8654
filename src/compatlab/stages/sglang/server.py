"""One SGLang server's life (perf's, serve's): in its own process group, polled for health, always stopped.

SGLang's lifecycle, which this follows: the port stays closed while the model loads; then ``/health`` and
``/health_generate`` answer 503 until SGLang's own warm-up request is done; ``/model_info`` and
``/server_info`` (``/get_model_info`` and ``/get_server_info`` are deprecated aliases, tried second) answer
as soon as the port is open. ``/flush_cache`` empties the radix cache and resets the speculative counters
behind ``internal_states[i].avg_spec_accept_length``; it answers 400 while requests run (``?timeout=``
makes it wait for them). Stopping is done when the whole process group is gone, tensor-parallel workers
included (they can hold GPU memory for tens of seconds after the leader exits), and the port is free.

Every request goes through ``compatlab.net``: one deadline for the whole request (a server that drips its
answer is cut off there, and start-up waits no longer than ``startup-timeout`` in all), a capped body, and
JSON checked for the shape read here (``MODEL_INFO_SHAPE``, ``SERVER_INFO_SHAPE``). An answer of the wrong
shape or size is an error at once, never "not healthy yet" nor a figure taken for absent.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shlex
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from compatlab import net
from compatlab.errors import LabError
from compatlab.proc import tethered
from compatlab.runs.model import StageState

if TYPE_CHECKING:
    from compatlab.config.perf import ServerSpec

# The name these records always had, before the server moved out of compatlab.stages.perf.stage: filters keep working.
log = logging.getLogger("compatlab.stages.perf.stage")

_LOG_TAIL = 40
MODEL_INFO = ("/model_info", "/get_model_info")
SERVER_INFO = ("/server_info", "/get_server_info")
NOT_LOGGED = "not logged yet"
SPECULATIVE = "EAGLE3"
_ACCEPT = {"Accept": "application/json"}
# A health poll that had less than this (the start-up deadline's last moment) and got no whole answer says nothing
# of the server: its "no complete answer within 0 s" is the deadline's, so the reason keeps the poll before it.
POLL_SAYS = 0.5
_NAME = (str, type(None))
# What is read of each answer, with the types it must have (other keys are not looked at).
MODEL_INFO_SHAPE = net.Obj(optional={"model_path": _NAME, "served_model_name": _NAME})
_STATES = net.ListOf(net.Obj(optional={"avg_spec_accept_length": (float, type(None))}))
SERVER_INFO_SHAPE = net.Obj(
    optional={
        "speculative_algorithm": _NAME,
        "internal_states": _STATES,
        "decode": net.ListOf(net.Obj(optional={"internal_states": _STATES})),
    }
)
MODELS_SHAPE = net.Obj(optional={"data": net.ListOf(net.Obj(optional={"id": _NAME}))})


class ServerFailure(LabError):
    """A server failed; *state* is how the stage reports it (fail: it died; error: it hung or timed out).

    Exiting is a fail because the stack could not serve; a timeout or stall is an error because the lab
    cannot tell a broken stack from a slow or busy box.
    """

    def __init__(self, state: StageState, message: str, tail: str = "") -> None:
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


def port_is_free(port: int) -> bool:
    """Whether a server could listen on *port* now (SO_REUSEADDR, as uvicorn binds)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))  # noqa: S104 - a probe, closed at once; SGLang may listen on any address
        except OSError:
            return False
        return True


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group *pgid*: from /proc, else whether the group exists."""
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return []
        except PermissionError:
            pass
        return [pgid]
    alive = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            alive.append(int(entry.name))
    return sorted(alive)


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
        self.leftover: str | None = None  # what stop() found still running or listening

    def __enter__(self) -> ServerProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("wb")
        log.info("$ %s", shlex.join(self.argv))
        # Tethered (incell/tether.py): a cell killed outright takes its server along, not just its own pid.
        try:
            command = tethered(self.argv, path=self.env.get("PATH"))
            self.proc = subprocess.Popen(
                command.argv,
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=command.cwd,
                start_new_session=True,
            )
        except OSError as exc:
            self._log.close()
            raise ServerFailure(StageState.FAIL, f"{self.spec.name} server could not start: {exc}") from None
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def tail(self, lines: int = _LOG_TAIL) -> str:
        try:
            data = self.log_path.read_bytes()[-200 * lines :]
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
        return ServerFailure(StageState.FAIL, f"{self.spec.name} server exited with {how} {when}", self.tail())

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def _broken(self, exc: net.HttpError) -> ServerFailure:
        """An answer that cannot be believed (over a cap, not JSON, the wrong shape): the server's error."""
        return ServerFailure(StageState.ERROR, f"{self.spec.name} server: {exc}", self.tail())

    def wait_ready(self) -> dict[str, Any]:
        """Poll health until 200, then the model info, until ``startup-timeout``; return the model info.

        A closed port (loading), 503 (SGLang's own warm-up), and a poll without a whole answer within its
        own deadline (at most 5 s, never past the start-up one) mean "not yet"; an answer of the wrong shape
        or size is an error at once.
        """
        deadline = net.Deadline(self.spec.startup_timeout)
        pause = 0.02
        last = ""  # the last poll's problem, when it was more than a closed port
        while True:
            failure = self.died("before it became healthy")
            if failure:
                raise failure
            left = deadline.left()
            if left <= 0:
                raise ServerFailure(
                    StageState.ERROR,
                    f"{self.spec.name} server did not become healthy within "
                    f"{self.spec.startup_timeout:g} s ({self.spec.health} on port "
                    f"{self.port}){last}",
                    self.tail(),
                )
            poll = min(5.0, left)
            try:
                health = net.request(self.url(self.spec.health), timeout=poll, headers=_ACCEPT)
                last = ""
                if health.status == 200:
                    info = self._first_json(MODEL_INFO, MODEL_INFO_SHAPE, timeout=min(5.0, max(0.001, deadline.left())))
                    if info is not None:
                        return info
            except (net.Unreachable, net.Expired, net.Incomplete) as exc:
                if isinstance(exc, net.Unreachable):
                    last = ""
                elif poll >= POLL_SAYS:  # a poll the start-up deadline cut short says nothing of the server
                    last = f"; the last poll: {exc}"
            except net.HttpError as exc:
                raise self._broken(exc) from None
            time.sleep(min(pause, max(0.0, deadline.left())))
            pause = min(pause * 1.5, 1.0)

    def _first_json(self, paths: tuple[str, ...], shape: net.Shape, *, timeout: float) -> dict[str, Any] | None:
        """The first of *paths* that answers 200, its JSON of *shape*: the current name before the old one.

        All of them within *timeout* seconds; None when none answers 200; net.HttpError for an answer of
        the wrong shape or size, or none within the time.
        """
        deadline = net.Deadline(timeout)
        for path in paths:
            answer = net.request(self.url(path), timeout=max(0.001, deadline.left()), headers=_ACCEPT)
            if answer.status == 200:
                info: dict[str, Any] = answer.json(shape)
                return info
        return None

    def server_info(self) -> dict[str, Any]:
        """``/server_info`` (else ``/get_server_info``); a ServerFailure (error) when neither answers."""
        try:
            info = self._first_json(SERVER_INFO, SERVER_INFO_SHAPE, timeout=10.0)
        except net.HttpError as exc:
            raise self._broken(exc) from None
        if info is None:
            raise ServerFailure(
                StageState.ERROR,
                f"{self.spec.name} server answers neither /server_info nor /get_server_info; is it an SGLang server?",
                self.tail(),
            )
        return info

    def openai_model(self, info: dict[str, Any]) -> str:
        """The name the OpenAI routes answer to: ``/v1/models``, else the model info's names."""
        try:
            answer = net.request(self.url("/v1/models"), timeout=10.0, headers=_ACCEPT)
            models = answer.json(MODELS_SHAPE) if answer.status == 200 else None
        except (net.Unreachable, net.Expired, net.Incomplete):
            models = None
        except net.HttpError as exc:
            raise self._broken(exc) from None
        data = models.get("data") if isinstance(models, dict) else None
        if data and data[0].get("id"):
            return str(data[0]["id"])
        return str(info.get("served_model_name") or info.get("model_path") or "default")

    def flush_cache(self, when: str, *, timeout: float = 60.0) -> None:
        """``/flush_cache``, waiting up to *timeout* for running requests; a ServerFailure if it refuses."""
        try:
            answer = net.request(
                self.url(f"/flush_cache?timeout={timeout:g}"), method="POST", data=b"", timeout=timeout + 10
            )
        except net.HttpError as exc:
            why = str(exc)
        else:
            if answer.status == 200:
                return
            why = f"HTTP {answer.status}: {answer.text().strip()[:300]}"
        raise ServerFailure(
            StageState.ERROR, f"{self.spec.name} server did not flush its cache {when}: {why}", self.tail()
        )

    def server_accept_length(self) -> tuple[float | None, str | None]:
        """``internal_states[0].avg_spec_accept_length`` of ``/server_info``, or None and why not.

        SGLang's figure is lifetime (since the start or the last ``/flush_cache``) and decode-only, and the
        key is absent until the scheduler has logged it (every 40 decode batches): "not logged yet".
        """
        info = self.server_info()
        decode = info.get("decode")
        if isinstance(decode, list) and decode and isinstance(decode[0], dict):
            info = decode[0]  # a prefill/decode split: the decode side speculates
        states = info.get("internal_states")
        state = states[0] if isinstance(states, list) and states and isinstance(states[0], dict) else {}
        value = state.get("avg_spec_accept_length")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            return None, NOT_LOGGED
        return float(value), None

    def _signal(self, sig: signal.Signals) -> None:
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)

    def stop(self) -> None:
        """SIGTERM the group, wait ``stop-timeout``, SIGKILL whatever of it is left, then wait (up to
        ``release-timeout``) until no process of the group is alive and the port is free.

        Whatever is still there after that is described in ``leftover``, for the caller to report.
        """
        if self.proc is None:
            return
        try:
            if self.proc.poll() is None:
                self._signal(signal.SIGTERM)
                try:
                    self.proc.wait(timeout=self.spec.stop_timeout)
                except subprocess.TimeoutExpired:
                    log.warning(
                        "%s server did not stop within %g s of SIGTERM; killing its process group",
                        self.spec.name,
                        self.spec.stop_timeout,
                    )
            # Workers (tensor-parallel ranks) can outlive the leader: the group goes whole.
            self._signal(signal.SIGKILL)
            self.proc.wait(timeout=30)
            if self.returncode is None:
                self.returncode = self.proc.returncode
            self.leftover = self._wait_released()
        finally:
            if self._log is not None:
                self._log.close()

    def _wait_released(self) -> str | None:
        assert self.proc is not None
        deadline = time.monotonic() + self.spec.release_timeout
        pause = 0.01
        while True:
            members = group_members(self.proc.pid)
            if members:
                self._signal(signal.SIGKILL)
            elif port_is_free(self.port):
                return None
            if time.monotonic() >= deadline:
                if members:
                    return (
                        f"{self.spec.name} server's process group {self.proc.pid} still has live "
                        f"processes {members} {self.spec.release_timeout:g} s after SIGKILL (a worker "
                        "stuck in the driver?); the next server would start against a busy GPU"
                    )
                return (
                    f"port {self.port} is still in use {self.spec.release_timeout:g} s after the "
                    f"{self.spec.name} server's process group exited"
                )
            time.sleep(pause)
            pause = min(pause * 2, 0.5)


def check_speculation(
    server: ServerProcess, name: str, record: dict[str, Any], *, argv_key: str = "perf.servers.{name}.argv"
) -> None:
    """The eagle3 server must run EAGLE3 and the baseline must not speculate, as ``/server_info`` says."""
    info = server.server_info()
    if "speculative_algorithm" not in info:
        raise ServerFailure(
            StageState.ERROR,
            f"{name} server's /server_info has no speculative_algorithm; cannot tell whether it speculates",
            server.tail(),
        )
    algorithm = info["speculative_algorithm"]
    record["speculative_algorithm"] = algorithm
    if name == "eagle3" and str(algorithm).upper() != SPECULATIVE:
        raise ServerFailure(
            StageState.ERROR,
            f"the eagle3 server does not run {SPECULATIVE}: /server_info reports "
            f"speculative_algorithm {json.dumps(algorithm)}; add "
            f'"--speculative-algorithm", "{SPECULATIVE}" to '
            f"{argv_key.format(name=name)}",
            server.tail(),
        )
    if name == "baseline" and algorithm not in (None, "", "NONE"):
        raise ServerFailure(
            StageState.ERROR,
            "the baseline server speculates: /server_info reports "
            f"speculative_algorithm {json.dumps(algorithm)}; drop "
            f"--speculative-algorithm from {argv_key.format(name=name)}",
            server.tail(),
        )
