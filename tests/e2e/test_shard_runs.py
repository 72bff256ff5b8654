"""Shard runs of a real `nox -s matrix`, merged back into one grid: equal to a single run, a lost shard shown."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from compatlab.runs import store
from fixtures.labutil import ROOT, nox
from fixtures.matrices import EXPECTED_ONLY
from fixtures.shared_run import SharedRun


def _comparable(cell: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": cell["id"],
        "state": cell["state"],
        "reason": cell["reason"],
        "unexpected": cell["unexpected"],
        "freeze": cell["freeze"],
        "stages": [(s["name"], s["state"], s["reason"]) for s in cell["stages"]],
    }


def _merge(tmp_path: Path, *dirs: Path, out: str = "merged") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "compatlab",
            "merge",
            *map(str, dirs),
            "--matrix",
            str(tmp_path / "matrix.toml"),
            "--out",
            str(tmp_path / out),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
        timeout=120,
    )


@pytest.mark.long
def test_merged_shards_equal_a_single_run_and_a_lost_shard_shows(
    tmp_path: Path, index_url: str, expected_only_run: SharedRun
) -> None:
    text = EXPECTED_ONLY.format(url=index_url)
    single = expected_only_run  # the same matrix, one run of all its cells
    assert single.returncode == 0, single.said
    for i in (1, 2):
        done = nox(
            tmp_path,
            text,
            "-s",
            "matrix",
            run_id=f"shard{i}",
            reports=tmp_path / f"shard{i}",
            extra_env={"COMPATLAB_SHARD": f"{i}/2"},
        )
        assert done.returncode == 0, done.stdout + done.stderr
    shard_dirs = [tmp_path / f"shard{i}" / "runs" / f"shard{i}" for i in (1, 2)]
    # Each `nox -s matrix` ran to its end: its run is finished, for history to compare with.
    assert [store.run_info(d).complete for d in shard_dirs] == [True, True]
    # A shard writes a file per live cell it ran; its n/a cells are in its results.json, from the matrix.
    assert len(list(shard_dirs[0].glob("cells/*.json"))) == 2

    merged = _merge(tmp_path, *shard_dirs)
    assert merged.returncode == 0, merged.stderr
    assert merged.stdout == f"merged 2 shard(s) into {tmp_path / 'merged' / 'results.json'}: 8 cells, 0 missing\n"
    ref = json.loads((single.folder / "reports" / "runs" / "r1" / "results.json").read_text())
    got = json.loads((tmp_path / "merged" / "results.json").read_text())
    assert [_comparable(c) for c in got["cells"]] == [_comparable(c) for c in ref["cells"]]

    lost = _merge(tmp_path, shard_dirs[0], out="merged-lost")
    assert lost.returncode == 1
    assert lost.stdout.endswith("8 cells, 2 missing\n")
    cells = {c["id"]: c for c in json.loads((tmp_path / "merged-lost" / "results.json").read_text())["cells"]}
    missing = [c for c in cells.values() if c["reason"].startswith("missing:")]
    assert [(c["state"], c["unexpected"]) for c in missing] == [("error", True), ("error", True)]
    assert (
        missing[0]["reason"] == "missing: no shard produced a result for this cell (lost runner or interrupted shard)"
    )
    # The n/a cells of the lost shard are known from the matrix alone: they stay n/a.
    assert sum(c["state"] == "n/a" for c in cells.values()) == 4
