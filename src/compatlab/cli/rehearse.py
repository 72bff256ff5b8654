"""``compatlab rehearse``: an install applied to a copy of an environment, both judged by ``check``'s stages.

Exit status: 0 when nothing that works now breaks, 1 when something does (or the install fails, or the lab
could not judge), 2 on bad usage.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from compatlab import runner
from compatlab.cli import options

__all__ = ["DEFAULT_OUT", "configure_parser", "execute"]

DEFAULT_OUT = "reports/rehearse"


def configure_parser(sub: Any) -> argparse.ArgumentParser:
    """Add the ``rehearse`` verb to the subparsers *sub* of the ``compatlab`` parser."""
    s: argparse.ArgumentParser = sub.add_parser(
        "rehearse",
        help="an install tried on a copy of an environment: what it swaps, what it breaks, what to run instead",
        description="Apply `uv pip install ARGS` to a copy of a virtual environment that shares its files, judge "
        "both with check's stages, and say what the install changes, what worked and breaks, and a safer command "
        "tried on its own copy. The environment itself is never written.",
        epilog="e.g. compatlab rehearse --venv /opt/serve/.venv -- -U flashinfer-python",
    )
    s.add_argument("--venv", type=Path, help="the virtual environment folder (default: $VIRTUAL_ENV)")
    s.add_argument(
        "--requirements",
        action="append",
        default=[],
        type=Path,
        metavar="FILE",
        help="install this requirements file (repeatable; passed to uv as -r FILE)",
    )
    s.add_argument(
        "--package",
        action="append",
        default=[],
        metavar="NAME",
        help="judge only this distribution (repeatable); default: every one, as check does",
    )
    options.add_targets(s)
    options.add_stages(s, runner.existing_stage_names(nccl=False), help="judge with only this stage")
    s.add_argument("--copies", type=Path, metavar="DIR", help="where the copies go (default: OUT/copies)")
    s.add_argument("--keep", action="store_true", help="keep the copies after the rehearsal")
    s.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    s.add_argument("--out", type=Path, default=Path(DEFAULT_OUT), help=f"report folder (default: {DEFAULT_OUT})")
    s.add_argument("install", nargs="*", metavar="-- ARGS", help="the arguments of `uv pip install`, after --")
    s.set_defaults(func=execute)
    return s


def _venv(args: argparse.Namespace) -> Path:
    from compatlab.errors import UsageError

    given = args.venv if args.venv is not None else os.environ.get("VIRTUAL_ENV")
    if not given:
        raise UsageError("which environment? pass --venv DIR (a virtual environment's folder)")
    venv = Path(os.path.abspath(given))
    if not (venv / "bin" / "python").exists() or not (venv / "pyvenv.cfg").is_file():
        raise UsageError(
            f"--venv {venv}: no bin/python and pyvenv.cfg there; rehearse copies a virtual environment "
            "(`compatlab check --python PATH` judges any other interpreter as it is)"
        )
    return venv


def execute(args: argparse.Namespace) -> int:
    from compatlab.proc import signals_interrupt

    with signals_interrupt():
        return _execute(args)


def _execute(args: argparse.Namespace) -> int:
    from compatlab.cli.options import check_targets
    from compatlab.errors import UsageError
    from compatlab.existing import count_gpus, inspect_environment
    from compatlab.rehearse import parse_request, rehearse
    from compatlab.render.rehearsal import rehearsal_lines
    from compatlab.runs.rehearsal import Outcome

    check_targets(args.target)
    request = parse_request(args.install, requirements=[Path(os.path.abspath(f)) for f in args.requirements])
    venv = _venv(args)
    env = inspect_environment(venv / "bin" / "python")
    if not env.is_venv:
        raise UsageError(
            f"--venv {venv}: its interpreter is not a virtual environment's (sys.prefix is sys.base_prefix)"
        )
    out = Path(args.out).absolute()
    copies = Path(args.copies).absolute() if args.copies is not None else out / "copies"
    if copies == env.prefix or copies.is_relative_to(env.prefix):
        raise UsageError(f"--copies {copies}: inside the environment itself; pick a folder outside {env.prefix}")

    def say(line: str) -> None:
        if not args.quiet:
            print(f"    {line}", file=sys.stderr, flush=True)

    done = rehearse(
        env,
        request,
        out=out,
        copies=copies,
        keep=args.keep,
        say=say,
        judged=runner.ExistingRequest(
            packages=tuple(args.package), archs=tuple(args.target), gpus=count_gpus(), only=tuple(args.stage)
        ),
    )
    for line in rehearsal_lines(done):
        print(line)
    print(f"reports: {out / 'rehearsal.md'}, {out / 'index.html'}, {out / 'rehearsal.json'}")
    return 0 if done.outcome == Outcome.SAFE else 1
