"""uv's failures told as a verdict: ``error`` (the infrastructure: a network, an index, a missing interpreter)
or ``fail`` (the stack: no solution, a pin its index lacks, a placeholder sdist), with one line that says why.

uv's words are matched in order: a timeout; a placeholder sdist (``resolver.placeholder``); no solution, whose
"not found" is asked of each pin's index itself (``explain_unsatisfiable``, by ``index.probe``) before it is
believed, and whose derivation is condensed to its facts (``resolver.condense_conflict``); an index that refused
the credentials; a network or index failure, named by the plan's index it belongs to. Anything else is an
``error`` with uv's first error line and its innermost cause.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from compatlab import resolver
from compatlab.config.axes import PYTHON_AXIS
from compatlab.index.probe import PROBE_TIMEOUT, probe_index
from compatlab.proc import Completed
from compatlab.runs.model import StageState
from compatlab.urls import redact_text

if TYPE_CHECKING:
    from compatlab.cells import Cell
    from compatlab.envs import InstallPlan

__all__ = ["classify_uv_failure", "explain_unsatisfiable", "last_line", "venv_failure"]

# uv's words for a network or index failure: the infrastructure, not the stack.
_INFRA_PATTERNS = (
    r"Failed to fetch",
    r"error sending request",
    r"Connection refused",
    r"connection (?:reset|closed)",
    r"dns error",
    r"failed to lookup address",
    r"tcp connect error",
    r"operation timed out",
    r"timed out",
    r"Could not connect",
    r"HTTP status server error",
    r"Network is unreachable",
    r"Failed to download",
    r"failed to read from file",
)
# A full disk (uv's cache or the venv being written): the machine, never the index, although uv's first line
# says "Failed to download" (uv 0.13: "failed to write to file `…`: No space left on device (os error 28)").
_DISK_FULL = r"No space left on device|\(os error 28\)"
DISK_FULL_FIX = (
    "free space there, or put uv's cache and the cells' venvs on a bigger disk (UV_CACHE_DIR, COMPATLAB_VENVS; "
    "README: Disk)"
)
# uv's hint when an index answered 401/403: the credentials, not the stack.
_AUTH_HINT = r"lack of valid authentication credentials"
_UNSAT_PATTERNS = (
    r"No solution found when resolving dependencies",
    r"Because .* we can conclude",
    r"no version of",
    r"not found in the package registry",
    r"there is no version of",
    r"only .* is available",
)


def last_line(text: str) -> str:
    """The most telling line of an error output (uv puts the cause last)."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else "(no output)"


def classify_uv_failure(
    done: Completed, plan: InstallPlan | None = None, *, probe_timeout: float = PROBE_TIMEOUT
) -> tuple[StageState, str]:
    """('error'|'fail', one-line reason) for a failed uv command.

    With the *plan* of a failed install, an unsatisfiable verdict is checked against the indexes
    themselves (``explain_unsatisfiable``): a pin its index lacks is ``fail`` and says what the index
    has; an index that does not answer as one is ``error``.
    """
    text = redact_text(done.stderr + "\n" + done.stdout)
    if done.timed_out:
        return StageState.ERROR, f"uv did not finish in {done.seconds:.0f} s (killed)"
    # Before the network's words: a placeholder's failed download says "not reachable" too.
    held = resolver.placeholder(text)
    if held is not None:
        return StageState.FAIL, held.describe()
    if re.search(_DISK_FULL, text, re.IGNORECASE):
        return StageState.ERROR, f"disk full: {_uv_summary(text)}; {DISK_FULL_FIX}"
    for pattern in _UNSAT_PATTERNS:
        if re.search(pattern, text, re.IGNORECASE):
            explained = explain_unsatisfiable(plan, timeout=probe_timeout) if plan is not None else None
            if explained is not None:
                return explained
            if re.search(_AUTH_HINT, text, re.IGNORECASE):
                return StageState.ERROR, "index refused access: " + _uv_summary(text, keep_hints=True)
            return StageState.FAIL, "unsatisfiable: " + _conflict(text)
    for pattern in _INFRA_PATTERNS:
        if re.search(pattern, text, re.IGNORECASE):
            return StageState.ERROR, "index or network failure: " + _which_index(text, plan) + _uv_summary(text)
    return StageState.ERROR, f"uv failed (exit {done.returncode}): " + _uv_summary(text)


def explain_unsatisfiable(plan: InstallPlan, *, timeout: float = PROBE_TIMEOUT) -> tuple[StageState, str] | None:
    """Why uv found no solution, asked of each pin's index; None when every pin is where it should be.

    A pin whose index answers without it is ``fail`` (the first such pins named, with what the index
    has); otherwise an index that is broken, refuses the credentials or cannot be reached is ``error``
    (uv's "not found" may have come from it). When every pin is on its index, the conflict is real and
    uv's own words are the better reason: None.
    """
    missing: list[str] = []
    broken: dict[str, str] = {}  # one problem per index: its first
    for pin in plan.pins:
        if pin.index is None:
            continue
        found = probe_index(pin.index, pin.package, timeout=timeout)
        if found.problem:
            broken.setdefault(pin.index.url, found.problem)
            continue
        if found.versions is None:
            missing.append(f"{pin.package} is not on {pin.index.shown}; {found.note}")
            continue
        if not any(_matches(pin.version, v) for v in found.versions):
            missing.append(
                f"{pin.package} {pin.version} is not on {pin.index.shown}; " + _has(found.versions, pin.version)
            )
    if missing:
        return StageState.FAIL, "; ".join(missing)
    if broken:
        first, *rest = broken.values()
        more = f" (and {len(rest)} more index{'es' if len(rest) > 1 else ''})" if rest else ""
        return StageState.ERROR, "index failure: " + first + more
    return None


def _conflict(text: str) -> str:
    """uv's derivation condensed to its facts (resolver.condense_conflict), else its own summary."""
    condensed = resolver.condense_conflict(text)
    if condensed is None or not condensed[1]:
        return _uv_summary(text)
    root, facts = condensed
    together = f"{root} cannot be installed together: " if " and " in root else ""
    return (together + "; ".join(facts))[:600]


def _which_index(text: str, plan: InstallPlan | None) -> str:
    """``http://host/torch/simple (the index of torch 2.9.1+cu130) did not answer: `` for the URL uv could not
    fetch, named by the plan's index it belongs to and the pins it serves; "" when uv names none."""
    m = re.search(r"Failed to fetch: `?([^`\s]+)", text) or re.search(r"for url \(([^)\s]+)\)", text)
    if m is None:
        return ""
    url = m.group(1)
    index = next((i for i in (plan.indexes if plan else ()) if url.startswith(i.url.rstrip("/") + "/")), None)
    if index is None:
        return f"{url} did not answer: "
    pins = [
        f"{p.package} {p.version}"
        for p in (plan.pins if plan else ())
        if p.index is not None and p.index.url == index.url
    ]
    served = f"the index of {', '.join(pins)}" if pins else "the install's index"
    return f"{index.shown} ({served}) did not answer: "


def _uv_summary(text: str, *, keep_hints: bool = False) -> str:
    lines = [ln.strip(" ╰─▶×|") for ln in text.splitlines()]
    lines = [ln.strip() for ln in lines if ln.strip() and (keep_hints or not ln.strip().startswith("hint:"))]
    # uv prints "error: ..." then the cause chain; keep the first error line and the innermost cause.
    first = next((ln for ln in lines if ln.startswith("error:")), lines[0] if lines else "")
    inner = lines[-1] if lines else ""
    first = first.removeprefix("error:").strip()
    if inner and inner not in first and inner.removeprefix("error:").strip() != first:
        first = f"{first} ({inner})"
    return first.replace(f"{resolver.LAB_PROJECT} ", "the cell ")[:600]


def venv_failure(done: Completed, *, python: str | None, cell: Cell) -> str:
    """Why ``uv venv`` failed, in one line; an interpreter uv cannot find is named with where it was asked."""
    text = redact_text(done.stderr + "\n" + done.stdout)
    if python is not None and re.search(r"No interpreter found", text, re.IGNORECASE):
        asked = f"the cell's {PYTHON_AXIS} axis" if cell.python else "install.python"
        drop = f"remove {python} from axes.{PYTHON_AXIS}" if cell.python else "change install.python"
        return (
            f"no Python {python} interpreter on this machine ({asked}; uv looks on PATH and in its own "
            f"installs, and downloads none here): install Python {python} where uv finds it, or {drop}"
        )
    if python is not None and (shim := re.search(r"Failed to inspect Python interpreter .*? at `([^`]+)`", text)):
        return _uninspectable(python, shim.group(1), text)
    _, why = classify_uv_failure(done)
    return "uv venv failed: " + why


def _uninspectable(python: str, found: str, text: str) -> str:
    """uv found an interpreter for *python* at *found* and could not run it: a pyenv shim for a version pyenv
    has but has not activated says which version and the fix; anything else says what running it said."""
    versions = re.search(r"command exists in these Python versions:[ \t]*\n((?:[ \t]+[\w.+-]+[ \t]*\n?)+)", text)
    if "pyenv:" in text and versions:
        have = versions.group(1).split()
        root = Path(found).parent.parent  # ~/.pyenv/shims/python3.12 -> ~/.pyenv
        where = root / "versions" / have[-1] / "bin" / f"python{python}"
        return (
            f"Python {python}: uv found {found}, a pyenv shim, and pyenv has {', '.join(have)} but has not "
            f"activated it ({where}); fix: `pyenv global <your default> {have[-1]}` so that the shim answers, "
            "or put that interpreter's folder first on PATH"
        )
    cause = re.search(r"cause: (.+)", text)
    err = re.search(r"\[stderr\]\s*\n\s*(\S.*)", text)
    said = "; ".join(x.group(1).strip() for x in (cause, err) if x) or "no output"
    return f"Python {python}: uv found {found} and could not run it: {said}"


def _matches(pinned: str, available: str) -> bool:
    """``==pinned`` as uv reads it: ``==2.9.1`` takes ``2.9.1+cu130``, ``==2.9.1+cu130`` only that."""
    return SpecifierSet(f"=={pinned}").contains(available, prereleases=True)


def _has(versions: Sequence[str], pinned: str, shown: int = 10) -> str:
    """``it has 2.9.0, 2.9.1, 2.10.0``: the versions nearest the pin when there are many."""
    at = bisect.bisect([Version(v) for v in versions], Version(pinned))
    lo = max(0, min(at - shown // 2, len(versions) - shown))
    near = versions[lo : lo + shown]
    more = len(versions) - len(near)
    return "it has " + ", ".join(near) + (f" (and {more} more)" if more else "")
