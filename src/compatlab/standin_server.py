"""A stand-in for an SGLang server: real HTTP on loopback, fake tokens at a configured rate.

It speaks the parts of SGLang's HTTP API that the perf suite uses: ``/generate`` (SSE, ``data: {...}``
events with cumulative ``text`` and ``meta_info``, ending ``data: [DONE]``), OpenAI-style
``/v1/completions`` streaming, ``/health``, ``/health_generate``, ``/get_model_info`` and
``/get_server_info`` (``/model_info`` and ``/server_info`` too). Flags make it start slowly, crash,
stall, be noisy, or leave a child process behind, so the lab's failure handling is tested for real::

    python -m compatlab.standin_server --port 30000 --tok-s 90
    python -m compatlab.standin_server --port 30001 --tok-s 96 --accept-length 3.1
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
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

__all__ = ["main"]

_WORDS = ("the", "model", "token", "fast", "kernel", "graph", "draft", "verify", "cache", "batch")


class _State:
    """Counters shared by the handler threads."""

    def __init__(self, args: argparse.Namespace, rate: float) -> None:
        self.args = args
        self.rate = rate  # tokens per second per request after jitter; 0 means as fast as possible
        self.lock = threading.Lock()
        self.requests = 0
        self.tokens = 0
        self.verify = 0
        self.started = time.monotonic()
        self.rng = random.Random(args.seed)  # noqa: S311 - simulated noise, not a secret

    def next_request(self) -> int:
        with self.lock:
            self.requests += 1
            return self.requests

    def account(self, tokens: int, verify: int) -> None:
        with self.lock:
            self.tokens += tokens
            self.verify += verify

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

    # -- plumbing -------------------------------------------------------------------------------

    def _json(self, status: int, value: object) -> None:
        body = json.dumps(value).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _read_json(self) -> dict[str, Any] | None:
        length = int(self.headers.get("Content-Length") or 0)
        try:
            data = json.loads(self.rfile.read(length) or b"{}")
        except json.JSONDecodeError as exc:
            self._json(400, {"error": f"invalid JSON: {exc}"})
            return None
        if not isinstance(data, dict):
            self._json(400, {"error": "expected a JSON object"})
            return None
        return data

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

    # -- endpoints ------------------------------------------------------------------------------

    def do_GET(self) -> None:
        args = self.state.args
        if self.path in ("/health", "/health_generate"):
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif self.path in ("/get_model_info", "/model_info"):
            self._json(200, {"model_path": args.model, "tokenizer_path": args.model, "is_generation": True})
        elif self.path in ("/get_server_info", "/server_info"):
            with self.state.lock:
                tokens, verify = self.state.tokens, self.state.verify
                elapsed = time.monotonic() - self.state.started
            accept = (tokens / verify) if (args.accept_length and verify) else None
            self._json(200, {
                "version": "standin",
                "model_path": args.model,
                "speculative_algorithm": "EAGLE3" if args.accept_length else None,
                "internal_states": [{
                    "avg_spec_accept_length": accept,
                    "last_gen_throughput": tokens / elapsed if elapsed > 0 else 0.0,
                }],
            })
        else:
            self._json(404, {"error": f"no route {self.path}"})

    def do_POST(self) -> None:
        if self.path not in ("/generate", "/v1/completions"):
            self._json(404, {"error": f"no route {self.path}"})
            return
        body = self._read_json()
        if body is None:
            return
        openai = self.path == "/v1/completions"
        if openai:
            prompt = body.get("prompt", "")
            max_tokens = body.get("max_tokens", 16)
        else:
            prompt = body.get("text", "")
            max_tokens = (body.get("sampling_params") or {}).get("max_new_tokens", 16)
        if not isinstance(prompt, str) or not isinstance(max_tokens, int) or max_tokens < 1:
            self._json(400, {"error": "expected a string prompt and a positive token count"})
            return
        number = self.state.next_request()
        self._generate(number, prompt, max_tokens, openai=openai, stream=bool(body.get("stream")),
                       usage=bool((body.get("stream_options") or {}).get("include_usage")))

    def _generate(self, number: int, prompt: str, max_tokens: int, *, openai: bool, stream: bool,
                  usage: bool) -> None:
        args = self.state.args
        crash = args.crash_after is not None and number > args.crash_after
        stall = args.stall_after is not None and number > args.stall_after
        rate = self.state.request_rate()
        accept = args.accept_length or 1.0
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
        done = verify = 0
        credit = 0.0
        while done < max_tokens:
            # One event per verify step: EAGLE emits about accept-length tokens at a time.
            credit += accept
            step = max(1, min(max_tokens - done, int(credit)))
            credit -= step
            verify += 1
            for i in range(done, done + step):
                pieces.append(" " + _WORDS[(i + prompt_tokens) % len(_WORDS)])
            done += step
            if rate > 0:
                delay = start + done / rate - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
            if stream:
                meta = self._meta(rid, prompt_tokens, done, verify, finished=done >= max_tokens)
                if openai:
                    event: dict[str, Any] = {
                        "id": rid, "object": "text_completion", "model": args.model,
                        "choices": [{"index": 0, "text": "".join(pieces[-step:]), "logprobs": None,
                                     "finish_reason": "length" if done >= max_tokens else None}],
                    }
                else:
                    event = {"text": "".join(pieces), "meta_info": meta, "index": 0}
                self._chunk(b"data: " + json.dumps(event).encode() + b"\n\n")
            if crash and done * 2 >= max_tokens:
                _log(f"crashing in request {number} as told (--crash-after {args.crash_after})")
                os._exit(3)
            if stall and done * 2 >= max_tokens:
                _log(f"stalling in request {number} as told (--stall-after {args.stall_after})")
                time.sleep(3600)
        self.state.account(done, verify)
        meta = self._meta(rid, prompt_tokens, done, verify, finished=True)
        if not stream:
            if openai:
                self._json(200, {"id": rid, "object": "text_completion", "model": args.model,
                                 "choices": [{"index": 0, "text": "".join(pieces),
                                              "finish_reason": "length"}],
                                 "usage": self._usage(prompt_tokens, done)})
            else:
                self._json(200, {"text": "".join(pieces), "meta_info": meta})
            return
        if openai and usage:
            final = {"id": rid, "object": "text_completion", "model": args.model, "choices": [],
                     "usage": self._usage(prompt_tokens, done)}
            self._chunk(b"data: " + json.dumps(final).encode() + b"\n\n")
        self._chunk(b"data: [DONE]\n\n")
        self._chunk(b"")

    def _meta(self, rid: str, prompt_tokens: int, done: int, verify: int, *,
              finished: bool) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "id": rid,
            "finish_reason": {"type": "length", "length": done} if finished else None,
            "prompt_tokens": prompt_tokens,
            "completion_tokens": done,
            "cached_tokens": 0,
        }
        if self.state.args.accept_length:
            meta["spec_verify_ct"] = verify
        return meta

    @staticmethod
    def _usage(prompt_tokens: int, done: int) -> dict[str, int]:
        return {"prompt_tokens": prompt_tokens, "completion_tokens": done,
                "total_tokens": prompt_tokens + done}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m compatlab.standin_server", description=__doc__.split("\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--model", default="standin/model", help="reported by /get_model_info")
    p.add_argument("--tok-s", type=float, default=90.0, help="tokens per second per request; 0: no limit")
    p.add_argument("--accept-length", type=float, default=None,
                   help="act as a speculative (EAGLE-3) server with this mean accept length")
    p.add_argument("--ttft-ms", type=float, default=2.0, help="time to the first token (prefill)")
    p.add_argument("--startup-delay", type=float, default=0.0, help="seconds before the port opens")
    p.add_argument("--crash-after", type=int, default=None, help="exit mid-stream in request N+1")
    p.add_argument("--stall-after", type=int, default=None, help="stop sending mid-stream in request N+1")
    p.add_argument("--jitter", type=float, default=0.0,
                   help="relative noise in this process's rate, drawn once at start (e.g. 0.3 = +-30%%)")
    p.add_argument("--request-jitter", type=float, default=0.0, help="relative noise per request")
    p.add_argument("--seed", type=int, default=None, help="seed for the noise")
    p.add_argument("--seed-file", type=Path, default=None,
                   help="read the seed from this file and store seed+1, so that each start draws anew")
    p.add_argument("--spawn-child", action="store_true",
                   help="start a child that ignores SIGTERM, as engines' worker processes may")
    p.add_argument("--ignore-sigterm", action="store_true", help="ignore SIGTERM (needs SIGKILL)")
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
    _log(f"starting: model={args.model} rate={rate:.1f} tok/s accept-length={args.accept_length}")
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
    handler = type("Handler", (_Handler,), {"state": _State(args, rate)})
    server = ThreadingHTTPServer((args.host, args.port), handler)
    server.daemon_threads = True
    _log(f"listening on http://{args.host}:{server.server_address[1]}")
    try:
        server.serve_forever(poll_interval=0.05)
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
