"""A streaming load client for SGLang-style servers, on asyncio streams (stdlib only).

Two protocols: SGLang's native ``/generate`` (SSE events whose ``meta_info.completion_tokens`` counts the
tokens so far; with speculative decoding the final event's ``meta_info.spec_verify_ct`` counts the verify
steps) and the OpenAI-style ``/v1/completions`` (token counts from ``usage``, per chunk where the server
honours ``stream_options.continuous_usage_stats``, else from the final usage event). A level runs
*requests* requests with *concurrency* in flight.

The figures are SGLang's benchmark's (``sglang.benchmark.serving``), computed the same way: output tokens
per second over the level's wall time; TTFT, the time to the first chunk with a token; ITL pooled over
tokens, where each chunk after the first contributes its gap divided by the tokens it added, once per
token (chunks without a per-chunk token count contribute one gap each, as SGLang's benchmark does for
OpenAI streams); TPOT per request, ``(latency - ttft) / (tokens - 1)``, with latency taken at the last
chunk (``[DONE]``). Means, medians and 99th percentiles are numpy's (linear interpolation).

A stream that carries an error (SGLang answers 200 and sends ``data: {"error": {...}}`` then
``data: [DONE]``; the OpenAI routes send ``{"object": "error", ...}``) or ends in an abort
(``meta_info.finish_reason.type == "abort"``, ``choices[0].finish_reason == "abort"``) is a failed
request, never a short success; so is a stream whose token counts are missing.

What the server sends is believed only within bounds (``compatlab.net``): a request has one deadline
(*timeout*, connection to ``[DONE]``) and a longest silence (*idle*); a stream line is at most
``net.LINE_LIMIT``; every event is JSON of the shape read here (``GENERATE_EVENT``, ``OPENAI_EVENT``); and
the output tokens the server reports are those asked (``max_new_tokens``/``max_tokens`` with ``ignore_eos``).
A request that breaks one of these is failed with ``untrusted`` set: the server's answers cannot be
believed, an error of the server, never a verdict on the stack (a count of 50x or 0x ``output-len`` would
otherwise be a tok/s figure, or a stack's "fail").

The client reads in blocks and parses chunked encoding and SSE lines itself, so that under load it handles
many events per wake-up; ``benchmarks/bench_perf_client.py`` shows it is not the bottleneck.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import math
import statistics
import time
from collections.abc import Sequence
from typing import Any

from compatlab import net
from compatlab.config.perf import Protocol

__all__ = ["GENERATE_EVENT", "OPENAI_EVENT", "LevelResult", "RequestResult", "Target", "percentile", "run_level"]

_READ = 1 << 16
_MAX_ERROR_BODY = 2000
_MAX_CHUNK_LINE = 1024  # a chunk-size line: hex digits and perhaps extensions
_HEAD_LIMIT = 64 << 10  # the status line and headers (asyncio's default limit of a stream reader)

# What is read of each event (other keys are not looked at); an error event is read before its shape.
_FINISH = net.Obj(optional={"type": (str, type(None)), "message": (str, type(None))})
GENERATE_EVENT = net.Obj(
    required={
        "meta_info": net.Obj(
            required={"completion_tokens": int},
            optional={"finish_reason": (_FINISH, str, type(None)), "spec_verify_ct": (int, type(None))},
        )
    }
)
OPENAI_EVENT = net.Obj(
    optional={
        "choices": (
            net.ListOf(net.Obj(optional={"text": (str, type(None)), "finish_reason": (str, type(None))})),
            type(None),
        ),
        "usage": (net.Obj(optional={"completion_tokens": (int, type(None))}), type(None)),
    }
)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Target:
    """Where and how to talk to a server."""

    host: str = "127.0.0.1"
    port: int
    protocol: Protocol = "generate"
    model: str = "default"  # the OpenAI protocol's "model" field


def percentile(data: Sequence[float], q: float) -> float:
    """numpy's default percentile (linear interpolation between the closest ranks); 0.0 for no data."""
    s = sorted(data)
    if not s:
        return 0.0
    pos = (len(s) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class RequestResult:
    """One streamed request; times in seconds from sending it."""

    prompt: int
    ok: bool
    error: str = ""
    tokens: int = 0  # output tokens as the server counts them
    events: int = 0  # SSE data events, [DONE] aside
    first_tokens: int = 0  # tokens the first chunk carried (SGLang: exactly one, from prefill)
    ttft: float = 0.0
    latency: float = 0.0  # to the last chunk, [DONE], as SGLang's benchmark measures it
    itl: tuple[float, ...] = ()  # one entry per token after the first chunk (see the module docstring)
    spec_verify_ct: int | None = None
    finish_reason: str | None = None
    # The failure is the server's answers not to be believed (the wrong shape or size, a token count other
    # than asked): the server's error, whatever a failed request means to the stage.
    untrusted: bool = False

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first: SGLang's TPOT."""
        return (self.latency - self.ttft) / (self.tokens - 1) if self.ok and self.tokens > 1 else None


STATS = ("mean", "median", "p99")


def _summary(name: str, data: Sequence[float]) -> dict[str, float | None]:
    """``mean_{name}_ms``, ``median_{name}_ms``, ``p99_{name}_ms`` as SGLang's benchmark names them."""
    if not data:
        return dict.fromkeys((f"{stat}_{name}_ms" for stat in STATS), None)
    return {
        f"mean_{name}_ms": statistics.fmean(data) * 1000,
        f"median_{name}_ms": statistics.median(data) * 1000,
        f"p99_{name}_ms": percentile(data, 99) * 1000,
    }


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
    def ttfts(self) -> list[float]:
        return [r.ttft for r in self.requests if r.ok]

    @property
    def itls(self) -> list[float]:
        """Inter-token latencies pooled over every token of every successful request."""
        return [gap for r in self.requests if r.ok for gap in r.itl]

    @property
    def tpots(self) -> list[float]:
        return [t for r in self.requests if (t := r.tpot) is not None]

    def latency_stats(self) -> dict[str, float | None]:
        """TTFT, ITL and TPOT: mean, median and p99 in milliseconds, named as SGLang's benchmark does."""
        return {**_summary("ttft", self.ttfts), **_summary("itl", self.itls), **_summary("tpot", self.tpots)}

    @property
    def accept_length(self) -> float | None:
        """Sum of completion tokens over sum of verify steps, where the server reports them."""
        spec = [r for r in self.requests if r.ok and r.spec_verify_ct]
        verify = sum(r.spec_verify_ct or 0 for r in spec)
        return sum(r.tokens for r in spec) / verify if verify else None


class _StreamError(Exception):
    def __init__(self, message: str, *, untrusted: bool = False) -> None:
        super().__init__(message)
        self.untrusted = untrusted


class _Body:
    """Incremental decoder: HTTP chunked transfer encoding (or a plain body) into SSE ``data:`` payloads.

    Lines are cut by ``net.Lines`` (none over ``net.LINE_LIMIT``), a chunk-size line is at most
    ``_MAX_CHUNK_LINE`` bytes: a server that never ends a line is refused, not buffered.
    """

    def __init__(self, chunked: bool, url: str) -> None:
        self.chunked = chunked
        self.raw = bytearray()
        self.left = 0  # data bytes left in the current chunk
        self.crlf = 0  # bytes of the CRLF after a chunk still to skip
        self.eof = False  # the last (zero) chunk arrived
        self.lines = net.Lines(url)

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
                    if len(raw) > _MAX_CHUNK_LINE:
                        raise _StreamError(f"bad chunk size {bytes(raw[:40])!r}… (no line end in {len(raw)} bytes)")
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
        return [line[5:].strip() for line in self.lines.feed(data) if line.startswith(b"data:")]


def _path(target: Target) -> str:
    return "/v1/completions" if target.protocol == "openai" else "/generate"


def _request_bytes(target: Target, prompt: str, output_len: int, seed: int) -> bytes:
    body: dict[str, Any]
    path = _path(target)
    if target.protocol == "openai":
        body = {
            "model": target.model,
            "prompt": prompt,
            "max_tokens": output_len,
            "temperature": 0,
            "seed": seed,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        }
    else:
        body = {
            "text": prompt,
            "stream": True,
            "sampling_params": {"temperature": 0, "max_new_tokens": output_len, "ignore_eos": True},
        }
    payload = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {target.host}:{target.port}\r\nContent-Type: application/json\r\n"
        f"Accept: text/event-stream\r\nContent-Length: {len(payload)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + payload


def _message(error: object) -> str:
    """The human part of an SGLang or OpenAI error object."""
    if isinstance(error, dict):
        text = error.get("message")
        return str(text) if text else json.dumps(error)[:300]
    return str(error)[:300]


class _Progress:
    """One stream's events turned into SGLang's benchmark's figures; ``failure`` once it went wrong."""

    def __init__(self, protocol: Protocol, asked: int, url: str) -> None:
        self.protocol = protocol
        self.url = url  # named in a failure that is the server's answers not to be believed
        self.asked = asked  # output tokens asked for (with ignore_eos): what the server must report
        self.tokens = 0
        self.chunks = 0  # chunks that carried tokens
        self.events = 0
        self.first_tokens = 0
        self.ttft = 0.0
        self.last = 0.0  # arrival of the latest chunk that carried tokens
        self.end = 0.0  # arrival of the latest event, [DONE] included
        self.itl: list[float] = []
        self.verify: int | None = None
        self.usage: int | None = None
        self.finish: str | None = None
        self.failure: str | None = None
        self.untrusted = False  # the failure is the server's answers not to be believed

    def _unbelievable(self, message: str) -> None:
        self.failure, self.untrusted = f"{self.url}: {message}", True

    def miscounted(self, count: int) -> str:
        field = "max_tokens" if self.protocol == "openai" else "max_new_tokens"
        return (
            f"{self.url}: the server reported {count} output tokens for a request of {self.asked} ({field} "
            "with ignore_eos): its token counts cannot be believed"
        )

    def _advance(self, count: int, now: float) -> None:
        """A chunk that brings the count to *count*: its gap is split over the tokens it added."""
        new = count - self.tokens
        if new <= 0:
            return  # no new token: SGLang's benchmark skips the chunk, its time included
        if self.chunks == 0:
            self.ttft, self.first_tokens = now, count
        else:
            self.itl.extend([(now - self.last) / new] * new)
        self.chunks += 1
        self.last, self.tokens = now, count

    def _where(self) -> str:
        return f"after {self.tokens} tokens"

    def event(self, event: Any, now: float) -> None:
        self.events += 1
        if not isinstance(event, dict):
            self._unbelievable(f"unexpected event {json.dumps(event)[:100]} {self._where()}")
        elif "error" in event or event.get("object") == "error":
            error = event.get("error", event)
            self.failure = f"the server sent an error in the stream {self._where()}: {_message(error)}"
        elif problem := net.check_shape(event, OPENAI_EVENT if self.protocol == "openai" else GENERATE_EVENT):
            self._unbelievable(f"an event of the wrong shape {self._where()}: {problem}")
        elif self.protocol == "openai":
            self._openai(event, now)
        else:
            self._generate(event, now)

    def _generate(self, event: dict[str, Any], now: float) -> None:
        meta = event["meta_info"]
        finish = meta.get("finish_reason")
        if isinstance(finish, dict):
            self.finish = str(finish.get("type"))
            if self.finish == "abort":
                self.failure = (
                    f"the server aborted the request {self._where()}: {finish.get('message') or 'no message'}"
                )
                return
        if meta.get("spec_verify_ct") is not None:
            self.verify = int(meta["spec_verify_ct"])
        self._advance(int(meta["completion_tokens"]), now)

    def _openai(self, event: dict[str, Any], now: float) -> None:
        usage = event.get("usage")
        count = usage.get("completion_tokens") if isinstance(usage, dict) else None
        if isinstance(count, int):
            self.usage = count
        choices = event.get("choices") or ()
        if not choices:
            return  # the final usage event
        choice = choices[0]
        finish = choice.get("finish_reason")
        if finish:
            self.finish = str(finish)
            if finish == "abort":
                self.failure = f"the server aborted the request {self._where()} (finish_reason abort)"
                return
        if not choice.get("text"):
            return
        if isinstance(count, int):
            self._advance(count, now)  # continuous usage: the chunk's own token count
        else:
            # No per-chunk count: one gap per chunk, as SGLang's benchmark does for OpenAI streams.
            if self.chunks == 0:
                self.ttft, self.first_tokens = now, 1
            else:
                self.itl.append(now - self.last)
            self.chunks += 1
            self.tokens += 1
            self.last = now

    def result(self, index: int) -> RequestResult:
        tokens = self.tokens
        if self.protocol == "openai":
            if self.usage is None:
                return RequestResult(
                    prompt=index,
                    ok=False,
                    tokens=tokens,
                    error=(
                        f"the stream carried no usage {self._where()}; the server ignores "
                        "stream_options.include_usage, so its output tokens are unknown"
                    ),
                )
            tokens = self.usage
        if tokens != self.asked:
            return RequestResult(prompt=index, ok=False, tokens=tokens, error=self.miscounted(tokens), untrusted=True)
        return RequestResult(
            prompt=index,
            ok=True,
            tokens=tokens,
            events=self.events,
            first_tokens=self.first_tokens,
            ttft=self.ttft,
            latency=self.end,
            itl=tuple(self.itl),
            spec_verify_ct=self.verify,
            finish_reason=self.finish,
        )


async def _one(
    target: Target, index: int, prompt: str, *, output_len: int, seed: int, timeout: float, idle: float
) -> RequestResult:
    loop = asyncio.get_running_loop()
    start = time.perf_counter()
    deadline = net.Deadline(timeout)  # the whole request; asyncio's timeout is moved to it, or to idle
    url = f"http://{target.host}:{target.port}{_path(target)}"
    progress = _Progress(target.protocol, output_len, url)
    writer = None
    try:
        async with asyncio.timeout(min(idle, timeout)) as cm:
            reader, writer = await asyncio.open_connection(target.host, target.port, limit=_HEAD_LIMIT)
            writer.write(_request_bytes(target, prompt, output_len, seed))
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.LimitOverrunError:
                raise _StreamError(
                    f"{url}: the answer's head is longer than the {net.size(_HEAD_LIMIT)} this lab reads",
                    untrusted=True,
                ) from None
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
            body = _Body("chunked" in headers.get("transfer-encoding", ""), url)
            done = False
            while not done and progress.failure is None:
                data = await reader.read(_READ)
                now = time.perf_counter() - start
                cm.reschedule(loop.time() + min(max(0.0, deadline.left()), idle))
                if not data:
                    break
                for payload in body.feed(data):
                    progress.end = now
                    if payload == b"[DONE]":
                        done = True
                        break
                    progress.event(json.loads(payload), now)
                    if progress.failure is not None:
                        break
            if progress.failure is not None:
                raise _StreamError(progress.failure, untrusted=progress.untrusted)
            if not done:
                raise _StreamError(f"stream ended before [DONE] after {progress.tokens} tokens")
    except TimeoutError:
        limit = "request timeout" if deadline.passed else f"no data for {idle:g} s (stalled)"
        return RequestResult(
            prompt=index, ok=False, error=f"{limit} after {progress.tokens} tokens", tokens=progress.tokens
        )
    except net.TooLarge as exc:
        return RequestResult(prompt=index, ok=False, error=str(exc), tokens=progress.tokens, untrusted=True)
    except _StreamError as exc:
        return RequestResult(prompt=index, ok=False, error=str(exc), tokens=progress.tokens, untrusted=exc.untrusted)
    except (OSError, EOFError, asyncio.IncompleteReadError, ValueError) as exc:
        error = f"{type(exc).__name__}: {exc}"
        return RequestResult(prompt=index, ok=False, error=error, tokens=progress.tokens)
    finally:
        if writer is not None:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
    return progress.result(index)


async def _level(
    target: Target,
    prompts: Sequence[str],
    order: Sequence[int],
    *,
    concurrency: int,
    requests: int,
    output_len: int,
    seed: int,
    timeout: float,
    idle: float,
) -> LevelResult:
    results: list[RequestResult] = []
    queue = list(range(requests))
    queue.reverse()
    failed = False

    async def worker() -> None:
        nonlocal failed
        while queue and not failed:
            i = order[queue.pop() % len(order)]
            result = await _one(target, i, prompts[i], output_len=output_len, seed=seed, timeout=timeout, idle=idle)
            results.append(result)
            failed = failed or not result.ok

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return LevelResult(concurrency=concurrency, requests=tuple(results), wall=time.perf_counter() - start)


def run_level(
    target: Target,
    prompts: Sequence[str],
    *,
    concurrency: int,
    requests: int,
    output_len: int,
    order: Sequence[int] | None = None,
    seed: int = 0,
    timeout: float = 600.0,
    idle: float | None = None,
) -> LevelResult:
    """Stream *requests* requests, *concurrency* at a time, over *prompts* in *order*.

    Stops sending new requests after the first failure (a dead server fails every later one). *timeout*
    bounds each request; *idle* (default: *timeout*) is the longest silence before it counts as stalled.
    """
    return asyncio.run(
        _level(
            target,
            prompts,
            order if order is not None else range(len(prompts)),
            concurrency=concurrency,
            requests=requests,
            output_len=output_len,
            seed=seed,
            timeout=timeout,
            idle=idle if idle is not None else timeout,
        )
    )
