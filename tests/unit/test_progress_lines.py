"""A cell's progress lines (cli/matrix.py): a blocked tail is one line, a long reason is cut at a word with
where the whole text is."""

from __future__ import annotations

from pathlib import Path

import pytest

from compatlab.cli.matrix import CellReporter, short_reason
from compatlab.runs.model import StageResult, StageState


def test_a_blocked_tail_is_one_line_and_a_long_reason_says_where_the_whole_is(
    capsys: pytest.CaptureFixture[str],
) -> None:
    say = CellReporter("c1", whole_at=Path("reports/runs/r/cells/c1.json")).stage_done
    long = "no " + "word " * 60 + "end"
    say(StageResult(name="install", state=StageState.FAIL, reason=long, seconds=1.0))
    for name in ("pins", "static", "import", "cuda", "serve"):
        say(StageResult(name=name, state=StageState.SKIP, reason="blocked: install failed"))
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("[compatlab] c1: install fail 1.0 s — no word word")
    assert lines[0].endswith(" word … (whole reason: reports/runs/r/cells/c1.json)")
    assert lines[1:] == ["[compatlab] c1: pins and the stages after it that need it skip — blocked: install failed"]
    assert short_reason("short") == "short"
    assert len(short_reason("x " * 200)) < 170
