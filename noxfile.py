"""compatlab's sessions: one per matrix cell, plus summary, report, publish, gpu8_perf, tests and lint.

nox parametrizes at import time, so the matrix file is chosen by COMPATLAB_MATRIX (default ./matrix.toml).
Relative paths in COMPATLAB_MATRIX, COMPATLAB_REPORTS, COMPATLAB_VENVS and COMPATLAB_LAB_VENV are read as
paths under the folder nox was started in, once, at import.
"""

from __future__ import annotations

import difflib
import fcntl
import importlib.util
import logging
import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

import nox

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "src"))

from compatlab.cells import Cell, expand, planned  # noqa: E402
from compatlab.config.matrix import load_matrix  # noqa: E402
from compatlab.errors import ConfigError, LabError, UsageError  # noqa: E402
from compatlab.host import host_facts  # noqa: E402
from compatlab.parallel import CellPool, parse_jobs  # noqa: E402
from compatlab.plan import Plan, previous_spans  # noqa: E402
from compatlab.runs import store  # noqa: E402
from compatlab.runs.model import CellState, StageState  # noqa: E402
from compatlab.runs.names import check_name  # noqa: E402
from compatlab.runs.store import RunFolder  # noqa: E402

nox.options.default_venv_backend = "uv"
nox.options.sessions = ["matrix"]
nox.options.error_on_external_run = True


def _invoked_from() -> Path:
    """The folder nox was started in: relative paths of the user's (COMPATLAB_MATRIX, COMPATLAB_REPORTS,
    COMPATLAB_VENVS) mean a path there. nox moves into the noxfile's folder before importing it and keeps
    where it was as its config's ``invoked_from`` (``session.invoked_from`` in a session); the import runs
    inside ``load_nox_module(global_config)``, so its frame has it. Imported any other way: the cwd."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        where = getattr(frame.f_locals.get("global_config"), "invoked_from", None)
        if isinstance(where, str):
            return Path(where)
        frame = frame.f_back
    return Path.cwd()


INVOKED_FROM = _invoked_from()


def _user_path(variable: str, default: Path) -> Path:
    """``$variable`` resolved once against where nox was started, else *default*."""
    given = os.environ.get(variable)
    return INVOKED_FROM / given if given else default


MATRIX_PATH = _user_path("COMPATLAB_MATRIX", ROOT / "matrix.toml")
try:
    MATRIX = load_matrix(MATRIX_PATH)
    CELLS: list[Cell] = expand(MATRIX)
except ConfigError as exc:
    # One clear message and exit 2, before any session or subprocess starts; no traceback. A matrix over
    # max-cells is refused here, counted from its axis sizes, so that `nox -l` returns at once. Only
    # `nox -s lock` goes on when the lock alone is missing or out of date: it is what writes the lock.
    _argv = sys.argv[1 : sys.argv.index("--")] if "--" in sys.argv else sys.argv[1:]
    if "lock" not in _argv:
        print(f"error: {exc}".replace(str(ROOT) + os.sep, ""), file=sys.stderr)
        sys.exit(exc.exit_code)
    try:
        MATRIX = load_matrix(MATRIX_PATH, use_lock=False)
    except ConfigError as bad:
        print(f"error: {bad}".replace(str(ROOT) + os.sep, ""), file=sys.stderr)
        sys.exit(bad.exit_code)
    CELLS = []
for _note in MATRIX.notes:  # a lock older than the matrix, a selected version no rule can match
    print(f"note: {_note}".replace(str(ROOT) + os.sep, ""), file=sys.stderr)
SHARD = os.environ.get("COMPATLAB_SHARD", "")
if SHARD:
    from compatlab.shard import parse_shard, shard_cells

    try:
        CELLS = shard_cells(CELLS, *parse_shard(SHARD, where="COMPATLAB_SHARD"))
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)


def _check_posargs(posargs: list[str]) -> list[str] | None:
    """The stage names a cell's posargs give (``-- --until static``, ``-- --stages install,pins``), checked
    once against the pipeline before any session starts (a typo is one line and exit 2, not an error per
    cell and an empty run); the stages they leave to run, None for the whole pipeline."""
    from compatlab.runner import PIPELINE, select_stages

    until: str | None = None
    only: list[str] = []
    known = ("--until", "--stages", "-q", "--quiet", "-j", "--jobs")
    valued = ("--until", "--stages", "-j", "--jobs")
    for i, arg in enumerate(posargs):
        flag, eq, value = arg.partition("=")
        if arg.startswith("-") and flag not in known and (i == 0 or posargs[i - 1] not in valued):
            close = difflib.get_close_matches(flag, known, n=1, cutoff=0.6)
            hint = f"; perhaps you meant {close[0]!r}?" if close else ""
            print(f"error: {flag}: not an option of a matrix cell (it takes {', '.join(known)}){hint}", file=sys.stderr)
            sys.exit(2)
        if flag not in valued:
            continue
        if not eq:
            if i + 1 >= len(posargs):
                example = {"--until": "static", "--stages": "install,pins"}.get(flag, "4")
                print(
                    f"error: {flag} needs a value, e.g. {flag} {example}",
                    file=sys.stderr,
                )
                sys.exit(2)
            value = posargs[i + 1]
        if flag == "--until":
            until = value
        elif flag == "--stages":
            only.extend(n.strip() for n in value.split(",") if n.strip())
        else:  # -j: checked here, once, before any session starts
            try:
                parse_jobs(value, len(CELLS))
            except UsageError as exc:
                print(f"error: {exc}", file=sys.stderr)
                sys.exit(exc.exit_code)
    try:
        stages, left_out = select_stages(PIPELINE, until=until, only=tuple(only))
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
    return [s.name for s in stages] if left_out else None


def _cells_selected(argv: list[str]) -> bool:
    """Whether this nox invocation runs matrix cells (no -s, or -s naming matrix, or -k/-t, which pick
    cells): only then are the posargs a cell's."""
    sessions: list[str] = []
    for i, arg in enumerate(argv):
        if arg in ("-k", "-t", "--keywords", "--tags"):
            return True
        if arg == "--sessions":
            sessions.extend(a for a in argv[i + 1 :] if not a.startswith("-"))
        elif arg in ("-s", "--session", "-e") and i + 1 < len(argv):
            sessions.append(argv[i + 1])
    return not sessions or "matrix" in sessions


_ARGV = sys.argv[1 : sys.argv.index("--")] if "--" in sys.argv else sys.argv[1:]
# The stages the cells will run (None: the whole pipeline): what the estimate counts.
STAGES = _check_posargs(sys.argv[sys.argv.index("--") + 1 :]) if "--" in sys.argv and _cells_selected(_ARGV) else None

# An n/a cell is a session, so that `nox -l`, `-k` and `-t` list it, but it starts nothing and ends at once;
# nox's own lines about it ("Running session", "was successful", its row of the final list) are dropped
# from nox's log: the summary table says which cells are n/a, one line per reason.
NA = {c.id: c.na for c in CELLS if c.na is not None}


class _Quiet(logging.Filter):
    """nox's lines, less what says nothing: those about n/a cells (they start nothing), its echo of the lab's
    own commands (each cell says what it does; COMPATLAB_ECHO=1 keeps them), and in "Ran N sessions" the n/a
    cells are not counted."""

    def __init__(self) -> None:
        super().__init__()
        self.na_started = 0

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        start = text.find("matrix(")
        if start >= 0 and text[start + 7 : text.find(")", start)] in NA:
            self.na_started += text.startswith("Running session ")
            return False
        if text.startswith(str(LAB_VENV)) and os.environ.get("COMPATLAB_ECHO") != "1":
            return False
        ran = re.match(r"Ran (\d+) sessions?(.*)$", text, flags=re.DOTALL)
        if ran and self.na_started:
            n = int(ran.group(1)) - self.na_started
            record.msg, record.args = f"Ran {n} session{'s' if n != 1 else ''}{ran.group(2)}", ()
        return True


logging.getLogger("nox").addFilter(_Quiet())


def _cell_description(cell: Cell) -> str:
    """A cell's line in `nox -l`: why it is n/a, or that it runs (and what a known-bad one is expected to do)."""
    if cell.na is not None:
        return f"n/a: {cell.na}"
    if cell.expect:
        return (
            f"runs; expected {cell.expect}: {cell.expect_reason}"
            if cell.expect_reason
            else f"runs; expected {cell.expect}"
        )
    return "runs"


def _describe_cells() -> None:
    """Give each matrix(cell) session its own description, which `nox -l` and `nox -l --json` show: nox
    takes a session's description from its function's docstring, one for every parametrized call, so each
    call gets its own as nox generates it. Nothing changes where nox's internals are not as expected."""
    try:
        from nox._decorators import Call

        generate = Call.generate_calls.__func__  # type: ignore[attr-defined]
    except (ImportError, AttributeError):
        return
    by_id = {c.id: c for c in CELLS}

    def generate_calls(cls: type[Call], func: object, param_specs: object) -> list[Call]:
        calls: list[Call] = generate(cls, func, param_specs)
        for call in calls:
            cell = by_id.get(str(call.call_spec.get("cell", "")))
            if cell is not None and getattr(func, "name", None) == "matrix":
                call.__doc__ = _cell_description(cell)
        return calls

    Call.generate_calls = classmethod(generate_calls)  # type: ignore[method-assign,assignment]


_describe_cells()
# nox logs at INFO; the lab's own INFO lines (each command it runs in this process) are for --debug.
logging.getLogger("compatlab").setLevel(logging.WARNING)


def _reports_of(matrix_path: Path) -> Path:
    """Where a matrix's runs and grid go by default: reports/ for the repository's matrix.toml, and
    reports/<file stem>/ for any other matrix file, so that no matrix's run replaces another's grid in
    reports/latest (``examples/torchvision.toml`` -> ``reports/torchvision/``)."""
    if matrix_path.resolve() == (ROOT / "matrix.toml").resolve():
        return ROOT / "reports"
    stem = matrix_path.stem
    # Never a folder of the default matrix's own (reports/runs, reports/latest, reports/check).
    return ROOT / "reports" / (f"matrix-{stem}" if stem in ("runs", "latest", "check", "box") else stem)


REPORTS = _user_path("COMPATLAB_REPORTS", _reports_of(MATRIX_PATH))
# Every cell session of one `nox` invocation writes into the same run.
USER_RUN_ID = os.environ.get("COMPATLAB_RUN_ID", "")
if not USER_RUN_ID:
    from compatlab.runner import new_run_id

    os.environ["COMPATLAB_RUN_ID"] = new_run_id()
RUN_ID = os.environ["COMPATLAB_RUN_ID"]
try:
    check_name(RUN_ID, "COMPATLAB_RUN_ID")
except LabError as exc:  # a UsageError: one line, exit 2, before any session writes anything
    print(f"error: {exc}", file=sys.stderr)
    sys.exit(exc.exit_code)
RUN_DIR = REPORTS / "runs" / RUN_ID
LATEST = REPORTS / "latest"
VENVS = _user_path("COMPATLAB_VENVS", ROOT / ".compatlab" / "venvs")

LAB_DEPS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]


LAB_VENV = _user_path("COMPATLAB_LAB_VENV", ROOT / ".compatlab" / "lab")


def _lab_python(session: nox.Session) -> str:
    """The lab's own interpreter (compatlab's dependencies, not the cells'), made once and reused. Two nox
    processes at once (a matrix and a report, or the lab's tests side by side) make it one after the other,
    under a lock beside it: neither clears the venv the other is using or installing."""
    python = LAB_VENV / "bin" / "python"
    stamp = LAB_VENV / ".compatlab-deps"
    want = "\n".join([sys.version, *LAB_DEPS, "bytecode compiled at install"])
    LAB_VENV.parent.mkdir(parents=True, exist_ok=True)
    with open(LAB_VENV.with_name(LAB_VENV.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not python.exists() or not stamp.exists() or stamp.read_text() != want:
            session.run(
                "uv",
                "venv",
                "--clear",
                "--quiet",
                "--python",
                sys.executable,
                str(LAB_VENV),
                external=True,
                env={"UV_PYTHON_DOWNLOADS": "never"},
            )
            # Compiled at install: a box that sets PYTHONDONTWRITEBYTECODE (many images do) would otherwise
            # compile the lab's dependencies from source in every lab process of every run.
            session.run(
                "uv",
                "pip",
                "install",
                "--quiet",
                "--compile-bytecode",
                "--python",
                str(python),
                *LAB_DEPS,
                external=True,
            )
            stamp.write_text(want)
    return str(python)


def _lab_env() -> dict[str, str]:
    return {"PYTHONPATH": str(ROOT / "src"), "COMPATLAB_MATRIX": str(MATRIX.path), "UV_PYTHON_DOWNLOADS": "never"}


_OWNED: dict[Path, RunFolder] = {}


def _run_owner(session: nox.Session, run_dir: Path = RUN_DIR, run_id: str = RUN_ID) -> str:
    """This nox process owns the run while it lives (runs/store.py: ownership); its cells join with this."""
    if run_dir not in _OWNED:
        try:
            _OWNED[run_dir] = store.claim_run(run_dir, run_id=run_id, plan=planned(MATRIX), host=host_facts)
        except LabError as exc:
            session.error(str(exc))
    return _OWNED[run_dir].owner


def _finish_run(session: nox.Session, run_dir: Path = RUN_DIR) -> None:
    """The run ran to its end (runs/store.py: finished): only a finished run is compared with by history."""
    if run_dir in _OWNED:
        try:
            _OWNED[run_dir].finish(planned(MATRIX), latest=LATEST)
        except LabError as exc:
            session.error(str(exc))


_PLAN: list[Plan] = []


def _queued_cells(session: nox.Session) -> list[str]:
    """The live cells this nox invocation runs, in order: this session's and those still queued (nox has no
    public word for its queue; without it, every live cell of the matrix)."""
    try:
        listed = list(session._runner.manifest.list_all_sessions())
    except AttributeError:
        return [c.id for c in CELLS if c.na is None]
    mine = getattr(session._runner.func, "call_spec", {}).get("cell")
    return [
        cid
        for runner, queued in listed
        if runner.name == "matrix"
        for cid in [getattr(runner.func, "call_spec", {}).get("cell")]
        if cid and cid not in NA and (queued or cid == mine)
    ]


def _plan(session: nox.Session) -> Plan:
    """The run's plan, made by its first cell before anything is written, with the run's start line."""
    if not _PLAN:
        spans = previous_spans(REPORTS / "runs", matrix_name=MATRIX.name, stages=STAGES, exclude=RUN_ID)
        _PLAN.append(Plan(cells=tuple(_queued_cells(session)), previous=spans))
        if "-q" not in session.posargs and "--quiet" not in session.posargs:
            print("[compatlab] " + _PLAN[0].start_line(RUN_ID, not_applicable=len(NA)), file=sys.stderr, flush=True)
    return _PLAN[0]


def _split_jobs(posargs: list[str]) -> tuple[str, list[str]]:
    """(the -j value, "1" when none; the posargs without it): -j is the nox session's, not a cell's."""
    jobs, rest, i = "1", [], 0
    while i < len(posargs):
        flag, eq, value = posargs[i].partition("=")
        if flag in ("-j", "--jobs"):
            jobs = value if eq else (posargs[i + 1] if i + 1 < len(posargs) else "1")
            i += 1 if eq else 2
            continue
        rest.append(posargs[i])
        i += 1
    return jobs, rest


_POOL: list[CellPool] = []


def _cell_argv(
    python: str,
    cell_id: str,
    *,
    run_dir: Path,
    run_id: str,
    owner: str,
    before: Sequence[str] = (),
    after: Sequence[str] = (),
) -> list[str]:
    """`compatlab cell CELL` in the run *run_id* that *owner* holds: the one spelling of both sessions'."""
    return [
        python,
        "-m",
        "compatlab",
        "cell",
        cell_id,
        *before,
        "--matrix",
        str(MATRIX.path),
        "--run-dir",
        str(run_dir),
        "--run-id",
        run_id,
        "--latest",
        str(LATEST),
        "--venvs",
        str(VENVS),
        "--owner",
        owner,
        *after,
    ]


# On Ctrl-C, nox gives a command 0.3 s, then SIGTERMs it and SIGKILLs it 0.2 s later: on a loaded machine a
# cell could be killed outright while it still ended its own commands (a hung uv then ran on). A cell that got
# the Ctrl-C itself stops in well under 3 s; one that did not (nox alone was signalled) gets SIGTERM, which it
# unwinds like Ctrl-C, and 30 s for it: the grace `-j N` gives its cells (parallel.py).
CELL_INTERRUPT_S, CELL_TERMINATE_S = 3.0, 30.0


@nox.session(name="matrix", python=False)
# Tags name each axis value (`nox -t flashinfer-0.7.4`); `-k` matches id substrings (`-k "cu13 and torch2"`).
@nox.parametrize("cell", [nox.param(c.id, id=c.id, tags=[f"{a}-{v}" for a, v in c.axes.items()]) for c in CELLS])
def matrix(session: nox.Session, cell: str) -> None:
    """One matrix cell: its own uv venv, the pins, then every stage; fails only on unexpected verdicts.

    Posargs go to `compatlab cell`: `-- --until static` (a preflight), `-- --stages install,pins`, `-- -q`.
    """
    if cell in NA:
        return  # the run's results.json shows it as n/a (runs/store.py: aggregate); nothing to start
    session.notify("matrix_summary")
    plan = _plan(session)
    jobs_value, posargs = _split_jobs(list(session.posargs))
    owner, python = _run_owner(session), _lab_python(session)

    def argv(cid: str) -> list[str]:
        return _cell_argv(
            python,
            cid,
            run_dir=RUN_DIR,
            run_id=RUN_ID,
            owner=owner,
            after=("--estimate", plan.cell_words(cid), *posargs),
        )

    jobs = parse_jobs(jobs_value, len(plan.cells))
    if jobs <= 1:
        session.run(
            *argv(cell),
            env=_lab_env(),
            external=True,
            interrupt_timeout=CELL_INTERRUPT_S,
            terminate_timeout=CELL_TERMINATE_S,
        )
        return
    # -j N (parallel.py): the first session starts N cells; each session shows its own cell and ends with it.
    if not _POOL:
        _POOL.append(CellPool(jobs, plan.cells, argv, {**os.environ, **_lab_env()}))
    status = _POOL[0].wait(cell)
    if status != 0:
        session.error(f"compatlab cell {cell} exited with status {status}")


@nox.session(name="gpu8_perf", python=False)
def gpu8_perf(session: nox.Session) -> None:
    """The 8-GPU stages (NCCL, then EAGLE-3 vs baseline) for the live cells of the latest run.

    One session, not one per cell, so that `nox -s matrix -k/-t …` never pulls it in. It adds the stages
    to the run of COMPATLAB_RUN_ID, else to reports/latest's run of this matrix (reusing its venvs), and
    takes cell ids or parts of them as posargs: `nox -s gpu8_perf -- cuda13.0`.
    """
    run_id, run_dir = RUN_ID, RUN_DIR
    latest = LATEST / "results.json"
    if not USER_RUN_ID and latest.exists():
        try:
            previous = store.load_results(latest).run
        except LabError as exc:
            session.error(str(exc))
        if previous.matrix == str(MATRIX.path):
            run_id, run_dir = previous.id, REPORTS / "runs" / previous.id
    wanted = session.posargs
    chosen = [c for c in CELLS if c.na is None and (not wanted or any(w in c.id for w in wanted))]
    if not chosen:
        session.skip("no live cell matches " + " ".join(wanted))
    session.log(f"run {run_id}: {len(chosen)} cell(s)")
    news = []
    for cell in chosen:
        argv = _cell_argv(
            _lab_python(session),
            cell.id,
            run_dir=run_dir,
            run_id=run_id,
            owner=_run_owner(session, run_dir, run_id),
            before=("--gpu8",),
        )
        session.run(
            *argv,
            env=_lab_env(),
            external=True,
            success_codes=[0, 1],
            interrupt_timeout=CELL_INTERRUPT_S,
            terminate_timeout=CELL_TERMINATE_S,
        )
        try:
            result = store.read_cell(run_dir, cell.id)
        except LabError as exc:
            session.error(str(exc))
        if result is None or result.unexpected:
            news.append(cell.id)
    _finish_run(session, run_dir)
    _summarize(session, run_dir / "results.json")
    if news:
        session.error(f"unexpected verdicts in {len(news)} cell(s): " + ", ".join(news))


@nox.session(name="matrix_summary", python=False)
def matrix_summary(session: nox.Session) -> None:
    """Summary table of this run, then the report. Runs after the cells when `nox -s matrix` queues it."""
    results = RUN_DIR / "results.json"
    if not results.exists():
        session.skip(f"no results for run {RUN_ID}")
    _finish_run(session)
    _summarize(session, results)


def _summarize(session: nox.Session, results: Path) -> None:
    """The run's table (verdicts are judged by the cell sessions, so exit 1 here is not a failure), then
    the grid into reports/latest."""
    session.run(
        _lab_python(session),
        "-m",
        "compatlab",
        "summary",
        str(results),
        "--github-summary",
        env=_lab_env(),
        external=True,
        success_codes=[0, 1],
    )
    if os.environ.get("COMPATLAB_REPORT", "1") != "0":
        session.run(
            _lab_python(session),
            "-m",
            "compatlab",
            "report",
            str(results),
            "--out",
            str(LATEST),
            "--history",
            str(REPORTS / "runs"),
            env=_lab_env(),
            external=True,
        )
        _next_steps(results)


def _next_steps(results: Path) -> None:
    """The run's last lines: where the grid is, and what to run next for what this machine could not answer."""
    try:
        shown = store.load_results(results)
    except (ConfigError, OSError):
        return
    cells = [c for c in shown.cells if c.state != CellState.NA]
    say = [f"[compatlab] the grid: {LATEST / 'index.html'} (also compat.md, results.json)"]
    thin = [c for c in cells if c.preflight]
    no_gpu = [
        c
        for c in cells
        if c.state == CellState.PARTIAL
        and not c.preflight
        and any(s.name == "cuda" and s.state == StageState.SKIP for s in c.stages)
    ]
    if thin:
        say.append(f"[compatlab] {len(thin)} cell(s) preflighted only: `nox -s matrix` runs the whole pipeline")
    if no_gpu:
        say.append(
            f"[compatlab] {len(no_gpu)} cell(s) amber: every stage this machine can run passed; the cuda and serve "
            "stages need an NVIDIA GPU: on the GPU box run `nox -s matrix` (and `nox -s gpu8_perf` on 8 GPUs)"
        )
    red = [c for c in cells if c.state == CellState.FAIL]
    if red:
        known = sum(1 for c in red if c.expected is not None and not c.unexpected)
        tag = f" ({known} of them known-bad, as expected)" if known else ""
        say.append(f"[compatlab] {len(red)} cell(s) red{tag}: each one's causes are in {LATEST / 'compat.md'}")
    print("\n".join(say), file=sys.stderr, flush=True)


@nox.session(python=False)
def lock(session: nox.Session) -> None:
    """Resolve the axes' selectors against their indexes into matrix.lock (`-- --news FILE` for the news).

    Only this session asks an index; every other one, and `nox -l`, reads the lock.
    """
    session.run(
        _lab_python(session),
        "-m",
        "compatlab",
        "lock",
        "--matrix",
        str(MATRIX.path),
        *session.posargs,
        env=_lab_env(),
        external=True,
    )


@nox.session(python=False)
def cells(session: nox.Session) -> None:
    """Print the matrix's cells (`-- --json` for a CI matrix strategy)."""
    session.run(
        sys.executable,
        "-m",
        "compatlab",
        "cells",
        "--matrix",
        str(MATRIX.path),
        *session.posargs,
        env=_lab_env(),
        external=True,
    )


@nox.session(name="ci_matrix", python=False)
def ci_matrix(session: nox.Session) -> None:
    """Print the JSON a CI matrix strategy consumes (`-- --shards N` for one job per shard)."""
    session.run(
        sys.executable,
        "-m",
        "compatlab",
        "ci-matrix",
        "--matrix",
        str(MATRIX.path),
        *session.posargs,
        env=_lab_env(),
        external=True,
        silent=False,
    )


@nox.session(python=False)
def merge(session: nox.Session) -> None:
    """Merge shard runs into one run and render it: `nox -s merge -- reports/shards/*/runs/*`."""
    if not session.posargs:
        session.error("give the shard run folders: nox -s merge -- DIR [DIR ...]")
    out = REPORTS / "runs" / RUN_ID
    session.run(
        _lab_python(session),
        "-m",
        "compatlab",
        "merge",
        *session.posargs,
        "--matrix",
        str(MATRIX.path),
        "--out",
        str(out),
        "--latest",
        str(LATEST),
        env=_lab_env(),
        external=True,
        success_codes=[0, 1],
    )
    session.run(
        _lab_python(session),
        "-m",
        "compatlab",
        "summary",
        str(out / "results.json"),
        "--github-summary",
        env=_lab_env(),
        external=True,
        success_codes=[0, 1],
    )


@nox.session(python=False)
def report(session: nox.Session) -> None:
    """Render a results.json (default: the latest run): `nox -s report -- PATH/results.json --out DIR`."""
    args = session.posargs or [str(LATEST / "results.json"), "--out", str(LATEST), "--history", str(REPORTS / "runs")]
    session.run(_lab_python(session), "-m", "compatlab", "report", *args, env=_lab_env(), external=True)


@nox.session(python=False)
def publish(session: nox.Session) -> None:
    """Write the latest grid and a run index into a static-hosting folder: `nox -s publish -- --site DIR`."""
    args = session.posargs or ["--site", str(REPORTS / "site"), "--runs", str(REPORTS / "runs")]
    session.run(_lab_python(session), "-m", "compatlab", "publish", *args, env=_lab_env(), external=True)


# The CPU build of torch the NCCL suite's gloo tests run in real processes; pip finds it on a machine that
# keeps it on disk, and downloads it elsewhere.
TEST_TORCH = "torch==2.13.0"


def _test_torch(session: nox.Session) -> str | None:
    """An interpreter with a CPU torch for the NCCL suite's real-process tests: made once, beside the suite's
    other real environments (tests/fixtures/envs.py, which names it by the interpreter and the pin and makes
    it under a lock), so a fresh clone on the same machine reuses it (its pip install took 36 s of the 2-core
    machine). Where that folder cannot be written, it is made in the checkout's .compatlab/."""
    if given := os.environ.get("COMPATLAB_TEST_TORCH_PYTHON"):
        return given
    spec = importlib.util.spec_from_file_location("compatlab_test_envs", ROOT / "tests" / "fixtures" / "envs.py")
    if spec is None or spec.loader is None:
        session.error(f"{ROOT / 'tests' / 'fixtures' / 'envs.py'}: cannot be loaded")
    envs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(envs)
    session.log(f"the CPU torch of the NCCL tests ({TEST_TORCH}), made with pip unless it is there")
    try:
        try:
            venv = envs.build_env("test-torch", [TEST_TORCH])
        except PermissionError as exc:
            session.warn(f"{exc.filename}: {exc.strerror}: the CPU torch goes in .compatlab/ of this checkout")
            venv = envs.build_env("test-torch", [TEST_TORCH], root=ROOT / ".compatlab")
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        session.warn(f"could not make the CPU torch ({exc}): the NCCL real-process tests will skip")
        return None
    return str(venv / "bin" / "python")


def _chromium(session: nox.Session) -> None:
    """Debian's chromium for the report's browser tests: installed where we are root, else they skip."""
    if shutil.which("chromium"):
        return
    apt = shutil.which("apt-get")
    if apt is None or os.geteuid() != 0:
        session.warn("no chromium and no root apt-get: the browser tests will skip")
        return
    env = {"DEBIAN_FRONTEND": "noninteractive"}
    try:
        session.run(apt, "update", "-qq", external=True, env=env)
        session.run(apt, "install", "-y", "-qq", "chromium", external=True, env=env)
    except nox.command.CommandFailed:
        session.warn("apt-get could not install chromium: the browser tests will skip")


# `nox -s tests -- unit` is the fast loop: tests/unit holds only tests that start no process (no nox, uv,
# venv, compiler, browser or server). tests/e2e holds the others. Both run on every core: the e2e tests that
# run real nox share the lab's own venv (.compatlab/lab), which the first makes under its lock. The e2e
# tests wait on the processes they start much of the time: one worker more than the cores keeps them busy
# (2-core machine: 360 s with 2 workers, 275 s with 3, 279 s with 4). A later `-n N` in posargs wins.
_CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
PARTS = {"unit": ["tests/unit", "-n", "auto"], "e2e": ["tests/e2e", "-n", str(_CORES + 1)]}


@nox.session
def tests(session: nox.Session) -> None:
    """The lab's own tests: `-- unit` (in-process, xdist), `-- e2e` (real processes), both by default.

    Other posargs pass through to pytest (`-- -k name`, `-- tests/e2e/test_spine.py -x`). Every test that
    can run here runs: for the e2e part the session makes (and caches) the CPU-torch interpreter the NCCL
    tests need and installs Debian's chromium where it can; what still cannot run skips with the reason.
    """
    # The suite starts Python processes by the hundred (nox, the lab, pytest's workers). Where
    # PYTHONDONTWRITEBYTECODE is set (many images do), none writes bytecode and each compiles what it imports
    # from source: importing compatlab and nox took 2.2 s of CPU so, 0.6 s from bytecode (2 cores). Compiled
    # once here instead: the test venv at install, and the checkout's src/ (its __pycache__ is git-ignored).
    session.install("-e", ".[test]", env={"UV_COMPILE_BYTECODE": "1"})
    session.run("python", "-m", "compileall", "-q", "-j", "0", str(ROOT / "src"), silent=True)
    args = list(session.posargs)
    env = {"UV_PYTHON_DOWNLOADS": "never"}
    if args and args[0] in PARTS:
        runs = [PARTS[args[0]] + args[1:]]
    else:
        runs = [args] if args else [PARTS["unit"], PARTS["e2e"]]
    if any(run[:1] != ["tests/unit"] for run in runs):
        _chromium(session)
        if torch := _test_torch(session):
            env["COMPATLAB_TEST_TORCH_PYTHON"] = torch
    for run in runs:
        session.run("pytest", *run, env=env)


@nox.session
def lint(session: nox.Session) -> None:
    """The pinned hooks of .pre-commit-config.yaml over every tracked file: ruff check, ruff format, mypy
    (strict), typos and actionlint. A hook that changes a file (ruff format) fails the session and shows
    the diff. Hooks install from the package index on first use, into pre-commit's cache."""
    session.install("pre-commit==4.7.0")
    session.run("pre-commit", "run", "--all-files", "--show-diff-on-failure", *session.posargs)
