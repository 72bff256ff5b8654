"""HTTP for every client of the lab: SGLang's health and info routes and ``/flush_cache``, the streaming
benchmark client, the package index. Each request is bounded as a whole, never per read.

- **One deadline per request** (``Deadline``, on ``time.monotonic``) for connecting, sending, the status
  line, the headers and the body together: every socket read waits at most the time left and none starts
  after it, so a server that drips a byte a second is cut off at the deadline (a 15 s start-up limit once
  held 103 s against one, each read's socket timeout restarting at every byte). A redirect that is followed
  spends the same deadline. Name resolution is the one wait it cannot cut (``getaddrinfo`` takes no
  timeout); the lab's own servers are on loopback.
- **Caps.** A body is read up to *limit* bytes (``BODY_LIMIT`` unless the caller says), a stream's line up
  to ``LINE_LIMIT`` (``Lines``); a ``Content-Length`` over the cap is refused before reading. Past a cap the
  answer is refused with the URL, the cap and what arrived, before it is in memory. A body short of its
  ``Content-Length``, or a chunked body cut before its last chunk, is no answer either.
- **Shape-checked JSON.** ``check_shape(value, Obj(...))`` names the first key whose value has the wrong
  type (``internal_states: expected an array, got an object``); ``Answer.json`` adds the URL. A JSON
  number must be finite (``NaN`` parses, and never compares).
- **Redirects are not followed** unless the caller asks (the index follows them; credentials go to the
  index's own host only, by URL prefix), and every URL in a message is redacted (``compatlab.urls``).

Errors are ``HttpError`` subclasses with the (redacted) URL and the reason apart, so that a caller may say
it its own way: ``Expired``, ``TooLarge``, ``Incomplete``, ``BadJson``, ``BadShape``, ``Unreachable`` (no
answer at all: refused, reset; ``error`` holds the ``OSError``). An HTTP error status is an ``Answer``, not
an exception.

Standard library only, with ``compatlab.errors`` and ``compatlab.urls``: stages/, index/ and anything else
may import it.
"""

from __future__ import annotations

import dataclasses
import functools
import http.client
import io
import json
import math
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from email.message import Message
from typing import Any, TypeAlias
from urllib.parse import urlsplit

from compatlab.errors import LabError
from compatlab.urls import Credentials, redact, redact_text

__all__ = [
    "BODY_LIMIT",
    "LINE_LIMIT",
    "Answer",
    "BadJson",
    "BadShape",
    "Deadline",
    "Expired",
    "HttpError",
    "Incomplete",
    "Lines",
    "ListOf",
    "Obj",
    "Shape",
    "TooLarge",
    "Unreachable",
    "check_shape",
    "request",
    "size",
]

BODY_LIMIT = 8 << 20  # an answer of SGLang's JSON routes: its /server_info is a few KiB
# One SSE line of a stream: SGLang's /generate repeats the whole text and every token id so far in each event,
# about 14 bytes a token, so 8 MiB is half a million tokens.
LINE_LIMIT = 8 << 20
_CHUNK = 64 << 10


class HttpError(LabError):
    """A request that got no answer to believe; ``url`` is redacted, ``reason`` says why without it."""

    def __init__(self, url: str, reason: str) -> None:
        self.url = redact(url)
        self.reason = reason
        super().__init__(f"{self.url}: {reason}")


class Expired(HttpError):
    """The request's deadline passed before the whole answer was in."""


class TooLarge(HttpError):
    """A body or a line over its cap; ``announced`` when a Content-Length said so before any was read."""

    def __init__(self, url: str, reason: str, *, announced: bool = False) -> None:
        super().__init__(url, reason)
        self.announced = announced


class Incomplete(HttpError):
    """A body short of its Content-Length, or a chunked body without its last chunk."""


class BadJson(HttpError):
    """A body that is not JSON."""


class BadShape(HttpError):
    """Valid JSON of the wrong shape: ``reason`` names the key path and the type found."""


class Unreachable(HttpError):
    """No answer at all (refused, reset, no such file); ``error`` is what the socket or the file said."""

    def __init__(self, url: str, reason: str, error: BaseException | None = None) -> None:
        super().__init__(url, reason)
        self.error = error


def size(n: int) -> str:
    """``8 MiB``, ``256 KiB``, ``8388609 bytes``: exact, never rounded (a cap and what passed it differ by one)."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} bytes"


class Deadline:
    """A point in ``time.monotonic``, *seconds* from now."""

    __slots__ = ("at", "seconds")

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.at = time.monotonic() + seconds

    def left(self) -> float:
        return self.at - time.monotonic()

    @property
    def passed(self) -> bool:
        return self.left() <= 0

    @property
    def reason(self) -> str:
        return f"no complete answer within {round(self.seconds, 2):g} s"


class _Past(TimeoutError):
    """Raised by a read that would start after the deadline."""


def _wait(deadline: Deadline) -> float:
    left = deadline.left()
    if left <= 0:
        raise _Past(deadline.reason)
    return left


class _Reader(io.RawIOBase):
    """A socket's reads (through its own raw file, which keeps the socket open while the answer is read, as
    http.client expects), each allowed only the time left before the deadline."""

    def __init__(self, sock: socket.socket, deadline: Deadline) -> None:
        super().__init__()
        self._sock = sock
        self._raw = sock.makefile("rb", buffering=0)
        self._deadline = deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        self._sock.settimeout(_wait(self._deadline))
        return self._raw.readinto(buffer) or 0

    def close(self) -> None:
        self._raw.close()
        super().close()


class _Socket:
    """A connected socket whose reads and sends stop at the deadline (http.client reads through ``makefile``)."""

    def __init__(self, sock: socket.socket, deadline: Deadline) -> None:
        self._sock = sock
        self._deadline = deadline

    def makefile(self, mode: str = "rb", *args: Any, **kwargs: Any) -> io.BufferedReader:
        return io.BufferedReader(_Reader(self._sock, self._deadline))

    def sendall(self, data: Any) -> None:
        self._sock.settimeout(_wait(self._deadline))
        self._sock.sendall(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


class _HTTPConnection(http.client.HTTPConnection):
    def __init__(self, *args: Any, deadline: Deadline, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline = deadline

    def connect(self) -> None:
        self.timeout = _wait(self._deadline)
        super().connect()
        self.sock = _Socket(self.sock, self._deadline)


class _HTTPSConnection(http.client.HTTPSConnection):
    def __init__(self, *args: Any, deadline: Deadline, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline = deadline

    def connect(self) -> None:
        self.timeout = _wait(self._deadline)  # the TLS handshake too
        super().connect()
        self.sock = _Socket(self.sock, self._deadline)


class _HTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, deadline: Deadline) -> None:
        super().__init__()
        self._deadline = deadline

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(functools.partial(_HTTPConnection, deadline=self._deadline), req)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, deadline: Deadline) -> None:
        super().__init__()
        self._deadline = deadline

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        connection = functools.partial(_HTTPSConnection, deadline=self._deadline)
        return self.do_open(connection, req, context=self._context)  # type: ignore[attr-defined]


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A 3xx is the answer: the lab's servers never redirect, and following one is a request nobody checked."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Answer:
    """A whole answer: its status (an error status too), headers, body and the URL that answered."""

    status: int
    headers: Message
    body: bytes
    url: str  # after redirects, when they were followed; with no credentials (they never are in a URL here)

    def text(self) -> str:
        return self.body.decode("utf-8", "replace")

    def json(self, shape: Shape | None = None) -> Any:
        """The body as JSON, checked against *shape*: BadJson or BadShape (with the URL) otherwise."""
        try:
            value = json.loads(self.body)
        except (ValueError, RecursionError) as exc:
            raise BadJson(self.url, f"the answer is not JSON ({size(len(self.body))}): {exc}") from None
        if shape is not None and (problem := check_shape(value, shape)):
            raise BadShape(self.url, problem)
        return value


def _opener(
    deadline: Deadline, url: str, credentials: Credentials | None, *, follow_redirects: bool, proxies: bool
) -> urllib.request.OpenerDirector:
    handlers: list[urllib.request.BaseHandler] = [_HTTPHandler(deadline), _HTTPSHandler(deadline)]
    if not follow_redirects:
        handlers.append(_NoRedirect())
    if not proxies:
        handlers.append(urllib.request.ProxyHandler({}))
    if credentials is not None:
        parts = urlsplit(url)
        manager = urllib.request.HTTPPasswordMgrWithPriorAuth()
        manager.add_password(
            None,
            f"{parts.scheme}://{parts.netloc}/",
            credentials.username,
            credentials.password or "",
            is_authenticated=True,
        )
        handlers.append(urllib.request.HTTPBasicAuthHandler(manager))
    return urllib.request.build_opener(*handlers)


def _read_body(response: Any, url: str, limit: int) -> bytes:
    """At most *limit* bytes, whole by its Content-Length; each read bounded by the connection's deadline."""
    length = (response.headers.get("Content-Length", "") if response.headers else "").strip()
    announced = int(length) if length.isdigit() else None
    if announced is not None and announced > limit:
        raise TooLarge(
            url,
            f"its Content-Length announces {size(announced)}, more than the {size(limit)} this lab reads of one answer",
            announced=True,
        )
    chunks: list[bytes] = []
    total = 0
    read = getattr(response, "read1", None) or response.read
    while True:
        chunk = read(min(_CHUNK, limit + 1 - total))
        if not chunk:
            break
        total += len(chunk)
        if total > limit:
            raise TooLarge(url, f"the answer is larger than the {size(limit)} this lab reads of one answer")
        chunks.append(chunk)
    if announced is not None and total != announced:
        raise Incomplete(
            url, f"the answer was cut short: {total} of the {announced} bytes its Content-Length announced"
        )
    return b"".join(chunks)


def request(
    url: str,
    *,
    timeout: float,
    method: str = "GET",
    limit: int = BODY_LIMIT,
    headers: Mapping[str, str] | None = None,
    data: bytes | None = None,
    credentials: Credentials | None = None,
    follow_redirects: bool = False,
    proxies: bool = False,
) -> Answer:
    """One request, whole (connection to last byte, redirects included) within *timeout* seconds of wall clock.

    *url* is http(s):// or file:// and carries no credentials (pass them apart: HTTP basic auth, sent to
    *url*'s own scheme and host only). *proxies*: honour the environment's proxy settings (an index may be
    behind one; the lab's own servers are on loopback). Raises an HttpError; an HTTP error status is an Answer.
    """
    deadline = Deadline(timeout)
    # Callers pass an http(s):// URL they built, or an index URL that matrix.toml admitted (http(s), file).
    req = urllib.request.Request(url, data=data, method=method, headers={"User-Agent": "compatlab", **(headers or {})})  # noqa: S310
    opener = _opener(deadline, url, credentials, follow_redirects=follow_redirects, proxies=proxies)
    try:
        try:
            response: Any = opener.open(req, timeout=timeout)
        except urllib.error.HTTPError as exc:
            if exc.fp is None:  # urllib's own refusal (a redirect loop): nothing to read
                return Answer(status=exc.code, headers=exc.headers or Message(), body=b"", url=url)
            response = exc  # an error status is an answer; its body is read as any other
        with response:
            body = _read_body(response, url, limit)
            found = response.headers if response.headers is not None else Message()
            return Answer(status=response.getcode() or 200, headers=found, body=body, url=response.geturl() or url)
    except HttpError:
        raise
    except http.client.IncompleteRead:
        raise Incomplete(url, "the answer was cut short (a chunked body without its last chunk)") from None
    except (OSError, http.client.HTTPException, ValueError) as exc:
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        # Every wait was given only the time left: a timeout is the deadline.
        if isinstance(reason, TimeoutError) or deadline.passed:
            raise Expired(url, deadline.reason) from None
        text = redact_text(str(reason)) or type(reason).__name__
        raise Unreachable(url, text, reason if isinstance(reason, BaseException) else exc) from None


class Lines:
    """A byte stream cut into lines (``\\n``-ended, the end stripped), none longer than *limit* (TooLarge)."""

    def __init__(self, url: str, limit: int = LINE_LIMIT) -> None:
        self._url = url
        self._limit = limit
        self._line = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        end = data.rfind(b"\n")
        if end < 0:
            self._line += data
            self._check(len(self._line))
            return []
        self._line += data[: end + 1]
        lines = self._line.split(b"\n")[:-1]
        self._line = bytearray(data[end + 1 :])
        for line in lines:
            self._check(len(line), ended=True)
        self._check(len(self._line))
        return [bytes(line) for line in lines]

    def _check(self, n: int, *, ended: bool = False) -> None:
        if n > self._limit:
            arrived = size(n) if ended else f"{size(n)} had arrived without its end"
            raise TooLarge(
                self._url,
                f"a line of the stream is longer than the {size(self._limit)} this lab reads of one line ({arrived})",
            )


# -- the shape checker ------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Obj:
    """A JSON object with keys of these shapes: *required* ones must be there; others may be anything."""

    required: Mapping[str, Shape] = dataclasses.field(default_factory=dict)
    optional: Mapping[str, Shape] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, slots=True)
class ListOf:
    """A JSON array whose every item has *item*'s shape."""

    item: Shape


# A JSON type (str, int, float: any finite number, bool, None, dict, list), an Obj, a ListOf, or a tuple of
# them: any one of them.
Shape: TypeAlias = type | Obj | ListOf | tuple["Shape", ...]

_NAMES: dict[type, str] = {
    str: "a string",
    int: "an integer",
    float: "a number",
    bool: "true or false",
    type(None): "null",
    dict: "an object",
    list: "an array",
}


def _want(shape: Shape) -> str:
    if isinstance(shape, tuple):
        return " or ".join(_want(s) for s in shape)
    if isinstance(shape, Obj):
        return "an object"
    if isinstance(shape, ListOf):
        return "an array"
    return _NAMES[shape]


def _got(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "an array"
    kind = "a string" if isinstance(value, str) else "an integer" if isinstance(value, int) else "a number"
    shown = json.dumps(value)
    return f"{kind} ({shown[:40]}…)" if len(shown) > 40 else f"{kind} ({shown})"


def _is(value: Any, kind: type) -> bool:
    if kind is float:
        return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind is type(None):
        return value is None
    return isinstance(value, kind)


def check_shape(value: Any, shape: Shape, path: str = "") -> str | None:
    """The first way *value* (decoded JSON) is not of *shape*, as ``key.path: expected …, got …``; else None.

    >>> meta = Obj(required={"completion_tokens": int})
    >>> check_shape({"meta_info": {"completion_tokens": "7"}}, Obj(required={"meta_info": meta}))
    'meta_info.completion_tokens: expected an integer, got a string ("7")'
    """
    where = f"{path}: " if path else ""
    if isinstance(shape, tuple):
        if any(check_shape(value, s, path) is None for s in shape):
            return None
        # One alternative that matches the outer type (an object for an Obj) says the deeper problem.
        for s in shape:
            if (isinstance(s, Obj) and isinstance(value, dict)) or (isinstance(s, ListOf) and isinstance(value, list)):
                return check_shape(value, s, path)
        return f"{where}expected {_want(shape)}, got {_got(value)}"
    if isinstance(shape, Obj):
        if not isinstance(value, dict):
            return f"{where}expected an object, got {_got(value)}"
        for key, inner in shape.required.items():
            if key not in value:
                return f"{where}expected an object with {key!r}, got one without"
            if problem := check_shape(value[key], inner, f"{path}.{key}" if path else key):
                return problem
        for key, inner in shape.optional.items():
            if key in value and (problem := check_shape(value[key], inner, f"{path}.{key}" if path else key)):
                return problem
        return None
    if isinstance(shape, ListOf):
        if not isinstance(value, list):
            return f"{where}expected an array, got {_got(value)}"
        for i, item in enumerate(value):
            if problem := check_shape(item, shape.item, f"{path}[{i}]"):
                return problem
        return None
    if _is(value, shape):
        return None
    if shape is float and isinstance(value, float):
        return f"{where}expected a finite number, got {value!r}"
    return f"{where}expected {_NAMES[shape]}, got {_got(value)}"
