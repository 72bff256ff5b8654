"""A streaming load client for SGLang-style servers, on asyncio streams (stdlib only).

Two protocols: SGLang's native ``/generate`` (SSE events whose ``meta_info.completion_tokens`` counts the
tokens so far and, with speculative decoding, ``meta_info.spec_verify_ct`` the verify steps) and the
OpenAI-style ``/v1/completions`` (token counts from the final ``usage`` event). A level runs *requests*
requests with *concurrency* in flight and measures output tokens per second over its wall time, time to
first token, and inter-token latency per request.

The client reads in blocks and parses chunked encoding and SSE lines itself, so that under load it handles
many events per wake-up; ``benchmarks/bench_perf_client.py`` shows it is not the bottleneck.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import http.client
import json
import statistics
import time
from collections.abc import Sequence
from typing import Any, Literal

__all__ = ["LevelResult", "RequestResult", "Target", "get_json", "run_level"]

Protocol = Literal["generate", "openai"]
_READ = 1 << 16
_MAX_ERROR_BODY = 2000


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Target:
    """Where and how to talk to a server."""

    host: str = "127.0.0.1"
    port: int
    protocol: Protocol = "generate"
    model: str = "default"  # the OpenAI protocol's "model" field


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class RequestResult:
    """One streamed request; times in seconds from sending it."""

    prompt: int
    ok: bool
    error: str = ""
    tokens: int = 0
    events: int = 0
    ttft: float = 0.0
    latency: float = 0.0
    itl: float = 0.0  # mean time per output token after the first event
    spec_verify_ct: int | None = None


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class LevelResult:
    """All requests of one concurrency level of one trial."""

    concurrency: int
    requests: tuple[RequestResult, ...]
    wall: float

    @property
    def errors(self) -> list[RequestResult]:
        return [r for r in self.requests if not r.ok]

    @property
    def tokens(self) -> int:
        return sum(r.tokens for r in self.requests if r.ok)

    @property
    def tok_s(self) -> float:
        """Output tokens per second over the level's wall time (all streams together)."""
        return self.tokens / self.wall if self.wall > 0 else 0.0

    @property
    def ttft(self) -> float:
        ok = [r.ttft for r in self.requests if r.ok]
        return statistics.median(ok) if ok else 0.0

    @property
    def itl(self) -> float:
        ok = [r.itl for r in self.requests if r.ok and r.tokens > 1]
        return statistics.median(ok) if ok else 0.0

    @property
    def accept_length(self) -> float | None:
        """Sum of completion tokens over sum of verify steps, where the server reports them."""
        spec = [r for r in self.requests if r.ok and r.spec_verify_ct]
        verify = sum(r.spec_verify_ct or 0 for r in spec)
        return sum(r.tokens for r in spec) / verify if verify else None


class _StreamError(Exception):
    pass


class _Body:
    """Incremental decoder: HTTP chunked transfer encoding (or a plain body) into SSE ``data:`` payloads."""

    def __init__(self, chunked: bool) -> None:
        self.chunked = chunked
        self.raw = bytearray()
        self.left = 0  # data bytes left in the current chunk
        self.crlf = 0  # bytes of the CRLF after a chunk still to skip
        self.eof = False  # the last (zero) chunk arrived
        self.line = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        if not self.chunked:
            return self._lines(data)
        self.raw += data
        out: list[bytes] = []
        raw = self.raw
        while raw and not self.eof:
            if self.crlf:
                n = min(self.crlf, len(raw))
                del raw[:n]
                self.crlf -= n
                continue
            if self.left == 0:
                end = raw.find(b"\r\n")
                if end < 0:
                    break
                try:
                    size = int(bytes(raw[:end]).split(b";", 1)[0], 16)
                except ValueError:
                    raise _StreamError(f"bad chunk size {bytes(raw[:end])[:40]!r}") from None
                del raw[: end + 2]
                if size == 0:
                    self.eof = True
                    break
                self.left = size
                continue
            n = min(self.left, len(raw))
            out.extend(self._lines(bytes(raw[:n])))
            del raw[:n]
            self.left -= n
            if self.left == 0:
                self.crlf = 2
        return out

    def _lines(self, data: bytes) -> list[bytes]:
        self.line += data
        if b"\n" not in data:
            return []
        *lines, rest = self.line.split(b"\n")
        self.line = bytearray(rest)
        return [bytes(line[5:]).strip() for line in lines if line.startswith(b"data:")]


def _request_bytes(target: Target, prompt: str, output_len: int, seed: int) -> bytes:
    body: dict[str, Any]
    if target.protocol == "openai":
        path = "/v1/completions"
        body = {
            "model": target.model, "prompt": prompt, "max_tokens": output_len, "temperature": 0,
            "seed": seed, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True},
        }
    else:
        path = "/generate"
        body = {
            "text": prompt, "stream": True,
            "sampling_params": {"temperature": 0, "max_new_tokens": output_len, "ignore_eos": True},
        }
    payload = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {target.host}:{target.port}\r\nContent-Type: application/json\r\n"
        f"Accept: text/event-stream\r\nContent-Length: {len(payload)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + payload


async def _one(target: Target, index: int, prompt: str, *, output_len: int, seed: int, timeout: float,
               idle: float) -> RequestResult:
    loop = asyncio.get_running_loop()
    start = time.perf_counter()
    deadline = loop.time() + timeout
    tokens = first_tokens = events = 0
    first = last = 0.0
    verify: int | None = None
    usage: int | None = None
    writer = None
    try:
        async with asyncio.timeout(min(idle, timeout)) as cm:
            reader, writer = await asyncio.open_connection(target.host, target.port)
            writer.write(_request_bytes(target, prompt, output_len, seed))
            head = await reader.readuntil(b"\r\n\r\n")
            status_line, *header_lines = head.decode("latin-1").split("\r\n")
            parts = status_line.split(" ", 2)
            status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
            headers = {}
            for h in header_lines:
                name, _, value = h.partition(":")
                headers[name.strip().lower()] = value.strip().lower()
            if status != 200:
                text = (await reader.read(_MAX_ERROR_BODY)).decode("utf-8", "replace").strip()
                raise _StreamError(f"HTTP {status}: {text[:300]}")
            body = _Body(chunked="chunked" in headers.get("transfer-encoding", ""))
            done = False
            while not done:
                data = await reader.read(_READ)
                now = time.perf_counter() - start
                cm.reschedule(min(deadline, loop.time() + idle))
                if not data:
                    break
                for payload in body.feed(data):
                    if payload == b"[DONE]":
                        done = True
                        break
                    events += 1
                    event = json.loads(payload)
                    if target.protocol == "openai":
                        if event.get("usage"):
                            usage = int(event["usage"].get("completion_tokens") or 0)
                        choices = event.get("choices") or ()
                        new = 1 if choices and choices[0].get("text") else 0
                        count = tokens + new
                    else:
                        meta = event.get("meta_info") or {}
                        count = int(meta.get("completion_tokens", tokens + 1))
                        if meta.get("spec_verify_ct") is not None:
                            verify = int(meta["spec_verify_ct"])
                    if count > tokens:
                        if tokens == 0:
                            first, first_tokens = now, count
                        last = now
                        tokens = count
            if not done:
                raise _StreamError(f"stream ended before [DONE] after {tokens} tokens")
    except TimeoutError:
        limit = "request timeout" if loop.time() >= deadline else f"no data for {idle:g} s (stalled)"
        return RequestResult(prompt=index, ok=False, error=f"{limit} after {tokens} tokens", tokens=tokens)
    except (OSError, EOFError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, _StreamError,
            ValueError) as exc:
        error = str(exc) if isinstance(exc, _StreamError) else f"{type(exc).__name__}: {exc}"
        return RequestResult(prompt=index, ok=False, error=error, tokens=tokens)
    finally:
        if writer is not None:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
    if usage is not None:
        tokens = usage
    itl = (last - first) / (tokens - first_tokens) if tokens > first_tokens else 0.0
    return RequestResult(prompt=index, ok=True, tokens=tokens, events=events, ttft=first,
                         latency=time.perf_counter() - start, itl=itl, spec_verify_ct=verify)


async def _level(target: Target, prompts: Sequence[str], order: Sequence[int], *, concurrency: int,
                 requests: int, output_len: int, seed: int, timeout: float, idle: float) -> LevelResult:
    results: list[RequestResult] = []
    queue = list(range(requests))
    queue.reverse()
    failed = False

    async def worker() -> None:
        nonlocal failed
        while queue and not failed:
            i = order[queue.pop() % len(order)]
            result = await _one(target, i, prompts[i], output_len=output_len, seed=seed, timeout=timeout,
                                idle=idle)
            results.append(result)
            failed = failed or not result.ok

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return LevelResult(concurrency=concurrency, requests=tuple(results), wall=time.perf_counter() - start)


def run_level(target: Target, prompts: Sequence[str], *, concurrency: int, requests: int, output_len: int,
              order: Sequence[int] | None = None, seed: int = 0, timeout: float = 600.0,
              idle: float | None = None) -> LevelResult:
    """Stream *requests* requests, *concurrency* at a time, over *prompts* in *order*.

    Stops sending new requests after the first failure (a dead server fails every later one). *timeout*
    bounds each request; *idle* (default: *timeout*) is the longest silence before it counts as stalled.
    """
    return asyncio.run(_level(
        target, prompts, order if order is not None else range(len(prompts)), concurrency=concurrency,
        requests=requests, output_len=output_len, seed=seed, timeout=timeout,
        idle=idle if idle is not None else timeout,
    ))


def get_json(host: str, port: int, path: str, *, timeout: float) -> tuple[int, Any]:
    """GET *path*; the status and the decoded JSON body (None when it is not JSON)."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", path, headers={"Accept": "application/json"})
        response = conn.getresponse()
        raw = response.read()
    finally:
        conn.close()
    try:
        return response.status, json.loads(raw) if raw else None
    except (json.JSONDecodeError, UnicodeDecodeError):
        return response.status, None
