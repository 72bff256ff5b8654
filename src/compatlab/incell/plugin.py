"""pytest plugin for the compat suites that run inside a cell's venv (compatlab/incell/suites/).

The lab runs ``python -m pytest -p compatlab.incell.plugin suites/test_<stage>.py --compatlab-context CTX
--compatlab-result OUT`` with the cell's own interpreter. Tests read the cell through the ``compat_context``
fixture and explain their verdict through the ``stage`` fixture; the result file is what the lab turns into
a StageResult. Outside a cell (the lab's own tests) the options are absent and nothing here does anything.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import tempfile
import time
from pathlib import Path
from typing import Any, NoReturn

import pytest

from compatlab.incell.context import SuiteContext


def pytest_configure(config: pytest.Config) -> None:
    """In a cell's suite (the lab passed --compatlab-result): die with the lab. The lab runs this pytest in
    a process group of its own, so a lab killed outright (``kill -9``, the OOM killer) would leave it, its
    fork server and its loads running; Linux's parent-death signal ends it instead, and the fork server,
    reading EOF, takes its children down."""
    if config.getoption("--compatlab-result", default=None) is None:
        return
    # The lab says its pid: a lab that died before the call below left this process to another parent already.
    lab = os.environ.get("COMPATLAB_LAB_PID", "")
    with contextlib.suppress(AttributeError, OSError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
        if lab.isdigit() and os.getppid() != int(lab):  # the lab died before the call: nobody reads the result
            os._exit(70)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("compatlab")
    group.addoption("--compatlab-context", default=None, help="JSON file describing the cell")
    group.addoption("--compatlab-result", default=None, help="where to write the suite's result JSON")


class StageRecorder:
    """What one compat test says about its cell: a reason, details, and whether a failure is the lab's."""

    def __init__(self, nodeid: str) -> None:
        self.nodeid = nodeid
        self.reason = ""
        self.kind = "fail"  # or "error": the lab/infrastructure failed, not the stack
        self.details: dict[str, Any] = {}

    def note(self, **details: Any) -> None:
        self.details.update(details)

    def fail(self, reason: str, **details: Any) -> NoReturn:
        self.reason, self.kind = reason, "fail"
        self.details.update(details)
        pytest.fail(reason, pytrace=False)

    def error(self, reason: str, **details: Any) -> NoReturn:
        self.reason, self.kind = reason, "error"
        self.details.update(details)
        pytest.fail(reason, pytrace=False)

    def skip(self, reason: str, **details: Any) -> NoReturn:
        self.reason = reason
        self.details.update(details)
        pytest.skip(reason)


_RECORDERS: dict[str, StageRecorder] = {}
_OUTCOMES: dict[str, dict[str, Any]] = {}


@pytest.fixture
def compat_context(request: pytest.FixtureRequest) -> SuiteContext:
    path = request.config.getoption("--compatlab-context")
    if not path:
        pytest.skip("not running inside a compatlab cell (no --compatlab-context)")
    return SuiteContext.read(Path(path))


@pytest.fixture
def stage(request: pytest.FixtureRequest) -> StageRecorder:
    rec = StageRecorder(request.node.nodeid)
    _RECORDERS[request.node.nodeid] = rec
    return rec


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    outcome = yield
    if not item.config.getoption("--compatlab-result"):
        return
    report: pytest.TestReport = outcome.get_result()
    entry = _OUTCOMES.setdefault(item.nodeid, {"nodeid": item.nodeid, "outcome": "passed", "seconds": 0.0})
    entry["seconds"] += report.duration
    if report.skipped and entry["outcome"] == "passed":
        entry["outcome"] = "skipped"
        entry["message"] = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    elif report.failed:
        # A failure in setup/teardown is the suite's own problem, not the stack's.
        entry["outcome"] = "failed" if report.when == "call" else "error"
        entry["message"] = report.longreprtext[-4000:]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    out = session.config.getoption("--compatlab-result")
    if not out:
        return
    tests = []
    for nodeid, entry in _OUTCOMES.items():
        rec = _RECORDERS.get(nodeid)
        if rec is not None:
            entry.update(reason=rec.reason, kind=rec.kind, details=rec.details)
            if entry["outcome"] == "failed" and rec.kind == "error":
                entry["outcome"] = "error"
        tests.append(entry)
    data = {"exitstatus": int(exitstatus), "finished": time.time(), "tests": tests}
    path = Path(out)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=2, default=str)
    os.replace(tmp, path)
