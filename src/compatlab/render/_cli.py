"""``compatlab report`` and ``compatlab publish``: render_run and the two command lines."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

from compatlab.errors import ConfigError, LabError
from compatlab.render._grid import Run, load
from compatlab.render.history import load_runs
from compatlab.render.publish import publish, write_run
from compatlab.runs.store import StaleRun

__all__ = ["main", "publish_main", "render_run"]

DEFAULT_RESULTS = Path("reports/latest/results.json")
DEFAULT_RUNS = Path("reports/runs")


def render_run(results_path: Path, out_dir: Path, *, history_dir: Path | None, news: str = "") -> list[Path]:
    """Render *results_path* into *out_dir*: index.html, compat.md, results.json (a copy).

    With *history_dir* (``reports/runs``), the page marks what changed since the previous run (by start
    time), draws perf sparklines over recent runs, and changes.md is written too. *news* (Markdown, as
    ``compatlab lock --news`` writes it: the upstream releases new since the previous lock) leads
    changes.md, which is then written even for a first run. Returns the paths
    written. Raises ConfigError naming the file when the results cannot be read.
    """
    run = load(results_path)
    history: list[Run] = []
    if history_dir is not None:
        if not history_dir.is_dir():
            raise ConfigError(str(history_dir), ["history: not a directory of runs (<run-id>/results.json)"])
        history = load_runs(history_dir)
    return write_run(run, out_dir, history, news=news)


def _default_history(results: Path) -> Path | None:
    """``reports/runs`` next to ``reports/latest/`` (or the runs folder a run already sits in)."""
    parent = results.resolve().parent.parent
    if parent.name == "runs" and parent.is_dir():
        return parent
    candidate = parent / "runs"
    return candidate if candidate.is_dir() else None


def _report_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="compatlab report", description="Render a run's results.json as HTML, Markdown and JSON."
    )
    p.add_argument(
        "results",
        nargs="?",
        type=Path,
        default=DEFAULT_RESULTS,
        help=f"the run's results.json (default: {DEFAULT_RESULTS})",
    )
    p.add_argument("--out", type=Path, help="output folder (default: the folder of the results file)")
    p.add_argument(
        "--history",
        type=Path,
        help="folder of earlier runs, <run-id>/results.json (default: ../runs if present)",
    )
    p.add_argument("--no-history", action="store_true", help="do not compare with earlier runs")
    p.add_argument("--news", type=Path, metavar="FILE",
                   help="Markdown that leads changes.md: the news of `compatlab lock --news FILE`")
    p.add_argument(
        "--github-summary",
        action="store_true",
        help="also append the change summary (or, for a first run, the table) to $GITHUB_STEP_SUMMARY",
    )
    return p


def _publish_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="compatlab publish",
        description="Write every run and the latest grid into a static-hosting folder.",
    )
    p.add_argument("--site", type=Path, required=True, help="site folder, e.g. a gh-pages checkout")
    p.add_argument("--runs", type=Path, default=DEFAULT_RUNS, help=f"runs folder (default: {DEFAULT_RUNS})")
    return p


def _guarded(
    parser: argparse.ArgumentParser, argv: list[str], body: Callable[[argparse.Namespace], None]
) -> int:
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse has printed usage or help
        return exc.code if isinstance(exc.code, int) else 2
    try:
        body(args)
    except LabError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:  # writing the output: a full disk, a read-only folder
        print(f"error: {exc.filename or ''}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    return 0


def _report(args: argparse.Namespace) -> None:
    results: Path = args.results
    out: Path = args.out if args.out is not None else results.parent
    history = None if args.no_history else (args.history or _default_history(results))
    try:
        news = args.news.read_text(encoding="utf-8") if args.news is not None else ""
        written = render_run(results, out, history_dir=history, news=news)
    except StaleRun as exc:
        # Two runs at once: the newer one's grid stays; this is not a failure of the older run.
        print(f"note: {exc}", file=sys.stderr)
        return
    for path in written:
        print(path)
    unreadable = load(results).results.unreadable
    if unreadable:
        raise LabError(f"{results}: {len(unreadable)} cell result(s) could not be read, shown as errors: "
                       + "; ".join(c.reason for c in unreadable))
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if args.github_summary and summary:
        text = next((p for p in written if p.name == "changes.md"), written[1]).read_text(encoding="utf-8")
        with open(summary, "a", encoding="utf-8") as fh:
            fh.write(text + "\n")


def _publish(args: argparse.Namespace) -> None:
    try:
        publish(args.site, args.runs)
    except StaleRun as exc:
        print(f"note: {exc}", file=sys.stderr)
        return
    print(args.site / "index.html")


def publish_main(argv: list[str] | None = None) -> int:
    """``publish --site DIR [--runs DIR]`` (the word ``publish`` itself may lead or not)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["publish"]:
        args = args[1:]
    return _guarded(_publish_parser(), args, _publish)


def main(argv: list[str] | None = None) -> int:
    """``[report] [PATH] [--out DIR] [--history DIR]``, or ``publish --site DIR [--runs DIR]``.

    Returns the exit code: 0, 2 for bad input (``error: FILE: …`` on stderr), 1 when writing fails.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["publish"]:
        return publish_main(args[1:])
    if args[:1] == ["report"]:
        args = args[1:]
    return _guarded(_report_parser(), args, _report)
