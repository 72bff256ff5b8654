"""Verbs over a matrix: `validate`, `cells`, `ci-matrix`, and `cell` (one cell through the pipeline)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING, Any

from compatlab.cli.options import add_matrix, matrix_path
from compatlab.config import limits
from compatlab.errors import UsageError
from compatlab.runs import store
from compatlab.runs.model import CellState, StageState

if TYPE_CHECKING:
    from compatlab.config.matrix import Matrix
    from compatlab.runs.model import StageResult

__all__ = ["CellReporter", "configure_parser", "end_line"]


def _cmd_validate(args: argparse.Namespace) -> int:
    from compatlab.cells import expand
    from compatlab.config.matrix import load_matrix

    matrix = load_matrix(matrix_path(args))
    cells = expand(matrix)
    active = [c for c in cells if c.na is None]
    for note in matrix.notes:
        print(f"note: {note}", file=sys.stderr)
    print(f"{matrix.path}: ok — {len(cells)} cells, {len(active)} to run, {len(cells) - len(active)} n/a")
    return 0


def _cmd_cells(args: argparse.Namespace) -> int:
    from compatlab.cells import expand
    from compatlab.config.matrix import load_matrix

    matrix = load_matrix(matrix_path(args))
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


def end_line(result: object) -> str:
    from compatlab.runs.model import CellResult

    assert isinstance(result, CellResult)
    verdict = result.state.upper()
    if result.expected and result.state == CellState.FAIL:
        verdict += " (known)"
    elif result.expected and result.preflight and result.state == CellState.PARTIAL:
        verdict += " (known bad; this preflight did not reach the stage that fails)"
    elif result.expected:
        verdict += " (expected fail!)"
    elif result.unexpected:
        verdict += " (unexpected)"
    why = f" — {result.reason}" if result.reason else ""
    # What the cell spent outside its stages: taking its venv, setting older ones aside, waiting for their removal.
    outside = max(0.0, result.seconds - sum(s.seconds for s in result.stages))
    took = f"{result.seconds:.1f} s" + (f" ({outside:.1f} s outside stages)" if result.state != CellState.NA else "")
    return f"[compatlab] end   {result.id}: {verdict} in {took}{why}"


_REASON_CHARS = 160


def short_reason(reason: str, whole_at: Path | None = None) -> str:
    """*reason* for one progress line: whole when short, else cut at a word with where the whole text is."""
    if len(reason) <= _REASON_CHARS:
        return reason
    cut = reason[:_REASON_CHARS].rsplit(" ", 1)[0].rstrip(",;:")
    return f"{cut} … (whole reason: {whole_at})" if whole_at is not None else f"{cut} …"


@dataclasses.dataclass(slots=True)
class CellReporter:
    """``compatlab cell``'s face, on stderr (stdout stays for results and JSON): a line per finished stage, one
    line for the stages a failure blocks, and the long stages' notes; nothing but the verdict with ``--quiet``."""

    cell_id: str
    quiet: bool = False
    whole_at: Path | None = None  # where a reason cut for its line is whole
    # the reason of the blocked stage told last, while the stages after it are blocked too
    blocking: list[str] = dataclasses.field(default_factory=list)

    def stage_done(self, result: StageResult) -> None:
        if self.quiet:
            return
        if result.state == StageState.SKIP and result.reason.startswith("blocked: "):
            if not self.blocking:  # the first of a blocked tail speaks for it
                self.blocking.append(result.reason)
                print(
                    f"[compatlab] {self.cell_id}: {result.name} and the stages after it that need it skip — "
                    f"{result.reason}",
                    file=sys.stderr,
                    flush=True,
                )
            return
        self.blocking.clear()
        why = (
            f" — {short_reason(result.reason, self.whole_at)}"
            if result.reason and result.state != StageState.PASS
            else ""
        )
        print(
            f"[compatlab] {self.cell_id}: {result.name} {result.state} {result.seconds:.1f} s{why}",
            file=sys.stderr,
            flush=True,
        )

    def note(self, line: str) -> None:
        """A long stage's progress lines (the import stage's modules loaded so far)."""
        print(f"[compatlab] {self.cell_id}: {line}", file=sys.stderr, flush=True)


def _position(matrix: Matrix, cell_id: str, run_dir: Path, stages: Collection[str] | None) -> str:
    """``3/6, about 20 s as in the previous run; the run ends about 17:42 UTC`` for a cell run by hand: its
    place among the matrix's live cells, and what the earlier runs beside *run_dir* took for *stages*."""
    from compatlab.cells import expand
    from compatlab.plan import Plan, previous_spans

    live = tuple(c.id for c in expand(matrix) if c.na is None)
    spans = previous_spans(run_dir.parent, matrix_name=matrix.name, stages=stages, exclude=run_dir.name)
    return Plan(cells=live, previous=spans).cell_words(cell_id)


def _cmd_cell(args: argparse.Namespace) -> int:
    from compatlab.cells import planned
    from compatlab.config.matrix import load_matrix
    from compatlab.host import host_facts
    from compatlab.runner import find_cell, run_cell

    matrix = load_matrix(matrix_path(args))
    cell = find_cell(matrix, args.cell)
    run_dir: Path = args.run_dir
    latest: Path | None = args.latest
    # Resolved once, where the user ran the command: the suites run the venv's python in their work folder.
    venvs: Path = args.venvs.absolute()
    # Under nox the session owns the run and hands down --owner; by hand, this process owns it.
    run = (
        store.join_run(run_dir, owner=args.owner)
        if args.owner
        else store.claim_run(run_dir, run_id=args.run_id or run_dir.name, plan=planned(matrix), host=host_facts)
    )
    from compatlab.runner import PIPELINE, select_stages

    stages, left_out = select_stages(PIPELINE, until=args.until, only=tuple(args.stages or ()))
    chosen = [s.name for s in stages] if left_out else None
    where = args.estimate or (None if args.quiet else _position(matrix, cell.id, run_dir, chosen))
    with run:
        if not run.results_path.exists():
            # The run exists (host facts, start time, planned cells) before its first cell ends or crashes.
            run.aggregate(planned(matrix), latest=latest)
        told = CellReporter(cell.id, quiet=args.quiet, whole_at=store.cell_file(run_dir, cell.id))
        if not args.quiet:
            print(f"[compatlab] start {cell.id} ({where})", file=sys.stderr, flush=True)
        from compatlab.proc import signals_interrupt

        with signals_interrupt():
            if args.gpu8:
                from compatlab.runner import GPU8, run_more_stages

                result = run_more_stages(matrix, cell, run=run, venv_root=venvs, stages=GPU8, reporter=told)
            else:
                result = run_cell(
                    matrix, cell, run=run, venv_root=venvs, stages=stages, left_out=left_out, reporter=told
                )
        if args.owner:
            run.aggregate(planned(matrix), latest=latest)  # the run's owner finishes it, after its last cell
        else:
            run.finish(planned(matrix), latest=latest)
    print(end_line(result), flush=True)
    return 1 if result.unexpected else 0


def _cmd_ci_matrix(args: argparse.Namespace) -> int:
    from compatlab.config.matrix import load_matrix
    from compatlab.shard import ci_matrix

    if args.shards is not None and args.shards < 1:
        raise UsageError(f"--shards: expected a positive number, got {args.shards}")
    limits.check("--shards", args.shards)
    print(json.dumps(ci_matrix(load_matrix(matrix_path(args)), shards=args.shards), separators=(",", ":")))
    return 0


def configure_parser(sub: Any) -> None:
    s = sub.add_parser("validate", help="check matrix.toml and count its cells")
    add_matrix(s)
    s.set_defaults(func=_cmd_validate)

    s = sub.add_parser("cells", help="list the cells of a matrix")
    add_matrix(s)
    s.add_argument("--json", action="store_true")
    s.add_argument("--shard", help="only shard i of n, e.g. 2/4 (deterministic, balanced)")
    s.set_defaults(func=_cmd_cells)

    s = sub.add_parser("ci-matrix", help="JSON for a CI matrix strategy (fromJson): per cell, or per shard")
    add_matrix(s)
    s.add_argument("--shards", type=int, help="one job per shard instead of one per cell")
    s.set_defaults(func=_cmd_ci_matrix)

    s = sub.add_parser("cell", help="run one cell")
    s.add_argument("cell")
    add_matrix(s)
    s.add_argument("--run-dir", type=Path, required=True)
    s.add_argument("--run-id")
    s.add_argument(
        "--latest", type=Path, help="folder whose results.json mirrors the run (unless it shows a newer run)"
    )
    s.add_argument("--owner", help="the run's owner, as the process that claimed the run hands it down")
    s.add_argument("--venvs", type=Path, default=Path(".compatlab/venvs"), help="where cell venvs live")
    s.add_argument("--gpu8", action="store_true", help="add the 8-GPU stages (nccl, perf) to this run's result")
    s.add_argument("--until", metavar="STAGE", help="a preflight: stop after this stage (the cell is partial)")
    s.add_argument(
        "--stages",
        type=lambda text: [n.strip() for n in text.split(",") if n.strip()],
        metavar="A,B",
        help="run only these stages of the pipeline (install is needed by the rest)",
    )
    s.add_argument("-q", "--quiet", action="store_true", help="no progress lines, only the verdict")
    s.add_argument(
        "--estimate",
        metavar="WORDS",
        help="the cell's place and time as the run's owner tells it "
        "(default: among the matrix's live cells, with the seconds of --latest)",
    )
    s.set_defaults(func=_cmd_cell)
