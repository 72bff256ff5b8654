"""Sharding over machines, the CI fan-out list, and merging shard runs back into one grid."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from compatlab.cells import expand
from compatlab.config.matrix import load_matrix, parse_matrix
from compatlab.errors import UsageError
from compatlab.shard import ci_matrix, parse_shard, shard_cells
from fixtures.labutil import ROOT, nox
from fixtures.matrices import EXPECTED_ONLY


def big_matrix() -> Any:
    return parse_matrix({
        "axes": {
            "torch": [{"version": v, "cuda": c} for v, c in (("2.8.0", "12.8"), ("2.9.1", "12.8"), ("2.11.0", "13.0"))],
            "sgl-kernel": ["0.3.20", "0.3.21"],
            "flashinfer": ["0.5.3", "0.6.4", "0.7.4", "0.8.0"],
            "cuda": ["12.8", "13.0"],
        }
    })


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


def test_ci_matrix_json_for_fromjson() -> None:
    matrix = load_matrix(ROOT / "examples" / "pinned-2026-01.toml")
    assert ci_matrix(matrix, shards=3) == {"include": [{"shard": "1/3"}, {"shard": "2/3"}, {"shard": "3/3"}]}
    per_cell = ci_matrix(matrix, shards=None)["include"]
    assert len(per_cell) == 6
    assert per_cell[0] == {"cell": "torch2.9.1-sglkernel0.3.21-flashinfer0.6.4-cuda12.8",
                           "session": "matrix(torch2.9.1-sglkernel0.3.21-flashinfer0.6.4-cuda12.8)"}
    done = subprocess.run([sys.executable, "-m", "compatlab", "ci-matrix", "--shards", "2"], capture_output=True,
                          text=True, cwd=ROOT, check=False, timeout=60)
    assert (done.returncode, done.stdout) == (0, '{"include":[{"shard":"1/2"},{"shard":"2/2"}]}\n')


def _comparable(cell: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": cell["id"], "state": cell["state"], "reason": cell["reason"], "unexpected": cell["unexpected"],
        "freeze": cell["freeze"],
        "stages": [(s["name"], s["state"], s["reason"]) for s in cell["stages"]],
    }


def _merge(tmp_path: Path, *dirs: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "compatlab", "merge", *map(str, dirs), "--matrix", str(tmp_path / "matrix.toml"),
         "--out", str(tmp_path / "merged")],
        capture_output=True, text=True, cwd=ROOT, check=False, timeout=120,
    )


def test_merged_shards_equal_a_single_run_and_a_lost_shard_shows(tmp_path: Path, index_url: str) -> None:
    text = EXPECTED_ONLY.format(url=index_url)
    single = nox(tmp_path, text, "-s", "matrix", run_id="single", reports=tmp_path / "single")
    assert single.returncode == 0, single.stdout + single.stderr
    for i in (1, 2):
        done = nox(tmp_path, text, "-s", "matrix", run_id=f"shard{i}", reports=tmp_path / f"shard{i}",
                   extra_env={"COMPATLAB_SHARD": f"{i}/2"})
        assert done.returncode == 0, done.stdout + done.stderr
    shard_dirs = [tmp_path / f"shard{i}" / "runs" / f"shard{i}" for i in (1, 2)]
    assert len(list(shard_dirs[0].glob("cells/*.json"))) == 4

    merged = _merge(tmp_path, *shard_dirs)
    assert merged.returncode == 0, merged.stderr
    assert merged.stdout == f"merged 2 shard(s) into {tmp_path / 'merged' / 'results.json'}: 8 cells, 0 missing\n"
    ref = json.loads((tmp_path / "single" / "runs" / "single" / "results.json").read_text())
    got = json.loads((tmp_path / "merged" / "results.json").read_text())
    assert [_comparable(c) for c in got["cells"]] == [_comparable(c) for c in ref["cells"]]

    lost = _merge(tmp_path, shard_dirs[0])
    assert lost.returncode == 1
    assert lost.stdout.endswith("8 cells, 2 missing\n")
    cells = {c["id"]: c for c in json.loads((tmp_path / "merged" / "results.json").read_text())["cells"]}
    missing = [c for c in cells.values() if c["reason"].startswith("missing:")]
    assert [(c["state"], c["unexpected"]) for c in missing] == [("error", True), ("error", True)]
    assert missing[0]["reason"] == "missing: no shard produced a result for this cell (lost runner or interrupted shard)"
    # The n/a cells of the lost shard are known from the matrix alone: they stay n/a.
    assert sum(c["state"] == "n/a" for c in cells.values()) == 4
