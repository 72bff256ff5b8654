"""Why an SGLang server died, read from its own log: the exception an expert would name, and where from.

What an SGLang 0.5 log looks like when start-up fails:

- The scheduler (a child process, one per tensor-parallel rank) logs
  ``[2026-… TP0] Scheduler hit an exception: Traceback (most recent call last):`` and the traceback, then
  sends SIGQUIT to the launcher, which logs ``Received sigquit from a child process. It usually means the
  child failed.`` and kills its process tree. Or the launcher raises ``RuntimeError: Initialization
  failed. Please see the error messages above.`` Those are wrappers: the cause is the scheduler's.
- An import error at start (``sglang.utils`` imports IPython at module level) is the launcher's own
  traceback, the last frame in ``sglang/utils.py``.
- A chained exception prints the innermost first ("The above exception was the direct cause of the
  following exception:"); SGLang's CUDA-graph runners wrap the real error as ``Capture cuda graph failed:
  <error>`` followed by a list of possible solutions.
- An exception raised while handling another ("During handling of the above exception, another exception
  occurred:") is the earlier one's translation when it says more: Triton turns ptxas's
  ``CalledProcessError`` (whose text never holds the tool's output) into ``PTXASError`` carrying ptxas's
  stderr. Then the translation is the root. An explicit cause ("… was the direct cause of …") stays the root.
- Kernels without code for the GPU raise ``CUDA error: no kernel image is available for execution on the
  device`` from the call site, usually ``torch/_ops.py`` called from the kernel package's wrapper: the
  package named is the deepest frame outside torch, Triton and the standard library. When the deepest frame
  outside torch and the standard library is another package's (Triton's ``Cannot find ptxas``), that package
  raised it, and the reason names both: ``(in triton/knobs.py:217, called from sglang/…)``.
- Where SGLang was is read from what it logged before the exception, not from one wording: nothing of its own
  yet (start-up: an import), ``Load weight begin.`` without its end (model load), ``Capture … CUDA graph
  begin.`` without its end, or the exception's ``Capture cuda graph failed:`` (decode graph capture), or
  ``Fail when using backend: breakable for prefill runner.`` (the prefill graph, which SGLang also runs at the
  first request), the server's own ``Uvicorn running`` (the first request), and the build tools' words in the
  chain (Triton's ptxas, nvcc, ninja: a JIT build). Triton's LLVM aborts the process with one ``LLVM ERROR:``
  line and no traceback (a ptxas too old for the arch: ``PTX version 7.8 does not support target 'sm_90a'``).

Out of GPU memory and a port in use are the machine's, not the stack's: those causes are ``error``.
"""

from __future__ import annotations

import dataclasses
import re

from compatlab.runs.model import StageState

__all__ = ["Cause", "Phase", "Traceback", "find_cause", "tracebacks"]

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>.+)$')
_EXC = re.compile(r"^(?P<type>(?:[A-Za-z_]\w*\.)*[A-Z]\w*)(?::\s?(?P<message>.*))?$")
_LOG_PREFIX = re.compile(r"^\[\d{4}-\d\d-\d\d[ T]")  # [2026-12-03 16:44:32 TP0] a logger's line
_CHAINED = (
    "The above exception was the direct cause of the following exception:",
    "During handling of the above exception, another exception occurred:",
)
# Exceptions that only say another process failed, or that the launcher gave up.
_WRAPPERS = re.compile(
    r"Initialization failed\. Please see the error messages above|scheduler is dead|"
    r"Received sigquit|^KeyboardInterrupt|^SystemExit|^BrokenPipeError|^ConnectionResetError|"
    r"^EOFError|^ChildProcessError|^ConnectionRefusedError"
)
_SKIP_TOPS = ("torch", "triton", "importlib", "<frozen", "concurrent", "multiprocessing", "asyncio")
_OOM = re.compile(r"out of memory|OutOfMemoryError|Not enough memory|cudaErrorMemoryAllocation", re.I)
_PORT = re.compile(r"address already in use|\[Errno 98\]", re.I)
_NO_IMAGE = re.compile(
    r"no kernel image is available|cudaErrorNoKernelImageForDevice|"
    r"no binary for gpu|invalid device function",
    re.I,
)
_GRAPH = re.compile(r"Capture cuda graph failed", re.I)
_JIT_LINE = re.compile(r"\berror\b:|\bnvcc fatal\b", re.I)  # nvcc's and gcc's "file.cu(12): error: …"
_JIT = re.compile(r"ninja|nvcc|Ninja build failed|CalledProcessError|jit", re.I)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Traceback:
    """One printed traceback: its frames (file, line), and the exception line it ends with."""

    frames: tuple[tuple[str, int], ...]
    type: str
    message: str  # the first line of the message
    more: str = ""  # the message's further lines
    chained: bool = False  # printed after "The above exception was …": the one before is its cause
    end: int = 0  # the log line after it
    context: bool = False  # printed after "During handling of …": raised while handling the one before
    start: int = 0  # its "Traceback (most recent call last):" line

    @property
    def text(self) -> str:
        return f"{self.type}: {self.message}" if self.message else self.type


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Cause:
    """``state`` fail (the stack's) or error (the machine's); ``reason`` one line; ``exception`` the root."""

    state: StageState
    reason: str
    exception: str = ""
    where: str = ""
    outer: str = ""  # the chain's outermost exception, when it differs from the root
    raised_in: str = ""  # the package whose frame raised it, when not where's (triton under sglang)
    phase: str = ""  # where SGLang was (Phase): import, model load, CUDA graph capture, JIT build …


def short_path(path: str) -> str:
    """A frame's file as a box owner reads it: from the package on (``sgl_kernel/elementwise.py``)."""
    for marker in ("site-packages/", "dist-packages/", "sglang-site/"):
        if marker in path:
            return path.rsplit(marker, 1)[1]
    return path


def tracebacks(log: str) -> list[Traceback]:
    """Every traceback printed in *log*, in order."""
    lines = [_ANSI.sub("", line) for line in log.splitlines()]
    found: list[Traceback] = []
    i = 0
    chained = context = False
    while i < len(lines):
        line = lines[i]
        if line.strip() in _CHAINED:
            chained, context = True, line.strip() == _CHAINED[1]
            i += 1
            continue
        if "Traceback (most recent call last):" not in line:
            if line.strip():
                chained = context = False
            i += 1
            continue
        start = i
        i += 1
        frames: list[tuple[str, int]] = []
        while i < len(lines) and (lines[i].startswith((" ", "\t")) or not lines[i].strip()):
            m = _FRAME.match(lines[i])
            if m:
                frames.append((m["file"], int(m["line"])))
            i += 1
        if i >= len(lines):
            break
        m = _EXC.match(lines[i].strip())
        if m is None:
            continue
        i += 1
        more: list[str] = []
        while (
            i < len(lines)
            and lines[i].strip()
            and "Traceback (most recent call last):" not in lines[i]
            and not _LOG_PREFIX.match(lines[i])
            and lines[i].strip() not in _CHAINED
            and len(more) < 20
        ):
            more.append(lines[i].strip())
            i += 1
        message = (m["message"] or "").strip()
        if not message and more:  # ImportError("\n[sgl_kernel] CRITICAL: …"): the message starts on the next line
            message, more = more[0], more[1:]
        found.append(
            Traceback(
                frames=tuple(frames),
                type=m["type"],
                message=message,
                more="\n".join(more),
                chained=chained,
                context=context,
                end=i,
                start=start,
            )
        )
        chained = context = False
    return found


def _where(tb: Traceback) -> str:
    """The deepest frame outside torch, Triton and the standard library, as ``pkg/file.py:line``."""
    return _deepest(tb, _SKIP_TOPS)


def _raiser(tb: Traceback) -> str:
    """The deepest frame outside torch and the standard library (Triton's own frames count here)."""
    return _deepest(tb, tuple(t for t in _SKIP_TOPS if t != "triton"))


def _deepest(tb: Traceback, skip: tuple[str, ...]) -> str:
    frames = [(short_path(f), n) for f, n in tb.frames]
    outside = [(f, n) for f, n in frames if "/" in f and not f.startswith(("/", *skip))]
    f, n = (outside or frames or [("", 0)])[-1]
    return f"{f}:{n}" if f else ""


# A build tool's own words in an exception's text: Triton's "`ptxas` stderr:", ptxas's and nvcc's
# "ptxas fatal   : …", a compiler's "file(12): error: …".
_TOOL_SAID = re.compile(r"`?\w+`? stderr:|^[\w.+-]+ fatal\s*:|\(\d+\): (?:fatal )?error", re.M)


def _translates(later: Traceback, earlier: Traceback) -> bool:
    """Whether *later*, raised while handling *earlier*, says more of why: a tool's output where the earlier
    had none (a ``CalledProcessError``'s text never holds it), or a message where it had none."""
    if _WRAPPERS.search(later.text) or not later.message:
        return False
    if not earlier.message or earlier.type.endswith("CalledProcessError"):
        return True
    said = _TOOL_SAID.search(f"{later.message}\n{later.more}")
    return bool(said) and not _TOOL_SAID.search(f"{earlier.message}\n{earlier.more}")


def _root(chain: list[Traceback]) -> Traceback:
    """The chain's root: its first exception, or the translation of it that says more (see the module)."""
    root = chain[0]
    for tb in chain[1:]:
        if tb.context and _translates(tb, root):
            root = tb
    return root


def _chains(found: list[Traceback]) -> list[list[Traceback]]:
    chains: list[list[Traceback]] = []
    for tb in found:
        if tb.chained and chains:
            chains[-1].append(tb)
        else:
            chains.append([tb])
    return chains


def _inner(tb: Traceback) -> str:
    """The exception's text without SGLang's "Capture cuda graph failed:" wrapper."""
    text = tb.text
    if _GRAPH.search(text):
        text = text.split("Capture cuda graph failed:", 1)[-1].strip() or text
    return text


_LINK_FACT = re.compile(r"undefined symbol: (\S+)|cannot open shared object file|version `[^']+' not found")
_TOOL_FATAL = re.compile(r"^[\w.+-]+ fatal\s*:")
_NO_FILES = re.compile(r"pattern: (\S+) - found files: \[\]")


def _facts(log_lines: list[str], tb: Traceback) -> str:
    """What a headline exception's own further lines say of why (sgl_kernel's "CRITICAL: Could not load any
    common_ops library!" is followed by them, blank lines between): a link failure first (an undefined symbol,
    demangled), then a build folder with no file, then the first of its "Error details"; "" when none."""
    block: list[str] = []
    for line in log_lines[tb.end : tb.end + 60]:
        if "Traceback (most recent call last):" in line or _LOG_PREFIX.match(line) or line.strip() in _CHAINED:
            break
        block.append(line.strip())
    block = [*tb.more.splitlines(), *block]
    for line in block:
        if m := _LINK_FACT.search(line):
            if m.group(1):
                from compatlab.incell.loading.demangle import demangle

                return f"undefined symbol {demangle(m.group(1)) or m.group(1)}"
            return " ".join(short_path(w) for w in line.lstrip("- ").split())
    for line in block:
        if _TOOL_FATAL.match(line):  # ptxas's own "ptxas fatal   : Value 'sm_90a' is not defined for …"
            return " ".join(line.split())
    for line in block:
        if m := _NO_FILES.search(line):
            return f"no file matches {short_path(m.group(1))}"
    details = next((i for i, line in enumerate(block) if line.startswith("Error details")), None)
    if details is not None:
        item = next((line for line in block[details + 1 :] if line.startswith("- ")), "")
        return item.removeprefix("- ")
    return ""


def _clip(text: str, width: int = 300) -> str:
    """*text* in at most about *width* characters, keeping its end: a compiler's line ends with what it
    could not find (a header's name after a long generated path)."""
    if len(text) <= width:
        return text
    return f"{text[: width // 3].rstrip()} … {text[-(2 * width) // 3 :].lstrip()}"


class Phase:
    """Where SGLang was when it failed, as a reason's prefix says it (``Cause.phase``)."""

    IMPORT = "start-up (import)"  # nothing of SGLang's own logged yet, or an import failed before the model
    START = "start-up, before the model loads"
    MODEL_LOAD = "model load"
    GRAPH = "CUDA graph capture"
    JIT = "JIT build"
    FIRST_REQUEST = "first request"
    RUNNING = "after start-up"


# SGLang 0.5's own start-up lines, in order: (pattern, the phase it begins); an end line ends the one before.
_MARKS = (
    (re.compile(r"Load weight begin"), Phase.MODEL_LOAD),
    (re.compile(r"Load weight end|Memory pool end|KV Cache is allocated"), Phase.RUNNING),
    (re.compile(r"Capture (?:(?P<what>[\w ]+?) )?(?:cuda|CUDA) graph begin"), Phase.GRAPH),
    (re.compile(r"Capture (?:[\w ]+? )?(?:cuda|CUDA) graph end"), Phase.RUNNING),
    (re.compile(r"Uvicorn running on|The server is fired up and ready to roll"), Phase.FIRST_REQUEST),
)
_PREFILL_GRAPH = re.compile(r"Fail when using backend: (?P<backend>\S+) for prefill runner")


def _phase(lines: list[str], chain: list[Traceback], everything: str) -> tuple[str, str]:
    """(phase, what) of a failure: the phase from SGLang's lines before the chain, *what* its detail (the
    graph captured: "target verify", "prefill, backend breakable"; the tool of a JIT build: "ptxas")."""
    start = chain[0].start
    before = lines[:start]
    for m in (_PREFILL_GRAPH.search(line) for line in reversed(lines[max(0, start - 40) : chain[-1].end])):
        if m:
            return Phase.GRAPH, f"prefill runner, backend {m['backend']}"
    if _GRAPH.search(everything):
        return Phase.GRAPH, "decode"
    if re.search(r"PTXASError|\bptxas\b", everything):
        return Phase.JIT, "Triton's ptxas"
    phase, what = "", ""
    for line in before:
        for mark, begins in _MARKS:
            if m := mark.search(line):
                phase = begins
                what = (m.groupdict().get("what") or "") if begins == Phase.GRAPH else ""
                break
    return (phase or Phase.START), what


def find_cause(log: str, *, arch: str = "") -> Cause | None:
    """The cause of a failed start-up or request in *log* (SGLang's), or None when it shows no exception.

    *arch* (``sm_90``) names the GPU in a "no kernel image" cause.
    """
    chains = _chains(tracebacks(log))
    real = [c for c in chains if not all(_WRAPPERS.search(tb.text) for tb in c)]
    if not real:
        llvm = next((line.strip() for line in log.splitlines() if line.startswith("LLVM ERROR: ")), None)
        if llvm is not None:  # Triton's LLVM aborts the process: no traceback, one line (an old ptxas's PTX version)
            return Cause(
                state=StageState.FAIL,
                reason=f"JIT build (LLVM) failed: {_clip(_ANSI.sub('', llvm))}",
                exception=llvm,
                phase=Phase.JIT,
            )
        if _OOM.search(log):
            line = next(x for x in log.splitlines() if _OOM.search(x))
            return Cause(state=StageState.ERROR, reason=f"out of GPU memory: {line.strip()[:300]}")
        return None
    chain = real[-1]
    root, outer = _root(chain), chain[-1]
    lines = [_ANSI.sub("", line) for line in log.splitlines()]
    everything = "\n".join(f"{tb.text}\n{tb.more}" for tb in chain)
    where, raiser = _where(root), _raiser(root)
    raised_in = raiser.split("/", 1)[0] if raiser and raiser.split("/", 1)[0] != where.split("/", 1)[0] else ""
    at = f" (in {raiser}, called from {where})" if raised_in and where else f" (in {where or raiser})"
    at = "" if at == " (in )" else at
    phase, what = _phase(lines, chain, everything)
    if phase == Phase.START and root.type.endswith(("ModuleNotFoundError", "ImportError")):
        phase = Phase.IMPORT
    common = {
        "exception": root.text,
        "where": where,
        "outer": outer.text if outer is not root else "",
        "raised_in": raised_in,
        "phase": phase,
    }
    if _PORT.search(everything):
        return Cause(state=StageState.ERROR, reason=f"the port is in use: {root.text[:300]}", **common)
    if _OOM.search(everything):
        return Cause(state=StageState.ERROR, reason=f"out of GPU memory{at}: {root.text[:300]}", **common)
    graph = ""
    if phase == Phase.GRAPH:
        if what.startswith("prefill runner"):  # SGLang's one message for the prefill graph's capture and replay
            graph = f"CUDA graph failed ({what}): "
        else:
            graph = "CUDA graph capture failed: " if what in ("", "decode") else f"CUDA graph capture failed ({what}): "
    if _NO_IMAGE.search(everything):
        gpu = f" for {arch}" if arch else " for this GPU"
        pkg = where.split("/", 1)[0] if where else "a kernel"
        return Cause(
            state=StageState.FAIL, reason=f"{graph}no kernel image{gpu} in {pkg}{at}: {_inner(root)[:200]}", **common
        )
    if root.type.endswith("ModuleNotFoundError"):
        return Cause(
            state=StageState.FAIL, reason=f"{root.text[:300]} (imported by {where or 'SGLang at start'})", **common
        )
    fact = _facts(lines, root)
    said = f"{_inner(root)[:300]} — {fact}" if fact and fact not in root.text else _inner(root)[:300]
    if graph:
        return Cause(state=StageState.FAIL, reason=f"{graph}{said}{at}", **common)
    if _JIT.search(everything) and any(p in where for p in ("jit", "flashinfer", "tvm_ffi", "cpp_extension")):
        pkg = where.split("/", 1)[0]
        before = lines[: max(tb.end for tb in chain)]
        detail = next(
            (
                line.strip()
                for line in reversed(before)
                if _JIT_LINE.search(line) and "Traceback" not in line and not _EXC.match(line.strip())
            ),
            root.text,
        )
        common["phase"] = Phase.JIT
        return Cause(state=StageState.FAIL, reason=f"{pkg} JIT: the kernel build failed{at}: {_clip(detail)}", **common)
    if phase == Phase.JIT:
        return Cause(state=StageState.FAIL, reason=f"JIT build ({what}) failed: {_clip(said)}{at}", **common)
    if phase in (Phase.MODEL_LOAD, Phase.FIRST_REQUEST):
        return Cause(state=StageState.FAIL, reason=f"{phase} failed: {said}{at}", **common)
    return Cause(state=StageState.FAIL, reason=f"{said}{at}", **common)
