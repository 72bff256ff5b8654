"""``compatlab check``: every stage of the pipeline on an environment that already exists; one verdict.

Exit status: 0 when the environment passes (or passes what this machine can check: ``partial``),
1 when it fails or the lab could not answer (``error``), 2 on bad usage.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path
from typing import Any

from compatlab import runner
from compatlab.cli import options
from compatlab.cli.options import check_targets
from compatlab.existing import Environment
from compatlab.render.packages import PackageRow
from compatlab.reporter import Reporter
from compatlab.runner import ExistingRequest
from compatlab.runs.model import CellResult, CellState, StageResult, StageState

__all__ = ["CheckReporter", "CheckRun", "check_targets", "configure_parser", "execute", "run_check"]

DEFAULT_OUT = "reports/check"
BLOCKED = "blocked: "  # stages/base.py: blocked()


def configure_parser(sub: Any) -> argparse.ArgumentParser:
    """Add the ``check`` verb to the subparsers *sub* of the ``compatlab`` parser."""
    s: argparse.ArgumentParser = sub.add_parser(
        "check",
        help="pins, static, import, cuda, serve (and nccl) on an existing environment: one verdict",
        description="Run the lab's pipeline on an existing environment (a venv, a conda env or a system "
        "Python) and write a one-cell grid and a per-package table.",
    )
    who = s.add_mutually_exclusive_group()
    who.add_argument("--python", type=Path, help="the environment's interpreter (default: $VIRTUAL_ENV's)")
    who.add_argument("--venv", type=Path, help="a virtual environment folder (its bin/python)")
    options.add_targets(s)
    s.add_argument("--min-driver", help="the oldest NVIDIA driver it must run on, e.g. 580.65")
    s.add_argument(
        "--pin",
        action="append",
        default=[],
        metavar="REQ",
        help="NAME==VERSION the environment should have (repeatable)",
    )
    s.add_argument("--constraints", type=Path, metavar="FILE", help="a file of NAME==VERSION pins")
    s.add_argument(
        "--package",
        action="append",
        default=[],
        metavar="NAME",
        help="check only this distribution (repeatable); default: every one with native code",
    )
    s.add_argument("--nccl", action="store_true", help="also run the NCCL suite on the GPUs present")
    options.add_stages(s, runner.existing_stage_names(), help="run only this stage")
    s.add_argument(
        "--serve-from",
        type=Path,
        metavar="FILE",
        help="serve the model of this TOML file's [serve] table (a matrix.toml will do); default: "
        "the built-in Llama and its EAGLE-3 draft",
    )
    s.add_argument(
        "--threshold",
        action="append",
        default=[],
        metavar="KEY=SECONDS",
        help="a suite's time limit (repeatable): import-timeout, cuda-op-timeout, jit-timeout",
    )
    s.add_argument("-q", "--quiet", action="store_true", help="no progress lines while a stage runs")
    s.add_argument("--out", type=Path, default=Path(DEFAULT_OUT), help=f"report folder (default: {DEFAULT_OUT})")
    s.set_defaults(func=execute)
    return s


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class CheckRun:
    """What ``compatlab check`` found: the one cell's result, the per-package table, the files written."""

    result: CellResult
    packages: tuple[PackageRow, ...]
    files: tuple[Path, ...]


def run_check(env: Environment, request: ExistingRequest, *, out: Path, reporter: Reporter | None = None) -> CheckRun:
    """Run the pipeline on *env* (``runner.run_existing``) into ``out/runs/<run-id>/`` and write the reports into
    *out*: the one-cell grid (index.html, compat.md, results.json, answers.json) and the per-package table
    (packages.md, packages.json)."""
    from compatlab.render import render_run
    from compatlab.render.packages import package_rows, packages_json, packages_md

    run_dir = out / "runs" / runner.new_run_id()
    ctx, result = runner.run_existing(env, request, run_dir=run_dir, reporter=reporter)
    files = render_run(run_dir / "results.json", out, history_dir=None)
    checked = [(v.package, v.version) for v in ctx.cell.packages if v.package]
    rows = package_rows(result, checked) + [
        PackageRow(name=where, version="?", state=StageState.WARN, modules=0, messages=(f"metadata: {why}",))
        for where, why in env.problems
    ]
    md, js = out / "packages.md", out / "packages.json"
    md.write_text(packages_md(rows), encoding="utf-8")
    js.write_text(packages_json(result.id, str(result.state), rows), encoding="utf-8")
    return CheckRun(result=result, packages=tuple(rows), files=(*files, md, js))


@dataclasses.dataclass(frozen=True, slots=True)
class CheckReporter:
    """``compatlab check``'s face: a line per stage that ran on stdout, the stages' notes on stderr (none with
    ``--quiet``). A stage an earlier one blocks is said by the verdict, not by a line of its own."""

    quiet: bool = False

    def stage_done(self, result: StageResult) -> None:
        if result.state == StageState.SKIP and result.reason.startswith(BLOCKED):
            return
        why = f" — {result.reason}" if result.reason else ""
        print(f"  {result.name}: {result.state} ({result.seconds:.1f} s){why}", flush=True)

    def note(self, line: str) -> None:
        print(f"    {line}", file=sys.stderr, flush=True)


def _python(args: argparse.Namespace) -> Path:
    """The interpreter to check, as an absolute path where the command runs (a relative --python or --venv is
    a path under the folder the user is in; symlinks are kept: a venv's bin/python *is* the venv)."""
    from compatlab.errors import UsageError

    if args.python is not None:
        return Path(os.path.abspath(args.python))
    if args.venv is not None:
        venv = Path(os.path.abspath(args.venv))
        if not (venv / "bin" / "python").exists():
            raise UsageError(
                f"--venv {venv}: no bin/python there; pass the folder of a virtual environment, "
                "or --python PATH for any other interpreter"
            )
        return venv / "bin" / "python"
    active = os.environ.get("VIRTUAL_ENV")
    if active:
        return Path(os.path.abspath(active)) / "bin" / "python"
    raise UsageError("which environment? pass --python PATH (e.g. --python /usr/bin/python3) or --venv DIR")


def execute(args: argparse.Namespace) -> int:
    from compatlab.proc import signals_interrupt

    # As a matrix cell: SIGTERM and SIGHUP unwind like Ctrl-C, so the running pytest's process group is
    # killed and waited for (and with its end the fork server's), never left running after check is gone.
    with signals_interrupt():
        return _execute(args)


def _execute(args: argparse.Namespace) -> int:
    from compatlab.config.pins import parse_pins
    from compatlab.config.serve import load_serve
    from compatlab.config.thresholds import parse_threshold_args, suite_thresholds
    from compatlab.errors import UsageError
    from compatlab.existing import count_gpus, inspect_environment
    from compatlab.incell.cudacompat import parse_driver

    check_targets(args.target)
    if args.min_driver is not None:
        try:
            parse_driver(args.min_driver)
        except ValueError as exc:
            raise UsageError(f"--min-driver {args.min_driver}: {exc}; e.g. --min-driver 580.65") from None
    pins = parse_pins(args.pin, args.constraints)
    serve = load_serve(Path(args.serve_from)) if args.serve_from is not None else None
    thresholds = (
        suite_thresholds(parse_threshold_args(args.threshold), source="--threshold") if args.threshold else None
    )
    env = inspect_environment(_python(args))
    gpus = count_gpus()
    kind = "venv" if env.is_venv else "not a venv"
    print(
        f"check {env.python} ({kind}, Python {env.version}, {env.site}): {len(env.native)} distributions with "
        f"native code; {gpus} GPU(s)",
        flush=True,
    )

    request = ExistingRequest(
        packages=tuple(args.package),
        pins=pins,
        archs=tuple(args.target),
        min_driver=args.min_driver,
        nccl=args.nccl,
        gpus=gpus,
        only=tuple(args.stage),
        serve=serve,
        thresholds=thresholds,
    )
    out = Path(args.out).absolute()  # resolved once, where the user ran the command
    done = run_check(env, request, out=out, reporter=CheckReporter(quiet=args.quiet))
    result, rows = done.result, done.packages
    shown = [r for r in rows if r.state != StageState.PASS]
    if shown:
        print(f"packages ({len(rows)} checked, {len(shown)} not clean):")
        for row in shown:
            print(f"  {row.state} {row.name} {row.version}:")
            for msg in row.messages:
                print(f"    {msg}")
    why = f" — {result.reason}" if result.reason else ""
    print(f"verdict {result.id}: {result.state} in {result.seconds:.1f} s{why}")
    print(f"reports: {out / 'index.html'}, {out / 'packages.md'}")
    return 1 if result.state in (CellState.FAIL, CellState.ERROR) else 0
