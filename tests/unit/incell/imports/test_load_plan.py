"""The import stage's loads side by side: a package's import never starts before its own modules are answered.

Its adoption would otherwise race them: a module asked after the package was adopted is answered where the
package imported it already, one asked before by loading it alone, and one environment is told two ways.
"""

from __future__ import annotations

import threading
import time
import types
from typing import Any

import pytest

from compatlab.incell.entries import ImportEntry
from compatlab.incell.imports import load
from compatlab.incell.imports.plan import Plan
from compatlab.incell.loading.failure import LoadFailure
from compatlab.incell.loading.installed import LoadTarget
from compatlab.incell.proc import Completed


def _module(dist: str, name: str) -> LoadTarget:
    return LoadTarget(dist=dist, label=f"{dist}/{name}.so", name=f"{dist}.{name}", path=f"/site/{dist}/{name}.so")


def _package(dist: str) -> LoadTarget:
    return LoadTarget(dist=dist, label=dist, name=dist)


def _run(
    plan: Plan,
    monkeypatch: pytest.MonkeyPatch,
    slow: dict[str, float],
    jobs: int = 4,
    refused_by_path: frozenset[str] = frozenset(),
) -> tuple[list[Any], list[tuple[str, float, float]]]:
    """*plan* loaded *jobs* at a time, each load a sleep of ``slow[label]`` (0 by default): the answers, and
    (label, start, end) of each load. The adopting server gives no answer, but for the modules
    *refused_by_path*: by path, Python refused them (an import-error), and their entries are told after."""
    monkeypatch.setenv("COMPATLAB_IMPORT_JOBS", str(jobs))
    monkeypatch.delenv("COMPATLAB_PROGRESS_FD", raising=False)
    times: list[tuple[str, float, float]] = []
    lock = threading.Lock()

    def load_entry(target: LoadTarget, _driver: object, _loader: object, **_asked: object) -> tuple[ImportEntry, None]:
        start = time.monotonic()
        time.sleep(slow.get(target.label, 0.0))
        with lock:
            times.append((target.label, start, time.monotonic()))
        return ImportEntry(module=target.label, dist=target.dist, ok=True, seconds=0.0), None

    def ask_adopting(target: LoadTarget, **_how: object) -> tuple[LoadFailure, Completed] | None:
        if target.label not in refused_by_path:
            return None
        with lock:
            times.append((f"{target.label} by path", time.monotonic(), time.monotonic()))
        return LoadFailure(kind="import-error", message="ImportError: its package first"), Completed(
            argv=[], returncode=1, stdout="", stderr="", seconds=0.0
        )

    monkeypatch.setattr(load, "load_entry", load_entry)
    loader = types.SimpleNamespace(fork=True, own={}, ask_adopting=ask_adopting)
    return load.load_plan(plan, driver=None, loader=loader), times  # type: ignore[arg-type]


def test_a_package_starts_once_its_own_modules_are_answered_not_while_one_is_slow_to_be_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # pkg's two modules, then its package; and other, whose package needs nothing of pkg's modules.
    targets = [_module("pkg", "_slow"), _module("pkg", "_fast"), _package("pkg"), _package("other")]
    plan = Plan(targets=targets, order=[0, 1, 2, 3], owned={}, warnings=[])
    answers, times = _run(plan, monkeypatch, {"pkg/_slow.so": 0.5})
    assert [entry.module for entry, _mapped in answers] == ["pkg/_slow.so", "pkg/_fast.so", "pkg", "other"]
    at = {label: (start, end) for label, start, end in times}
    assert at["pkg"][0] >= at["pkg/_slow.so"][1], "pkg's import started while its own module was loading"
    assert at["pkg"][0] >= at["pkg/_fast.so"][1]
    # A package of another distribution does not wait for pkg's modules: the four ran side by side.
    assert at["other"][0] < at["pkg/_slow.so"][1], times


def test_a_package_the_order_puts_before_its_modules_does_not_wait_for_them(monkeypatch: pytest.MonkeyPatch) -> None:
    # The plan never orders so (plan.py); were it to, the package would wait for nothing that has not
    # started, rather than wait forever for a module queued behind it.
    targets = [_module("pkg", "_a"), _package("pkg")]
    plan = Plan(targets=targets, order=[1, 0], owned={}, warnings=[])
    done = threading.Event()
    result: list[Any] = []

    def go() -> None:
        result.extend(_run(plan, monkeypatch, {}, jobs=1)[0])
        done.set()

    threading.Thread(target=go, daemon=True).start()
    assert done.wait(30), "the package waited for a module the order puts after it"
    assert [entry.module for entry, _mapped in result] == ["pkg/_a.so", "pkg"]


def test_a_module_python_refused_by_path_is_imported_by_name_after_every_package(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # pkg/_needs_pkg.so links but Python refuses it by path: its import by name imports pkg first, so it is
    # asked once pkg (and every other package) has been, where pkg is the adopting server's already. pkg's
    # import did not wait for that: only for the answer by path.
    targets = [_module("pkg", "_needs_pkg"), _module("pkg", "_plain"), _package("pkg"), _package("other")]
    plan = Plan(targets=targets, order=[0, 1, 2, 3], owned={}, warnings=[])
    answers, times = _run(plan, monkeypatch, {"other": 0.3}, jobs=2, refused_by_path=frozenset({"pkg/_needs_pkg.so"}))
    assert [entry.module for entry, _mapped in answers] == ["pkg/_needs_pkg.so", "pkg/_plain.so", "pkg", "other"]
    at = {label: (start, end) for label, start, end in times}
    assert at["pkg/_needs_pkg.so"][0] >= max(at["pkg"][1], at["other"][1]), times
    assert at["pkg"][0] >= at["pkg/_needs_pkg.so by path"][1]
    assert at["pkg"][0] < at["pkg/_needs_pkg.so"][0]
