"""`python -m compatlab`: the entry point. Only here are errors turned into messages and exit codes."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from compatlab.errors import LabError, UsageError

if TYPE_CHECKING:
    from compatlab.runs.model import Results

__all__ = ["main"]

DEFAULT_MATRIX = "matrix.toml"


def _matrix_path(args: argparse.Namespace) -> str:
    return str(args.matrix or os.environ.get("COMPATLAB_MATRIX") or DEFAULT_MATRIX)


def _cmd_validate(args: argparse.Namespace) -> int:
    from compatlab.cells import expand
    from compatlab.config.matrix import load_matrix

    matrix = load_matrix(_matrix_path(args))
    cells = expand(matrix)
    active = [c for c in cells if c.na is None]
    print(f"{matrix.path}: ok — {len(cells)} cells, {len(active)} to run, {len(cells) - len(active)} n/a")
    return 0


def _cmd_cells(args: argparse.Namespace) -> int:
    from compatlab.cells import expand
    from compatlab.config.matrix import load_matrix

    matrix = load_matrix(_matrix_path(args))
    cells = expand(matrix)
    if args.shard:
        from compatlab.shard import parse_shard, shard_cells

        cells = shard_cells(cells, *parse_shard(args.shard))
    if args.json:
        print(json.dumps([{"id": c.id, "axes": c.axes, "na": c.na, "expect": c.expect} for c in cells], indent=2))
        return 0
    for c in cells:
        tag = f"  n/a: {c.na}" if c.na else ("  expect fail: " + c.expect_reason if c.expect else "")
        print(f"{c.id}{tag}")
    return 0


def _fmt_line(result: object) -> str:
    from compatlab.runs.model import CellResult

    assert isinstance(result, CellResult)
    verdict = result.state.upper()
    if result.expected:
        verdict += " (known)" if result.state == "fail" else " (expected fail!)"
    elif result.unexpected:
        verdict += " (unexpected)"
    why = f" — {result.reason}" if result.reason else ""
    return f"[compatlab] end   {result.id}: {verdict} in {result.seconds:.1f} s{why}"


def _cmd_cell(args: argparse.Namespace) -> int:
    from compatlab.config.matrix import load_matrix
    from compatlab.runner import find_cell, run_cell
    from compatlab.runs import store

    matrix = load_matrix(_matrix_path(args))
    cell = find_cell(matrix, args.cell)
    run_dir = Path(args.run_dir)
    latest = Path(args.latest) if args.latest else None
    # Under nox the session owns the run and hands down --owner; by hand, this process owns it.
    run = (store.join_run(run_dir, owner=args.owner) if args.owner
           else store.claim_run(run_dir, run_id=args.run_id or run_dir.name, matrix=matrix))
    with run:
        if not run.results_path.exists():
            # The run exists (host facts, start time, planned cells) before its first cell ends or crashes.
            run.aggregate(matrix, latest=latest)
        print(f"[compatlab] start {cell.id}", flush=True)
        from compatlab.proc import signals_interrupt

        with signals_interrupt():
            if args.gpu8:
                from compatlab.runner import GPU8, run_more_stages

                result = run_more_stages(matrix, cell, run=run, venv_root=Path(args.venvs), stages=GPU8)
            else:
                result = run_cell(matrix, cell, run=run, venv_root=Path(args.venvs))
        run.aggregate(matrix, latest=latest)
    print(_fmt_line(result), flush=True)
    return 1 if result.unexpected else 0


def summary_table(results: Results) -> tuple[str, int]:
    """A plain-text table of a run and the number of unexpected verdicts (unreadable results included)."""
    seen = {c.id for c in results.cells}
    rows = [("cell", "state", "seconds", "reason")]
    unexpected = 0
    for c in results.cells:
        state = c.state + (" (known)" if c.expected else "") + (" !" if c.unexpected or c.unreadable else "")
        unexpected += bool(c.unexpected or c.unreadable)
        rows.append((c.id, state, f"{c.seconds:.1f}", c.reason[:100]))
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
    lines.append("totals: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
                 + f"; unexpected {unexpected}" + (f"; unreadable {unreadable}" if unreadable else ""))
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


def _cmd_ci_matrix(args: argparse.Namespace) -> int:
    from compatlab.config.matrix import load_matrix
    from compatlab.shard import ci_matrix

    if args.shards is not None and args.shards < 1:
        raise UsageError(f"--shards: expected a positive number, got {args.shards}")
    print(json.dumps(ci_matrix(load_matrix(_matrix_path(args)), shards=args.shards), separators=(",", ":")))
    return 0


def _cmd_merge(args: argparse.Namespace) -> int:
    from compatlab.config.matrix import load_matrix
    from compatlab.runs.store import merge_runs

    dirs = [Path(d) for d in args.shard_dirs]
    out = Path(args.out)
    results = merge_runs(load_matrix(_matrix_path(args)), dirs, out, run_id=args.run_id or out.name,
                         prefer=[Path(p) for p in args.prefer], latest=Path(args.latest) if args.latest else None)
    missing = sum(1 for c in results.cells if c.reason.startswith("missing:"))
    unreadable = results.unreadable
    print(f"merged {len(dirs)} shard(s) into {out / 'results.json'}: {len(results.cells)} cells, {missing} missing"
          + (f", {len(unreadable)} unreadable" if unreadable else ""))
    for c in unreadable:
        print(f"error: {c.reason}", file=sys.stderr)
    return 1 if missing or unreadable else 0


def _cmd_prune(args: argparse.Namespace) -> int:
    from compatlab.runs.store import prune_runs

    for path in prune_runs(Path(args.runs), args.keep):
        print(f"removed {path}")
    return 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="compatlab", description="torch × sgl-kernel × flashinfer × CUDA lab")
    p.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("validate", help="check matrix.toml and count its cells")
    s.add_argument("--matrix", help="matrix file (default: $COMPATLAB_MATRIX or ./matrix.toml)")
    s.set_defaults(func=_cmd_validate)
    __import__("compatlab.cli.lock", fromlist=["configure_parser"]).configure_parser(sub)

    s = sub.add_parser("cells", help="list the cells of a matrix")
    s.add_argument("--matrix")
    s.add_argument("--json", action="store_true")
    s.add_argument("--shard", help="only shard i of n, e.g. 2/4 (deterministic, balanced)")
    s.set_defaults(func=_cmd_cells)

    s = sub.add_parser("ci-matrix", help="JSON for a CI matrix strategy (fromJson): per cell, or per shard")
    s.add_argument("--matrix")
    s.add_argument("--shards", type=int, help="one job per shard instead of one per cell")
    s.set_defaults(func=_cmd_ci_matrix)

    s = sub.add_parser("merge", help="combine shard runs into one run; missing cells show as errors")
    s.add_argument("shard_dirs", nargs="+", help="reports/runs/<run-id> folders of the shards")
    s.add_argument("--matrix")
    s.add_argument("--out", required=True, help="the merged run folder")
    s.add_argument("--run-id")
    s.add_argument("--latest", help="also show the merged run here, unless it shows a newer run")
    s.add_argument("--prefer", action="append", default=[], metavar="DIR",
                   help="when shards disagree on a cell, this shard's result wins (repeat: first wins)")
    s.set_defaults(func=_cmd_merge)

    s = sub.add_parser("prune", help="keep only the newest N runs")
    s.add_argument("--runs", default="reports/runs")
    s.add_argument("--keep", type=int, required=True)
    s.set_defaults(func=_cmd_prune)

    s = sub.add_parser("cell", help="run one cell")
    s.add_argument("cell")
    s.add_argument("--matrix")
    s.add_argument("--run-dir", required=True)
    s.add_argument("--run-id")
    s.add_argument("--latest", help="folder whose results.json mirrors the run (unless it shows a newer run)")
    s.add_argument("--owner", help="the run's owner, as the process that claimed the run hands it down")
    s.add_argument("--venvs", default=".compatlab/venvs", help="where cell venvs live")
    s.add_argument("--gpu8", action="store_true", help="add the 8-GPU stages (nccl, perf) to this run's result")
    s.set_defaults(func=_cmd_cell)

    s = sub.add_parser("summary", help="print a run's table; exit 1 when a verdict is unexpected")
    s.add_argument("results", nargs="?", default="reports/latest/results.json")
    s.add_argument("--github-summary", action="store_true", help="also append to $GITHUB_STEP_SUMMARY")
    s.set_defaults(func=_cmd_summary)

    # Listed for --help only: main() hands these commands their whole command line before parsing.
    for name, text in (
        ("static", "static checks of any site-packages (see `compatlab static --help`)"),
        ("runtime", "the import and cuda stages on an existing venv"),
        ("nccl", "the NCCL suite with this interpreter's torch"),
        ("perf", "EAGLE-3 against its baseline, outside a cell"),
        ("report", "render a results.json as HTML, Markdown and JSON"),
        ("publish", "write the grid and a run index for static hosting"),
    ):
        sub.add_parser(name, help=text, add_help=False)
    return p


_DELEGATED = {
    "static": "compatlab.stages.static.stage",
    "runtime": "compatlab.stages.runtime",
    "nccl": "compatlab.stages.nccl.stage",
    "perf": "compatlab.stages.perf.stage",
    "report": "compatlab.render",
    "publish": "compatlab.render.publish",
}


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] == ["--debug"] and args_list[1:2] and args_list[1] in _DELEGATED:
        logging.basicConfig(level=logging.DEBUG, format="%(levelname)s %(name)s: %(message)s")
        args_list = args_list[1:]
    if args_list and args_list[0] in _DELEGATED:
        # These commands own their whole command line (argparse.REMAINDER will not take '--site' first).
        import importlib

        mod = importlib.import_module(_DELEGATED[args_list[0]])
        code: int = mod.main(args_list[1:])
        return code
    parser = _parser()
    args = parser.parse_args(args_list)
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        result: int = args.func(args)
        return result
    except LabError as exc:
        if args.debug:
            raise
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except BrokenPipeError:
        # `compatlab cells | head`: the reader left; that is not an error of ours.
        sys.stderr.close()
        return 0
    except KeyboardInterrupt as exc:
        from compatlab.proc import Terminated

        if isinstance(exc, Terminated):
            print(f"error: {exc}: stopped; finished cells are kept under reports/runs/", file=sys.stderr)
            return 128 + exc.signum
        print("error: interrupted; finished cells are kept under reports/runs/", file=sys.stderr)
        return 130

