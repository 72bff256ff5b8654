"""The upgrade rehearsal: "can I run this install tonight?", answered on a copy of the environment.

One flow, on ``compatlab check``'s own pipeline (``cli.check.run_check``: ``runner.run_existing`` with the
stages of ``runner.existing_stages``, the one-cell grid and the per-package table it writes):

1. the environment as it is goes through check's stages (pins, static, import; cuda and serve where a GPU
   is), into ``<out>/original/``;
2. a copy that shares its files (``rehearse.copy``) gets the install, with uv, as typed
   (``uv pip install --python <copy>/bin/python ARGS``), and is judged the same way into ``<out>/after/``;
3. the two are compared (``rehearse.diff``): the distributions it changes, the pins it breaks, the modules
   that worked and break (with the stages' cause) and those that were broken and are fixed;
4. when something breaks, safer commands are tried, each on its own copy and judged before it is shown:
   the same request with the environment's critical pins held (a constraints file of what works now:
   torch, and each distribution the install would change whose modules all work, the packages asked for
   excepted), then the same request holding torch alone (uv then picks the newest release of what was asked
   for that accepts the installed torch). The first that keeps what works is the suggestion; none is
   suggested that was not judged, and ``--no-deps`` never is;
5. ``rehearsal.json`` (runs/rehearsal.py), ``rehearsal.md`` and ``index.html`` (render/rehearsal.py) are
   written into ``<out>``.

The original is never written: check installs nothing into what it checks, the copy's folders are its own,
and every file it shares is proven unchanged after uv ran (``Copy.check_untouched``).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shlex
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from packaging.utils import canonicalize_name

from compatlab.errors import LabError
from compatlab.existing import Environment
from compatlab.rehearse.copy import UntouchedError, copy_environment, remove_copy
from compatlab.rehearse.request import Request, parse_request, pip_conf_indexes
from compatlab.runner import ExistingRequest
from compatlab.runs.model import CellResult, CellState
from compatlab.runs.rehearsal import Attempt, Install, Judged, ModuleState, Outcome, Rehearsal
from compatlab.urls import redact_text

__all__ = ["Request", "parse_request", "pip_conf_indexes", "rehearse"]

log = logging.getLogger(__name__)

INSTALL_TIMEOUT = 3600.0


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class _Judge:
    """How each environment is judged: check's options, and where progress goes."""

    request: ExistingRequest
    say: Callable[[str], None]


def _judge(env: Environment, out: Path, judge: _Judge) -> tuple[CellResult, Judged]:
    from compatlab.cli.check import run_check

    t0 = time.monotonic()
    done = run_check(env, judge.request, out=out)
    seconds = round(time.monotonic() - t0, 3)
    result = done.result
    judge.say(f"{out.name}: {result.state} in {seconds:.1f} s" + (f" — {result.reason}" if result.reason else ""))
    return result, Judged(state=result.state.value, reason=result.reason, report=str(out), seconds=seconds)


def _shown(env: Environment, request: Request, constraints: Path | None) -> tuple[str, ...]:
    """The command as the box owner would run it on the environment itself, credentials redacted."""
    argv = request.argv("uv", env.python, constraints=constraints)
    return tuple(redact_text(a) for a in argv)


def _attempt(
    env: Environment,
    before: CellResult,
    request: Request,
    *,
    label: str,
    copy_root: Path,
    out: Path,
    judge: _Judge,
    keep: bool,
    held: Mapping[str, str] | None = None,
) -> Attempt:
    """Apply *request* (with *held* as a constraints file) to a fresh copy of *env*, judge it, compare."""
    from compatlab.envs import uv_env
    from compatlab.existing import inspect_environment
    from compatlab.proc import run, which
    from compatlab.rehearse import diff
    from compatlab.uv_failures import classify_uv_failure

    out.mkdir(parents=True, exist_ok=True)
    constraints: Path | None = None
    if held:
        constraints = out / "constraints.txt"
        constraints.write_text("".join(f"{n}=={v}\n" for n, v in sorted(held.items())), encoding="utf-8")
    shown = _shown(env, request, constraints)
    t0 = time.monotonic()
    copy = copy_environment(env.prefix, copy_root)
    judge.say(
        f"{out.name}: copy at {copy.root} ({copy.linked} files shared by hard link, {copy.copied} copied, "
        f"{copy.rewritten} relocated) in {time.monotonic() - t0:.1f} s"
    )
    try:
        argv = request.argv(which("uv"), copy.python, constraints=constraints)
        log.debug("rehearsal install: %s", redact_text(shlex.join(argv)))
        judge.say(f"{out.name}: {shlex.join(shown)}")
        done = run(argv, timeout=INSTALL_TIMEOUT, env=uv_env())
        copy.check_untouched()
        if not done.ok:
            _, why = classify_uv_failure(done)
            judge.say(f"{out.name}: the install fails: {why}")
            install = Install(ok=False, reason=why, seconds=round(done.seconds, 3))
            return Attempt(
                label=label,
                command=shown,
                install=install,
                outcome=Outcome.INSTALL_FAILS,
                constraints=dict(held or {}),
                constraints_file=str(constraints or ""),
                copy=copy.to_json(),
            )
        install = Install(ok=True, seconds=round(done.seconds, 3))
        after_env = inspect_environment(copy.python)
        after, judged = _judge(after_env, out, judge)
        copy.check_untouched()
        changes = diff.changes(env, after_env, before, after)
        breaks, fixes, new_broken, gone = diff.diff_modules(before, after)
        if CellState.ERROR in (before.state, after.state):
            outcome = Outcome.ERROR
        else:
            outcome = Outcome.BREAKS if breaks else Outcome.SAFE
        return Attempt(
            label=label,
            command=shown,
            install=install,
            outcome=outcome,
            changes=tuple(changes),
            broken_pins=tuple(diff.broken_pins(before, after)),
            breaks=tuple(breaks),
            fixes=tuple(fixes),
            new_broken=tuple(new_broken),
            gone=tuple(gone),
            judged=judged,
            constraints=dict(held or {}),
            constraints_file=str(constraints or ""),
            copy=copy.to_json(),
        )
    except UntouchedError as exc:
        raise LabError(str(exc)) from None
    finally:
        if not keep:
            remove_copy(copy.root)


def _safer_holds(
    env: Environment, before: CellResult, request: Request, first: Attempt
) -> list[tuple[str, dict[str, str]]]:
    """The safer requests to try, in order, each as (label, {name: version held})."""
    from compatlab.rehearse.diff import module_verdicts

    asked = {canonicalize_name(p) for p in request.packages}
    failing = {canonicalize_name(d) for state, d, _, _ in module_verdicts(before).values() if state == ModuleState.FAIL}
    torch = env.version_of("torch")
    critical: dict[str, str] = {}
    if torch is not None and "torch" not in asked:
        critical["torch"] = torch
    for change in first.changes:
        name = canonicalize_name(change.name)
        if change.old and name not in asked and name not in failing:
            critical[change.name] = change.old
    out: list[tuple[str, dict[str, str]]] = []
    if critical:
        names = ", ".join(f"{n}=={v}" for n, v in sorted(critical.items()))
        out.append((f"the same request, holding what works now ({names})", critical))
    if torch is not None and "torch" not in asked and set(critical) != {"torch"}:
        what = ", ".join(request.packages) or "what was asked for"
        out.append(
            (f"the newest release of {what} that accepts the installed torch ({torch})", {"torch": torch}),
        )
    return out


def rehearse(
    env: Environment,
    request: Request,
    *,
    out: Path,
    copies: Path,
    keep: bool = False,
    say: Callable[[str], None] | None = None,
    judged: ExistingRequest | None = None,
) -> Rehearsal:
    """Rehearse *request* on copies of *env* (made under *copies*), judged with check's stages (*judged*: what
    ``run_check`` asks of each environment; the default, every stage of every package), and write the
    rehearsal into *out*."""
    from compatlab import runner
    from compatlab.render.rehearsal import rehearsal_html, rehearsal_md
    from compatlab.runs import store

    def quiet(_line: str) -> None:
        pass

    judge = _Judge(request=judged or ExistingRequest(), say=say or quiet)
    started = store.now_iso()
    t0 = time.monotonic()
    if not request.has_index and (own := pip_conf_indexes(env.prefix)):
        request = dataclasses.replace(request, args=(*own, *request.args), has_index=True)
        judge.say(f"the environment's pip.conf names its indexes: {redact_text(shlex.join(own))}")
    before, original = _judge(env, out / "original", judge)
    first = _attempt(
        env,
        before,
        request,
        label="the install as typed",
        copy_root=copies / "after",
        out=out / "after",
        judge=judge,
        keep=keep,
    )
    safer: list[Attempt] = []
    if first.outcome == Outcome.BREAKS:
        for n, (label, held) in enumerate(_safer_holds(env, before, request, first), start=1):
            attempt = _attempt(
                env,
                before,
                request,
                label=label,
                copy_root=copies / f"safer-{n}",
                out=out / f"safer-{n}",
                judge=judge,
                keep=keep,
                held=held,
            )
            safer.append(attempt)
            if attempt.outcome == Outcome.SAFE:
                break
    result = Rehearsal(
        id=runner.new_run_id(),
        environment=str(env.prefix),
        python=env.version,
        started=started,
        seconds=round(time.monotonic() - t0, 3),
        original=original,
        request=first,
        safer=tuple(safer),
        gpus=judge.request.gpus,
    )
    out.mkdir(parents=True, exist_ok=True)
    result.write(out / "rehearsal.json")
    (out / "rehearsal.md").write_text(rehearsal_md(result), encoding="utf-8")
    (out / "index.html").write_text(rehearsal_html(result), encoding="utf-8")
    if not keep and copies.is_dir() and not any(copies.iterdir()):
        os.rmdir(copies)
    return result
