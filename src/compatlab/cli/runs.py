"""Verbs over results: `summary`, `merge`, `prune`, `report` and `publish` (through runs/ and render/)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from compatlab.cli.options import add_matrix, matrix_path
from compatlab.config import limits
from compatlab.errors import LabError
from compatlab.runs import store
from compatlab.runs.model import CellState

if TYPE_CHECKING:
    from compatlab.runs.model import Results

__all__ = ["configure_parser", "summary_table"]

DEFAULT_RESULTS, DEFAULT_RUNS = store.DEFAULT_RESULTS, store.DEFAULT_RUNS


def summary_table(results: Results) -> tuple[str, int]:
    """A plain-text table of a run and the number of unexpected verdicts (unreadable results included)."""
    seen = {c.id for c in results.cells}
    rows = [("cell", "state", "seconds", "reason")]
    unexpected = 0
    not_applicable: dict[str, list[str]] = {}  # reason -> cells: the matrix's rules, one line each
    for c in results.cells:
        if c.state == CellState.NA:
            not_applicable.setdefault(c.reason, []).append(c.id)
            continue
        state = c.state + (" (known)" if c.expected else "") + (" !" if c.unexpected or c.unreadable else "")
        unexpected += bool(c.unexpected or c.unreadable)
        rows.append((c.id, state, f"{c.seconds:.1f}", c.reason[:100]))
    for reason, ids in not_applicable.items():
        rows.append((ids[0] if len(ids) == 1 else f"{len(ids)} cells", "n/a", "", reason[:100]))
    for cid in results.run.planned:
        if cid not in seen:
            rows.append((cid, "not run", "", "no result for this cell (interrupted or not selected)"))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = ["  ".join(r[i].ljust(widths[i]) for i in range(3)) + "  " + r[3] for r in rows]
    counts: dict[str, int] = {}
    for c in results.cells:
        counts[c.state] = counts.get(c.state, 0) + 1
    lines.append("")
    unreadable = len(results.unreadable)
    lines.append(
        "totals: "
        + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
        + f"; unexpected {unexpected}"
        + (f"; unreadable {unreadable}" if unreadable else "")
    )
    return "\n".join(lines), unexpected


def _cmd_summary(args: argparse.Namespace) -> int:
    from compatlab.runs.store import load_results

    results = load_results(Path(args.results))
    text, unexpected = summary_table(results)
    print(text)
    summary_file = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary_file and args.github_summary:
        with open(summary_file, "a", encoding="utf-8") as fh:
            fh.write("```\n" + text + "\n```\n")
    for c in results.unreadable:
        print(f"error: {c.reason}", file=sys.stderr)
    return 1 if unexpected else 0


def _cmd_merge(args: argparse.Namespace) -> int:
    from compatlab.cells import planned
    from compatlab.config.matrix import load_matrix
    from compatlab.runs.merge import merge_runs

    dirs = [Path(d) for d in args.shard_dirs]
    out = Path(args.out)
    results = merge_runs(
        planned(load_matrix(matrix_path(args))),
        dirs,
        out,
        run_id=args.run_id or out.name,
        prefer=[Path(p) for p in args.prefer],
        latest=Path(args.latest) if args.latest else None,
    )
    missing = sum(1 for c in results.cells if c.reason.startswith("missing:"))
    unreadable = results.unreadable
    print(
        f"merged {len(dirs)} shard(s) into {out / 'results.json'}: {len(results.cells)} cells, {missing} missing"
        + (f", {len(unreadable)} unreadable" if unreadable else "")
    )
    for c in unreadable:
        print(f"error: {c.reason}", file=sys.stderr)
    return 1 if missing or unreadable else 0


def _cmd_prune(args: argparse.Namespace) -> int:
    from compatlab.runs.prune import prune_runs

    limits.check("--keep", args.keep)
    for path in prune_runs(Path(args.runs), args.keep):
        print(f"removed {path}")
    return 0


def _default_history(results: Path) -> Path | None:
    """``reports/runs`` next to ``reports/latest/`` (or the runs folder a run already sits in)."""
    parent = results.resolve().parent.parent
    if parent.name == "runs" and parent.is_dir():
        return parent
    candidate = parent / "runs"
    return candidate if candidate.is_dir() else None


def _cmd_report(args: argparse.Namespace) -> int:
    from compatlab.render import load, render_run

    results: Path = args.results
    out: Path = args.out if args.out is not None else results.parent
    history = None if args.no_history else (args.history or _default_history(results))
    try:
        news = args.news.read_text(encoding="utf-8") if args.news is not None else ""
        written = render_run(results, out, history_dir=history, news=news)
    except store.StaleRun as exc:
        # Two runs at once: the newer one's grid stays; this is not a failure of the older run.
        print(f"note: {exc}", file=sys.stderr)
        return 0
    for path in written:
        print(path)
    unreadable = load(results).unreadable
    if unreadable:
        raise LabError(
            f"{results}: {len(unreadable)} cell result(s) could not be read, shown as errors: "
            + "; ".join(c.reason for c in unreadable)
        )
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if args.github_summary and summary:
        text = next((p for p in written if p.name == "changes.md"), written[1]).read_text(encoding="utf-8")
        with open(summary, "a", encoding="utf-8") as fh:
            fh.write(text + "\n")
    return 0


def _cmd_publish(args: argparse.Namespace) -> int:
    from compatlab.render import publish

    try:
        publish(args.site, args.runs)
    except store.StaleRun as exc:
        print(f"note: {exc}", file=sys.stderr)
        return 0
    print(args.site / "index.html")
    return 0


def configure_parser(sub: Any) -> None:
    s = sub.add_parser("summary", help="print a run's table; exit 1 when a verdict is unexpected")
    s.add_argument("results", nargs="?", default=str(DEFAULT_RESULTS))
    s.add_argument("--github-summary", action="store_true", help="also append to $GITHUB_STEP_SUMMARY")
    s.set_defaults(func=_cmd_summary)

    s = sub.add_parser("merge", help="combine shard runs into one run; missing cells show as errors")
    s.add_argument("shard_dirs", nargs="+", help="reports/runs/<run-id> folders of the shards")
    add_matrix(s)
    s.add_argument("--out", required=True, help="the merged run folder")
    s.add_argument("--run-id")
    s.add_argument("--latest", help="also show the merged run here, unless it shows a newer run")
    s.add_argument(
        "--prefer",
        action="append",
        default=[],
        metavar="DIR",
        help="when shards disagree on a cell, this shard's result wins (repeat: first wins)",
    )
    s.set_defaults(func=_cmd_merge)

    s = sub.add_parser("prune", help="keep only the newest N runs")
    s.add_argument("--runs", default=str(DEFAULT_RUNS))
    s.add_argument("--keep", type=int, required=True)
    s.set_defaults(func=_cmd_prune)

    s = sub.add_parser(
        "report",
        help="render a results.json as HTML, Markdown and JSON",
        description="Render a run's results.json as HTML, Markdown and JSON.",
    )
    s.add_argument(
        "results",
        nargs="?",
        type=Path,
        default=DEFAULT_RESULTS,
        help=f"the run's results.json (default: {DEFAULT_RESULTS})",
    )
    s.add_argument("--out", type=Path, help="output folder (default: the folder of the results file)")
    s.add_argument(
        "--history", type=Path, help="folder of earlier runs, <run-id>/results.json (default: ../runs if present)"
    )
    s.add_argument("--no-history", action="store_true", help="do not compare with earlier runs")
    s.add_argument(
        "--news",
        type=Path,
        metavar="FILE",
        help="Markdown that leads changes.md: the news of `compatlab lock --news FILE`",
    )
    s.add_argument(
        "--github-summary",
        action="store_true",
        help="also append the change summary (or, for a first run, the table) to $GITHUB_STEP_SUMMARY",
    )
    s.set_defaults(func=_cmd_report)

    s = sub.add_parser(
        "publish",
        help="write the grid and a run index for static hosting",
        description="Write every run and the latest grid into a static-hosting folder.",
    )
    s.add_argument("--site", type=Path, required=True, help="site folder, e.g. a gh-pages checkout")
    s.add_argument("--runs", type=Path, default=DEFAULT_RUNS, help=f"runs folder (default: {DEFAULT_RUNS})")
    s.set_defaults(func=_cmd_publish)
