"""A stand-in for an SGLang server: real HTTP on loopback, SGLang's wire format, fake tokens at a set rate.

It speaks the parts of SGLang's HTTP API that the perf suite uses, the way SGLang (0.5) does:

- ``/generate`` streams SSE events ``data: {"text": ..., "output_ids": [...], "meta_info": {...}}``, text
  and ids cumulative, ending ``data: [DONE]``. The first event carries exactly one token (prefill); then
  one event per decode step, 1 token, or with speculation one verify step of 1..k tokens. The
  speculative fields (``spec_verify_ct``, ``spec_accept_length``, ...) are on the final event only.
- ``/v1/completions`` (OpenAI): text deltas, ``stream_options.include_usage`` (a final usage event) and
  ``continuous_usage_stats`` (usage on every chunk); ``/v1/models``.
- ``/health`` and ``/health_generate``: the port is closed while the model "loads" (``--startup-delay``),
  then both answer 503 until SGLang's own warm-up is done (``--warmup``), then 200.
- ``/model_info`` and ``/server_info``; ``/get_model_info`` and ``/get_server_info`` log SGLang's
  deprecation warning (``--legacy-routes``: only the old names, or none). ``/server_info`` carries the
  server arguments (``speculative_algorithm``...) and ``internal_states[0]``, whose
  ``avg_spec_accept_length`` is SGLang's: lifetime, decode-only (the prefill token is not counted), updated
  every ``--log-interval`` verify steps, absent until then, and reset by ``/flush_cache``.
- ``/flush_cache`` (GET or POST, ``?timeout=`` to wait for running requests) answers 400 while requests run.
- A listen backlog of 2048, as uvicorn's (the standard library's 5 gave 1 s TTFT outliers at 16 streams).
- Cache flushes are logged ("cache flushed"), as SGLang's scheduler logs them.

Flags make it start slowly, crash, stall, send an error inside a 200 stream (``--error-after``) or end one
in an abort (``--abort-after``), be noisy, or leave a child process behind, so that the lab's handling of
each is tested for real::

    python -m compatlab.standin_server --port 30000 --tok-s 90
    python -m compatlab.standin_server --port 30001 --tok-s 96 --accept-length 1-4
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

__all__ = ["main"]

_WORDS = ("the", "model", "token", "fast", "kernel", "graph", "draft", "verify", "cache", "batch")
ERROR_MESSAGE = "CUDA error: out of memory (stand-in --error-after)"
ABORT_MESSAGE = "Request aborted by the scheduler (stand-in --abort-after)"
_DEPRECATED = ("Endpoint '{old}' is deprecated and will be removed in a future version. "
               "Please use '{new}' instead.")
_FLUSHED = ("Cache flushed.\nPlease check backend logs for more details. "
            "(When there are running or waiting requests, the operation will not be performed.)\n")


class _Accept:
    """Tokens per verify step: a mean (a fixed pattern with that mean) or a range LO-HI (uniform draws)."""

    def __init__(self, text: str) -> None:
        lo, sep, hi = text.partition("-")
        try:
            self.lo, self.hi = float(lo), float(hi if sep else lo)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number or a range like 1-4, got {text!r}") from None
        if not 1 <= self.lo <= self.hi or (sep and not (self.lo.is_integer() and self.hi.is_integer())):
            raise argparse.ArgumentTypeError(f"expected a mean >= 1 or a range of integers 1 <= LO <= HI, got "
                                             f"{text!r}")
        self.range = bool(sep)
        self.text = text

    @property
    def mean(self) -> float:
        return (self.lo + self.hi) / 2


class _Listener(ThreadingHTTPServer):
    request_queue_size = 2048  # uvicorn's backlog
    daemon_threads = True


class _State:
    """Counters shared by the handler threads."""

    def __init__(self, args: argparse.Namespace, rate: float) -> None:
        self.args = args
        self.rate = rate  # tokens per second per request after jitter; 0 means as fast as possible
        self.lock = threading.Lock()
        self.idle = threading.Condition(self.lock)
        self.requests = 0
        self.running = 0
        self.tokens = 0  # every output token, for last_gen_throughput
        self.decode_tokens = 0  # speculative counters since the start or the last flush
        self.verify = 0
        self.logged: float | None = None  # avg_spec_accept_length as last logged
        self.started = time.monotonic()
        self.ready_at = self.started + args.warmup
        self.rng = random.Random(args.seed)  # noqa: S311 - simulated noise, not a secret

    def next_request(self) -> int:
        with self.lock:
            self.requests += 1
            self.running += 1
            return self.requests

    def done(self) -> None:
        with self.lock:
            self.running -= 1
            self.idle.notify_all()

    def account(self, tokens: int, *, verify: bool) -> None:
        with self.lock:
            self.tokens += tokens
            if verify:
                self.decode_tokens += tokens
                self.verify += 1
                if self.verify % self.args.log_interval == 0:
                    self.logged = self.decode_tokens / self.verify

    def flush(self, timeout: float) -> bool:
        with self.lock:
            if not self.idle.wait_for(lambda: self.running == 0, timeout=timeout):
                return False
            self.decode_tokens = self.verify = 0
            self.logged = None
            return True

    def request_rate(self) -> float:
        if self.rate <= 0 or self.args.request_jitter <= 0:
            return self.rate
        with self.lock:
            factor = self.rng.uniform(1 - self.args.request_jitter, 1 + self.args.request_jitter)
        return self.rate * factor


def _log(message: str) -> None:
    print(f"stand-in[{os.getpid()}]: {message}", file=sys.stderr, flush=True)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "compatlab-standin/1"
    state: _State  # set on the subclass made in main()

    def log_message(self, format: str, *args: Any) -> None:  # the base class names it 'format'
        if self.state.args.verbose:
            _log(format % args)

    def _json(self, status: int, value: object) -> None:
        self._send(status, json.dumps(value).encode(), "application/json")

    def _send(self, status: int, body: bytes, kind: str = "text/plain; charset=utf-8") -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _read_json(self) -> dict[str, Any] | None:
        length = int(self.headers.get("Content-Length") or 0)
        try:
            data = json.loads(self.rfile.read(length) or b"{}")
        except json.JSONDecodeError as exc:
            self._json(400, {"error": {"message": f"invalid JSON: {exc}"}})
            return None
        if not isinstance(data, dict):
            self._json(400, {"error": {"message": "expected a JSON object"}})
            return None
        return data

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

    def _event(self, value: object) -> None:
        self._chunk(b"data: " + json.dumps(value).encode() + b"\n\n")

    def _route(self, path: str) -> str | None:
        """The route to serve, with SGLang's deprecation warning for the old names; None: no such route."""
        legacy = {"/get_model_info": "/model_info", "/get_server_info": "/server_info"}
        mode = self.state.args.legacy_routes
        if path in legacy:
            if mode == "none":
                return None
            if mode == "both":
                _log("WARNING " + _DEPRECATED.format(old=path, new=legacy[path]))
            return legacy[path]
        if path in legacy.values() and mode == "only":
            return None
        return path

    @property
    def _speculative(self) -> str | None:
        args = self.state.args
        if args.speculative_algorithm is not None:
            return None if args.speculative_algorithm == "none" else str(args.speculative_algorithm)
        return "EAGLE3" if args.accept_length else None

    def do_GET(self) -> None:
        args = self.state.args
        url = urllib.parse.urlsplit(self.path)
        route = self._route(url.path)
        if route in ("/health", "/health_generate"):
            self._send(200 if time.monotonic() >= self.state.ready_at else 503, b"")
        elif route == "/model_info":
            self._json(200, {"model_path": args.model, "served_model_name": args.served_model_name or args.model,
                             "tokenizer_path": args.model, "is_generation": True})
        elif route == "/server_info":
            self._server_info()
        elif route == "/v1/models":
            name = args.served_model_name or args.model
            self._json(200, {"object": "list", "data": [{
                "id": name, "object": "model", "created": int(time.time()), "owned_by": "sglang",
                "root": name, "max_model_len": 32768}]})
        elif route == "/flush_cache":
            self._flush(url.query)
        else:
            self._json(404, {"detail": "Not Found"})

    def _server_info(self) -> None:
        args = self.state.args
        with self.state.lock:
            tokens, logged = self.state.tokens, self.state.logged
            elapsed = time.monotonic() - self.state.started
        state: dict[str, Any] = {"last_gen_throughput": tokens / elapsed if elapsed > 0 else 0.0}
        if self._speculative and logged is not None:
            state["avg_spec_accept_length"] = logged
        self._json(200, {
            "model_path": args.model, "served_model_name": args.served_model_name or args.model,
            "tp_size": 1, "speculative_algorithm": self._speculative,
            "speculative_num_draft_tokens": int(args.accept_length.hi) if args.accept_length else None,
            "internal_states": [state], "version": "standin",
        })

    def _flush(self, query: str) -> None:
        try:
            timeout = float(urllib.parse.parse_qs(query).get("timeout", ["0"])[0])
        except ValueError:
            self._json(400, {"detail": "timeout: expected a number"})
            return
        if self.state.flush(timeout):
            _log("cache flushed")
            self._send(200, _FLUSHED.encode())
        else:
            with self.state.lock:
                running = self.state.running
            self._send(400, (f"Cache not flushed because there are pending requests. #queue-req: 0, "
                             f"#running-req: {running}\n").encode())

    def do_POST(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        if url.path == "/flush_cache":
            self._flush(url.query)
            return
        if url.path not in ("/generate", "/v1/completions"):
            self._json(404, {"detail": "Not Found"})
            return
        body = self._read_json()
        if body is None:
            return
        openai = url.path == "/v1/completions"
        if openai:
            prompt = body.get("prompt", "")
            max_tokens = body.get("max_tokens", 16)
        else:
            prompt = body.get("text", "")
            max_tokens = (body.get("sampling_params") or {}).get("max_new_tokens", 16)
        if not isinstance(prompt, str) or not isinstance(max_tokens, int) or max_tokens < 1:
            self._json(400, {"error": {"message": "expected a string prompt and a positive token count"}})
            return
        options = body.get("stream_options") or {}
        number = self.state.next_request()
        try:
            self._generate(number, prompt, max_tokens, openai=openai, stream=bool(body.get("stream")),
                           usage=bool(options.get("include_usage")),
                           continuous=bool(options.get("continuous_usage_stats")))
        finally:
            self.state.done()

    def _steps(self, number: int, max_tokens: int) -> list[int]:
        """Tokens per event: 1 from prefill, then one decode or verify step each."""
        accept = self.state.args.accept_length
        steps = [1]
        left = max_tokens - 1
        rng = random.Random(f"{self.state.args.seed}-{number}")  # noqa: S311 - simulated, not a secret
        credit = 0.0
        while left > 0:
            if accept is None:
                step = 1
            elif accept.range:
                step = rng.randint(int(accept.lo), int(accept.hi))
            else:
                credit += accept.mean
                step = max(1, int(credit))
                credit -= step
            step = min(step, left)
            steps.append(step)
            left -= step
        return steps

    def _generate(self, number: int, prompt: str, max_tokens: int, *, openai: bool, stream: bool,
                  usage: bool, continuous: bool) -> None:
        args = self.state.args
        crash = args.crash_after is not None and number > args.crash_after
        stall = args.stall_after is not None and number > args.stall_after
        error = args.error_after is not None and number > args.error_after
        abort = args.abort_after is not None and number > args.abort_after
        rate = self.state.request_rate()
        accept = args.accept_length
        step_time = (accept.mean if accept else 1.0) / rate if rate > 0 else 0.0
        prompt_tokens = max(1, len(prompt.split()))
        rid = f"standin-{os.getpid()}-{number}"
        if stream:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
        time.sleep(args.ttft_ms / 1000)
        start = time.monotonic()
        pieces: list[str] = []
        ids: list[int] = []
        verify = 0
        steps = self._steps(number, max_tokens)
        for k, step in enumerate(steps):
            if k and step_time > 0:
                delay = start + k * step_time - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
            for i in range(len(pieces), len(pieces) + step):
                ids.append((i + prompt_tokens) % len(_WORDS))
                pieces.append(" " + _WORDS[ids[-1]])
            verify += 1 if k and accept else 0
            self.state.account(step, verify=bool(k and accept))
            done = len(pieces)
            halfway = done * 2 >= max_tokens
            if stream and (error and halfway):
                _log(f"error in request {number} as told (--error-after {args.error_after})")
                self._error_event(openai)
                break
            finished = done >= max_tokens or (abort and halfway)
            if stream:
                finish: dict[str, Any] | None = None
                if abort and halfway:
                    _log(f"aborting request {number} as told (--abort-after {args.abort_after})")
                    finish = {"type": "abort", "message": args.fault_message or ABORT_MESSAGE}
                elif finished:
                    finish = {"type": "length", "length": done}
                if openai:
                    event: dict[str, Any] = {
                        "id": rid, "object": "text_completion", "created": int(time.time()), "model": args.model,
                        "choices": [{"index": 0, "text": "".join(pieces[-step:]), "logprobs": None,
                                     "finish_reason": finish["type"] if finish else None}],
                    }
                    if continuous:
                        event["usage"] = self._usage(prompt_tokens, done)
                else:
                    event = {"text": "".join(pieces), "output_ids": list(ids),
                             "meta_info": self._meta(rid, prompt_tokens, done, verify, finish)}
                self._event(event)
            if crash and halfway:
                _log(f"crashing in request {number} as told (--crash-after {args.crash_after})")
                os._exit(3)
            if stall and halfway:
                _log(f"stalling in request {number} as told (--stall-after {args.stall_after})")
                time.sleep(3600)
            if finished:
                break
        done = len(pieces)
        if not stream:
            if openai:
                self._json(200, {"id": rid, "object": "text_completion", "model": args.model,
                                 "choices": [{"index": 0, "text": "".join(pieces), "finish_reason": "length"}],
                                 "usage": self._usage(prompt_tokens, done)})
            else:
                finish = {"type": "length", "length": done}
                self._json(200, {"text": "".join(pieces), "output_ids": ids,
                                 "meta_info": self._meta(rid, prompt_tokens, done, verify, finish)})
            return
        if openai and usage and not error:
            self._event({"id": rid, "object": "text_completion", "created": int(time.time()), "model": args.model,
                         "choices": [], "usage": self._usage(prompt_tokens, done)})
        self._chunk(b"data: [DONE]\n\n")
        self._chunk(b"")

    def _error_event(self, openai: bool) -> None:
        message = self.state.args.fault_message or ERROR_MESSAGE
        if openai:
            self._event({"error": {"object": "error", "message": message, "type": "InternalServerError",
                                   "param": None, "code": 500}})
        else:
            self._event({"error": {"message": message, "type": "invalid_request_error", "code": 400,
                                   "retryable": False}})

    def _meta(self, rid: str, prompt_tokens: int, done: int, verify: int,
              finish: dict[str, Any] | None) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "id": rid, "finish_reason": finish, "prompt_tokens": prompt_tokens, "completion_tokens": done,
            "cached_tokens": 0,
        }
        accept = self.state.args.accept_length
        if finish is not None and accept and verify:  # SGLang: the final event only
            meta["spec_verify_ct"] = verify
            meta["spec_accept_length"] = done / verify
            proposed = verify * (int(accept.hi) - 1)
            meta["spec_num_proposed_drafts"] = proposed
            meta["spec_num_correct_drafts"] = done - 1 - verify
            meta["spec_accept_rate"] = (done - 1 - verify) / proposed if proposed else 0.0
        if finish is not None:
            meta["e2e_latency"] = 0.0
        return meta

    @staticmethod
    def _usage(prompt_tokens: int, done: int) -> dict[str, int]:
        return {"prompt_tokens": prompt_tokens, "completion_tokens": done, "total_tokens": prompt_tokens + done}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m compatlab.standin_server", description=__doc__.split("\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--model", default="standin/model", help="reported by /model_info")
    p.add_argument("--served-model-name", default=None, help="the name of /v1/models (default: --model)")
    p.add_argument("--tok-s", type=float, default=90.0, help="tokens per second per request; 0: no limit")
    p.add_argument("--accept-length", type=_Accept, default=None,
                   help="act as an EAGLE-3 server: tokens per verify step, a mean (3.1) or a range (1-4)")
    p.add_argument("--speculative-algorithm", default=None,
                   help="what /server_info reports (default: EAGLE3 with --accept-length, else none)")
    p.add_argument("--log-interval", type=int, default=40,
                   help="verify steps between updates of avg_spec_accept_length (SGLang: 40 decode batches)")
    p.add_argument("--ttft-ms", type=float, default=2.0, help="time to the first token (prefill)")
    p.add_argument("--startup-delay", type=float, default=0.0, help="seconds before the port opens")
    p.add_argument("--warmup", type=float, default=0.0,
                   help="seconds after the port opens during which /health answers 503 (SGLang's warm-up)")
    p.add_argument("--legacy-routes", choices=("both", "only", "none"), default="both",
                   help="serve /get_model_info and /get_server_info too, instead, or not at all")
    p.add_argument("--crash-after", type=int, default=None, help="exit mid-stream in request N+1")
    p.add_argument("--stall-after", type=int, default=None, help="stop sending mid-stream in request N+1")
    p.add_argument("--error-after", type=int, default=None,
                   help="from request N+1 on, send an error event mid-stream (in the 200), then [DONE]")
    p.add_argument("--abort-after", type=int, default=None,
                   help="from request N+1 on, end mid-stream with finish_reason abort, then [DONE]")
    p.add_argument("--fault-message", default=None, help="the message of the error or abort")
    p.add_argument("--jitter", type=float, default=0.0,
                   help="relative noise in this process's rate, drawn once at start (e.g. 0.3 = +-30%%)")
    p.add_argument("--request-jitter", type=float, default=0.0, help="relative noise per request")
    p.add_argument("--seed", type=int, default=None, help="seed for the noise")
    p.add_argument("--seed-file", type=Path, default=None,
                   help="read the seed from this file and store seed+1, so that each start draws anew")
    p.add_argument("--spawn-child", action="store_true",
                   help="start a child that ignores SIGTERM, as engines' worker processes may")
    p.add_argument("--ignore-sigterm", action="store_true", help="ignore SIGTERM (needs SIGKILL)")
    p.add_argument("--port-holder", type=float, default=None, metavar="SECONDS",
                   help="leave a process in its own session holding the listening socket for SECONDS "
                        "(as a detached worker may), so that the port stays in use after the group is gone")
    p.add_argument("--verbose", action="store_true", help="log every HTTP request")
    return p


def _seed(args: argparse.Namespace) -> int | None:
    if args.seed_file is None:
        return args.seed  # type: ignore[no-any-return]
    try:
        seed = int(args.seed_file.read_text().strip() or 0)
    except FileNotFoundError:
        seed = args.seed or 0
    args.seed_file.write_text(f"{seed + 1}\n")
    return seed


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    args.seed = _seed(args)
    rate = args.tok_s
    if args.jitter > 0 and rate > 0:
        noise = random.Random(args.seed)  # noqa: S311 - simulated noise, not a secret
        rate *= noise.uniform(1 - args.jitter, 1 + args.jitter)
    accept = args.accept_length.text if args.accept_length else None
    _log(f"starting: model={args.model} rate={rate:.1f} tok/s accept-length={accept}")
    if args.spawn_child:
        code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
        child = subprocess.Popen([sys.executable, "-c", code])
        child.returncode = 0  # never waited for: the process group's killer takes it
        _log(f"child pid {child.pid}")
    if args.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        def _term(signum: int, frame: object) -> None:
            _log("SIGTERM received, shutting down")
            raise SystemExit(0)

        signal.signal(signal.SIGTERM, _term)
    if args.startup_delay > 0:
        _log(f"loading for {args.startup_delay:g} s")
        time.sleep(args.startup_delay)
    state = _State(args, rate)
    handler = type("Handler", (_Handler,), {"state": state})
    server = _Listener((args.host, args.port), handler)
    _log(f"listening on http://{args.host}:{server.server_address[1]}")
    if args.port_holder is not None:
        code = f"import time; time.sleep({args.port_holder!r})"
        holder = subprocess.Popen([sys.executable, "-c", code], pass_fds=(server.fileno(),),
                                  start_new_session=True)
        holder.returncode = 0  # never waited for: it ends on its own
        _log(f"port holder pid {holder.pid}")
    if args.warmup > 0:
        state.ready_at = time.monotonic() + args.warmup
        _log(f"warming up for {args.warmup:g} s (/health answers 503)")
    try:
        server.serve_forever(poll_interval=0.05)
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
