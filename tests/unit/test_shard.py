"""Sharding over machines and the CI fan-out list (shard runs merged back: tests/e2e/test_shard_runs.py)."""

from __future__ import annotations

from typing import Any

import pytest

from compatlab.cells import expand
from compatlab.cli import main
from compatlab.config.matrix import load_matrix, parse_matrix
from compatlab.errors import UsageError
from compatlab.shard import ci_matrix, parse_shard, shard_cells
from fixtures.labutil import ROOT


def big_matrix() -> Any:
    return parse_matrix(
        {
            "axes": {
                "torch": [
                    {"version": v, "cuda": c} for v, c in (("2.8.0", "12.8"), ("2.9.1", "12.8"), ("2.11.0", "13.0"))
                ],
                "sgl-kernel": ["0.3.20", "0.3.21"],
                "flashinfer": ["0.5.3", "0.6.4", "0.7.4", "0.8.0"],
                "cuda": ["12.8", "13.0"],
            }
        }
    )


@pytest.mark.parametrize("count", range(1, 8))
@pytest.mark.parametrize("which", ["default", "big"])
def test_every_cell_in_exactly_one_shard(count: int, which: str) -> None:
    matrix = load_matrix(ROOT / "examples" / "pinned-2026-01.toml") if which == "default" else big_matrix()
    cells = expand(matrix)
    shards = [shard_cells(cells, i, count) for i in range(1, count + 1)]
    ids = [c.id for shard in shards for c in shard]
    assert sorted(ids) == sorted(c.id for c in cells)
    assert len(ids) == len(set(ids))
    live = [sum(c.na is None for c in shard) for shard in shards]
    assert max(live) - min(live) <= 1
    # Deterministic: the same call gives the same shard.
    assert [c.id for c in shard_cells(cells, 1, count)] == [c.id for c in shards[0]]


def test_bad_shard_strings() -> None:
    for text in ("0/3", "4/3", "a/b", "3"):
        with pytest.raises(UsageError) as info:
            parse_shard(text)
        assert str(info.value) == f"--shard: expected i/n with 1 <= i <= n (e.g. 2/4), got {text!r}"


def test_ci_matrix_json_for_fromjson(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    matrix = load_matrix(ROOT / "examples" / "pinned-2026-01.toml")
    assert ci_matrix(matrix, shards=3) == {"include": [{"shard": "1/3"}, {"shard": "2/3"}, {"shard": "3/3"}]}
    per_cell = ci_matrix(matrix, shards=None)["include"]
    assert len(per_cell) == 6
    assert per_cell[0] == {
        "cell": "torch2.9.1-sglkernel0.3.21-flashinfer0.6.4-cuda12.8",
        "session": "matrix(torch2.9.1-sglkernel0.3.21-flashinfer0.6.4-cuda12.8)",
    }
    monkeypatch.chdir(ROOT)
    assert main(["ci-matrix", "--shards", "2"]) == 0
    assert capsys.readouterr().out == '{"include":[{"shard":"1/2"},{"shard":"2/2"}]}\n'
