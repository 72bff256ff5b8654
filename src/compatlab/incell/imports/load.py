"""One target of the import stage loaded, retried as its package would load it, and told as an entry.

A target is an extension module (loaded by file path, under its dotted name) or a package (``import pkg``).
Each load runs in a process of its own (loader.py), and is tried again where the first answer is not the
stack's:

- an undefined ``cu…`` symbol the stand-in driver lacked: the stand-in grows by it and the load runs again
  (four tries at most);
- an extension module that failed to import (or crashed) by path, but linked: imported by its name in a
  process of its own, as its package does (numpy's ``_multiarray_umath`` imports numpy, which loads it again;
  h5py's defs need their package set up first). A link failure is never retried;
- an extension module that needs a library of its own package that no RUNPATH finds: that library loaded
  first, as its package does (torchaudio's ``libtorchaudio.so``, by ``torch.ops.load_library``);
- a load that failed and named no library: once more with the loader's log (``LD_DEBUG``), for what C code
  ``dlopen()``\\ ed itself and no Python door sees.

A package's import also says what it tried to load and could not (attempts.py judges each), and what it
mapped (reduced afterwards to its own distribution's shared objects, needed.py).
"""

from __future__ import annotations

import collections
import concurrent.futures
import os
import threading
from pathlib import Path
from typing import Any

from compatlab.incell.entries import ImportEntry
from compatlab.incell.imports.attempts import judge_attempts
from compatlab.incell.imports.driver import Driver
from compatlab.incell.imports.labels import site_label
from compatlab.incell.imports.loader import Loader, jobs
from compatlab.incell.imports.plan import Plan
from compatlab.incell.imports.progress import Progress
from compatlab.incell.loading.failure import LoadFailure, c_level_failure, describe
from compatlab.incell.loading.installed import LoadTarget
from compatlab.incell.loading.observed import attempts_of, mapped_of
from compatlab.incell.proc import Completed

__all__ = ["load_entry", "load_plan", "own_library"]


def load_plan(plan: Plan, driver: Driver, loader: Loader) -> list[tuple[ImportEntry, list[str] | None]]:
    """Every target of *plan* loaded, ``jobs`` at a time in the plan's order, each told by ``load_entry``;
    the answers in the order of the plan's targets.

    A package's import starts only once its distribution's own modules are answered (the plan puts them
    before it, so they are running or done by then): its adoption would otherwise race them, and a module
    asked after it is answered where its package imported it already (``imported_ok``), one asked before
    by loading it alone, so the same environment could be told two ways (a module that needs a library of
    its own package was "loaded after it" in one run and plainly loaded in the next). A module's answer
    there is its load by path: one that linked but that Python refused by path (or whose init crashed) is
    imported by its name once every target has been asked (``_load_module``): its package's import, which
    the name's import runs first, is then the adopting server's already, and its child imports only the
    module, where before every such module's child imported the package again."""
    # For each package's import, how many of its distribution's modules the order puts before it: it waits
    # for those alone, which are running or done by then, so no wait is ever on a load not yet started.
    asked: collections.Counter[str] = collections.Counter()
    ahead: dict[int, int] = {}
    for i in plan.order:
        target = plan.targets[i]
        if target.path is None:
            ahead[i] = asked[target.dist]
        else:
            asked[target.dist] += 1
    answered: collections.Counter[str] = collections.Counter()
    change = threading.Condition()
    later: dict[int, _Answer] = {}  # modules whose load by name waits for the rest of the plan: by path

    def one(i: int) -> tuple[ImportEntry, list[str] | None] | None:
        target = plan.targets[i]
        if i in ahead:
            with change:
                change.wait_for(lambda: answered[target.dist] >= ahead[i])
        try:
            if target.path is None:
                return progress.tick(load_entry(target, driver, loader))
            first = loader.ask_adopting(target, imported_ok=True)
            if first is not None and first[0] is not None and first[0].kind in _BY_NAME:
                with change:
                    later[i] = first
                return None
            return progress.tick(load_entry(target, driver, loader, asked=first))
        finally:
            if i not in ahead:
                with change:
                    answered[target.dist] += 1
                    change.notify_all()

    def rest(i: int) -> tuple[ImportEntry, list[str] | None]:
        return progress.tick(load_entry(plan.targets[i], driver, loader, asked=later[i]))

    with (
        concurrent.futures.ThreadPoolExecutor(max_workers=jobs(fork=loader.fork)) as pool,
        Progress(len(plan.targets)) as progress,
    ):
        for target in plan.targets:
            loader.own.setdefault(target.dist, []).append(target.name)
        done = dict(zip(plan.order, pool.map(one, plan.order), strict=True))
        # A module that linked by path but that Python refused (or whose init crashed) is imported by its
        # name, which imports its package first: asked once every package has been, so its package is in
        # the adopting server by then (the child imports only the module, not the package all over again).
        waited = [i for i in plan.order if i in later]
        done.update(zip(waited, pool.map(rest, waited), strict=True))
        return [_answered(done[i]) for i in range(len(plan.targets))]


_Answer = tuple[LoadFailure | None, Completed] | None  # the adopting server's answer, None where it gave none
_UNASKED: Any = object()  # load_entry's *asked* not given: the adopting server is asked


def _answered(
    done: tuple[ImportEntry, list[str] | None] | None,
) -> tuple[ImportEntry, list[str] | None]:
    if done is None:  # every module left for later was answered then
        raise RuntimeError("a module of the import stage's plan was never answered")
    return done


def load_entry(
    target: LoadTarget, driver: Driver, loader: Loader, *, asked: _Answer = _UNASKED
) -> tuple[ImportEntry, list[str] | None]:
    """The module's entry, and for a package's import the paths of what it mapped (None otherwise).
    *asked*: the adopting server's answer for an extension module by path, where it was asked already."""
    for _attempt in range(4):
        # A package's import is adopted by the server (its dependents' children start with it); the retries
        # below are not (the server has it by then, and refuses them to the server that adopts nothing).
        if target.path is not None:
            failure, done, first, by_name = _load_module(target, loader, asked if _attempt == 0 else _UNASKED)
        else:
            failure, done = loader.load(target, adopt=_attempt == 0)
            first, by_name = failure, False
        if failure is not None and failure.kind == "undefined-symbol" and failure.symbol and driver.add(failure.symbol):
            continue  # the stand-in lacked a driver entry point, not the stack a symbol
        break
    before = None
    sibling = own_library(target, failure)
    if sibling is not None:
        # It needs a library of its own package that no RUNPATH finds: its package loads that one first
        # (torchaudio's libtorchaudio.so, by torch.ops.load_library), so load it first too. Then the
        # failure, if any, is the library's own (libtorchaudio.so cannot find libcudart.so.12).
        before = first
        failure, _done = loader.load(target, preload=[sibling])
    failed_loads: list[dict[str, Any]] = []
    if target.path is None:
        failure, failed_loads = judge_attempts(target, failure, attempts_of(done) or [])
    if failure is not None and failure.kind in ("import-error", "exit"):
        # The load failed and said no library: C code may have dlopen()ed one itself, which no Python door
        # sees. The fallback: the load once more with the loader's own log (LD_DEBUG).
        unseen = loader.c_level(target)
        if unseen:
            symptom = failure.message if failure.kind == "import-error" else describe(target.label, failure)
            name, caller = unseen[0]
            step = f"load {target.path}" if target.path is not None else f"import {target.name}"
            failure = c_level_failure(name, caller, step=step, outer=(symptom, *failure.outer))
            failed_loads += [
                {
                    "name": n,
                    "how": "dlopen (C)",
                    "error": f"not loaded; asked by {site_label(os.path.realpath(c))}",
                    "kind": "missing-library",
                    "cause": c_level_failure(n, c, step="", outer=()).cause,
                    "judged": "cause" if i == 0 else "absent",
                }
                for i, (n, c) in enumerate(unseen)
            ]
    entry = ImportEntry(
        module=target.label,
        dist=target.dist,
        ok=failure is None,
        failed_loads=tuple(failed_loads) or None,
        cause=failure.cause if failure is not None else None,
        preloaded=site_label(sibling) if sibling is not None else None,
        seconds=round(done.seconds, 2),
        loaded=(
            f"by name (import {target.name}): by path, {describe(target.label, first)}"
            if by_name and first is not None
            else f"after {site_label(sibling)}, a library of its own package it needs: loaded alone, "
            f"{describe(target.label, before)}"
            if sibling is not None and before is not None and failure is None
            else None
        ),
        failure=failure.to_json() if failure is not None else None,
        reason=_reason(target, failure, failed_loads) if failure is not None else None,
    )
    # What a package's import mapped: reduced to its own distribution's shared objects afterwards.
    return entry, mapped_of(done) if failure is None and target.path is None else None


_BY_NAME = ("import-error", "signal")  # a load by path that linked but Python refused, or whose init crashed


def _load_module(
    target: LoadTarget, loader: Loader, asked: _Answer = _UNASKED
) -> tuple[LoadFailure | None, Completed, LoadFailure | None, bool]:
    """An extension module loaded by path, and where Python refused it so or its init crashed, by its name
    (``_BY_NAME``): numpy's ``_multiarray_umath`` imports numpy, which loads it again ("cannot load module
    more than once"); h5py's defs need their package set up first. It linked, so it is imported by its name,
    as its package does; a link failure is never retried. (failure, the load by path, its failure, whether
    by its name.)

    Asked of the adopting server first, where a module that an adopted package imported already is loaded
    (it linked and initialised there); the load by name follows there (*asked*: the answer by path, given
    where load_plan asked it in the plan's order and leaves the load by name until every target has been
    asked). A failure there is asked again of the server that adopts nothing, by path and then by name, and
    that answer kept."""
    by_name = LoadTarget(dist=target.dist, label=target.label, name=target.name)
    answer = loader.ask_adopting(target, imported_ok=True) if asked is _UNASKED else asked
    failed_there: tuple[LoadFailure, LoadFailure] | None = None  # how it failed there by path, and by name
    if answer is not None:
        failure, done = answer
        if failure is None:
            return None, done, None, False
        if failure.kind in _BY_NAME:
            again = loader.ask_adopting(by_name, imported_ok=True, alone=True)
            if again is not None and again[0] is None:
                return None, done, failure, True
            if again is not None and again[0] is not None and again[0].kind == "import-error":
                failed_there = (failure, again[0])
        loader.confirming()
    failure, done = loader.ask_plain(target)
    if failure is not None and failed_there is not None and _same(failed_there[0], failure):
        # By path it fails here, with only the prerequisites, word for word as in the adopting server: what
        # that server had imported changed nothing for it, so its failure there by name (a Python exception,
        # not a crash) is the answer by name too, not asked again here.
        return failure, done, failure, False
    if failure is not None and failure.kind in _BY_NAME:
        named, _done = loader.ask_plain(by_name) if answer is not None else loader.load(by_name, imported_ok=True)
        if named is None:
            return None, done, failure, True
    return failure, done, failure, False


def _same(one: LoadFailure, other: LoadFailure) -> bool:
    """The same Python exception, word for word (the step it was on aside: by path or by name). A crash is
    never the same: one in a fork of the adopting server may be what that server's state did to it."""
    return one.kind == other.kind == "import-error" and one.message == other.message


def own_library(target: LoadTarget, failure: LoadFailure | None) -> str | None:
    """The file of the module's own top-level package named as the library *failure* could not find
    (``torchaudio/lib/_torchaudio.so`` needs ``libtorchaudio.so``, in the same folder but on no RUNPATH);
    None when the failure is another or the package has no such file."""
    if (
        failure is None
        or failure.kind != "missing-library"
        or target.path is None
        or not failure.library
        or "/" in failure.library
        or "/" not in target.label
    ):
        return None
    real = os.path.realpath(target.path)
    top = Path(real).parent
    for _ in target.label.split("/")[1:-1]:  # up to the top-level folder the label starts with
        top = top.parent
    seen = 0
    for folder, _dirs, files in os.walk(top):
        if failure.library in files:
            found = os.path.join(folder, failure.library)
            return found if "," not in found and os.path.realpath(found) != real else None
        seen += len(files)
        if seen > 20000:  # a package this large is not searched further
            break
    return None


def _reason(target: LoadTarget, failure: LoadFailure, failed_loads: list[dict[str, Any]]) -> str:
    """The entry's one line: for an import whose failed load was the cause, which file and then the symptom."""
    cause = next((f for f in failed_loads if f["judged"] == "cause"), None)
    if cause is None or not failure.outer:
        return describe(target.label, failure)
    said = describe(target.label, failure).removeprefix(target.label)
    return f"{target.label} (it loads {cause['name']}){said}; then {failure.outer[0]}"
