"""Render a run's results.json into an HTML grid, a Markdown table and a change summary; publish them.

Renderers only read results: nothing here installs, imports or runs a cell.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from ..errors import ConfigError, LabError
from ._grid import Run, load
from .history import Change, diff_runs, load_runs
from .markdown import compat_md_diff, render_markdown
from .publish import publish, write_run

__all__ = [
    "Change",
    "Run",
    "compat_md_diff",
    "diff_runs",
    "load",
    "load_runs",
    "main",
    "publish",
    "render_markdown",
    "render_run",
]

log = logging.getLogger(__name__)

DEFAULT_RESULTS = Path("reports/latest/results.json")
DEFAULT_RUNS = Path("reports/runs")


def render_run(results_path: Path, out_dir: Path, *, history_dir: Path | None) -> list[Path]:
    """Render *results_path* into *out_dir*: index.html, compat.md, results.json (a copy).

    With *history_dir* (``reports/runs``), the page marks what changed since the previous run (by start
    time), draws perf sparklines over recent runs, and changes.md is written too. Returns the paths
    written. Raises ConfigError naming the file when the results cannot be read.
    """
    run = load(results_path)
    history: list[Run] = []
    if history_dir is not None:
        if not history_dir.is_dir():
            raise ConfigError(str(history_dir), ["history: not a directory of runs (<run-id>/results.json)"])
        history = load_runs(history_dir)
    return write_run(run, results_path, out_dir, history)


def _default_history(results: Path) -> Path | None:
    """``reports/runs`` next to ``reports/latest/`` (or the runs folder a run already sits in)."""
    parent = results.resolve().parent.parent
    if parent.name == "runs" and parent.is_dir():
        return parent
    candidate = parent / "runs"
    return candidate if candidate.is_dir() else None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="compatlab", description="Render and publish compatlab results.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    report = sub.add_parser("report", help="render a run's results.json into HTML and Markdown")
    report.add_argument("results", nargs="?", type=Path, default=DEFAULT_RESULTS,
                        help=f"the run's results.json (default: {DEFAULT_RESULTS})")
    report.add_argument("--out", type=Path, help="output folder (default: the folder of the results file)")
    report.add_argument("--history", type=Path,
                        help="folder of earlier runs, <run-id>/results.json (default: reports/runs if present)")
    report.add_argument("--no-history", action="store_true", help="do not compare with earlier runs")
    report.add_argument("--step-summary", action="store_true",
                        help="append the change summary (or the table) to $GITHUB_STEP_SUMMARY")
    pub = sub.add_parser("publish", help="write every run and the latest grid into a static site folder")
    pub.add_argument("--site", type=Path, required=True, help="site folder, e.g. a gh-pages checkout")
    pub.add_argument("--runs", type=Path, default=DEFAULT_RUNS, help=f"runs folder (default: {DEFAULT_RUNS})")
    return parser


def main(argv: list[str] | None = None) -> int:
    """``report [PATH] [--out DIR] [--history DIR]`` and ``publish --site DIR [--runs DIR]``."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:  # argparse has printed its usage message
        return exc.code if isinstance(exc.code, int) else 2
    try:
        if args.command == "publish":
            publish(args.site, args.runs)
            print(f"published {args.runs} to {args.site / 'index.html'}")
            return 0
        results: Path = args.results
        out: Path = args.out if args.out is not None else results.parent
        history = None if args.no_history else (args.history or _default_history(results))
        written = render_run(results, out, history_dir=history)
        for path in written:
            print(path)
        if args.step_summary and os.environ.get("GITHUB_STEP_SUMMARY"):
            text = next((p for p in written if p.name == "changes.md"), written[1]).read_text(encoding="utf-8")
            with open(os.environ["GITHUB_STEP_SUMMARY"], "a", encoding="utf-8") as fh:
                fh.write(text + "\n")
    except LabError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:  # writing the output: a full disk, a read-only folder
        print(f"error: {exc.filename or ''}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    return 0
