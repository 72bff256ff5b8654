"""`compatlab <verb>`: the one entry point, and the one place errors become messages and exit codes.

As auditwheel's main.py wires its main_*.py: each module here adds its verbs (``configure_parser``) with
a function that returns the exit status; library code never prints an error or exits.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from compatlab.cli import check, lock, matrix, rehearse, runs, stages
from compatlab.errors import LabError, UsageError

__all__ = ["main"]

VERBS = (matrix, lock, runs, stages, check, rehearse)
# Verbs that went, and what to run instead.
GONE = {
    "runtime": "`compatlab runtime` is gone: `compatlab check` runs the same stages on an existing environment, "
    "e.g. compatlab check --venv DIR --stage import --stage cuda --target sm_90 --threshold jit-timeout=900 "
    "--out reports/adhoc",
}


class _Parser(argparse.ArgumentParser):
    """Bad usage is a UsageError (exit 2, one line), handled below like every other error."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see --help)")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="compatlab", description="torch × sgl-kernel × flashinfer × CUDA lab")
    p.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    sub: Any = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for verbs in VERBS:
        verbs.configure_parser(sub)
    for name, parser in sub.choices.items():
        parser.prog = f"compatlab {name}"
        # `--debug` after the verb as well as before it
        parser.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args_list
    logging.basicConfig(level=logging.DEBUG if debug else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        verb = next((a for a in args_list if not a.startswith("-")), None)
        if verb in GONE:
            raise UsageError(GONE[verb])
        args = _parser().parse_args(args_list)
        result: int = args.func(args)
        return result
    except LabError as exc:
        if debug:
            raise
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except BrokenPipeError:
        # `compatlab cells | head`: the reader left; that is not an error of ours.
        sys.stderr.close()
        return 0
    except OSError as exc:  # writing output: a full disk, a read-only folder
        if debug:
            raise
        from compatlab.errors import UNWRITABLE, Unwritable

        if exc.filename and exc.errno in UNWRITABLE:
            fix = "make it writable, or choose another folder (--debug shows where the lab was writing it)"
            print(f"error: {Unwritable(exc.filename, exc.strerror or str(exc), fix)}", file=sys.stderr)
        else:
            print(f"error: {exc.filename or ''}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as exc:
        from compatlab.proc import Terminated

        if isinstance(exc, Terminated):
            print(f"error: {exc}: stopped; finished cells are kept under reports/runs/", file=sys.stderr)
            return 128 + exc.signum
        print("error: interrupted; finished cells are kept under reports/runs/", file=sys.stderr)
        return 130
