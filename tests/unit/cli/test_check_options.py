"""`compatlab check`'s flags: the --stage choices come from the pipeline; the request is built once, whole."""

from __future__ import annotations

import argparse

import pytest

from compatlab import runner
from compatlab.cli import _parser
from compatlab.cli.check import CheckReporter
from compatlab.errors import UsageError
from compatlab.runs.model import StageResult, StageState
from compatlab.stages import Stage


def _nothing(_ctx: object) -> StageResult:
    return StageResult(name="fresh", state=StageState.PASS)


def test_a_stage_added_to_the_pipeline_is_a_check_stage_without_another_edit(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(UsageError, match="invalid choice: 'fresh'"):
        _parser().parse_args(["check", "--stage", "fresh"])
    monkeypatch.setattr(runner, "PIPELINE", (*runner.PIPELINE, Stage(name="fresh", run=_nothing)))
    args = _parser().parse_args(["check", "--stage", "fresh", "--stage", "pins"])
    assert args.stage == ["fresh", "pins"]
    assert runner.existing_stage_names() == ("pins", "static", "import", "cuda", "serve", "fresh", "nccl")
    # rehearse judges with the same stages, nccl aside
    assert _parser().parse_args(["rehearse", "--stage", "fresh"]).stage == ["fresh"]


def test_the_stage_choices_are_the_pipeline_s_in_its_order() -> None:
    check = _parser().parse_args(["check", "--stage", "nccl"])
    assert check.stage == ["nccl"]
    with pytest.raises(UsageError, match=r"invalid choice: 'nccl' \(choose from 'pins', 'static', 'import', 'cuda', "):
        _parser().parse_args(["rehearse", "--stage", "nccl"])


def test_every_verb_with_a_matrix_takes_the_one_matrix_flag() -> None:
    parser = _parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {
        name: next(a.help for a in verb._actions if "--matrix" in a.option_strings)
        for name, verb in sub.choices.items()
        if any("--matrix" in a.option_strings for a in verb._actions)
    }
    assert sorted(helps) == ["cell", "cells", "ci-matrix", "lock", "merge", "perf", "validate"]
    assert set(helps.values()) == {"matrix file (default: $COMPATLAB_MATRIX or ./matrix.toml)"}


def test_check_says_each_stage_that_ran_and_leaves_the_blocked_ones_to_the_verdict(
    capsys: pytest.CaptureFixture[str],
) -> None:
    face = CheckReporter(quiet=True)
    face.stage_done(StageResult(name="pins", state=StageState.FAIL, reason="optpkg 2.0 was replaced", seconds=0.04))
    face.stage_done(StageResult(name="import", state=StageState.SKIP, reason="blocked: pins failed"))
    face.stage_done(StageResult(name="static", state=StageState.PASS, seconds=1.25))
    face.note("import: 3/9 modules")
    out, err = capsys.readouterr()
    assert out == "  pins: fail (0.0 s) — optpkg 2.0 was replaced\n  static: pass (1.2 s)\n"
    assert err == "    import: 3/9 modules\n"
