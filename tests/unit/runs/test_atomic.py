"""The one atomic writer (runs/atomic.py): whole files, fsynced, readable by a static host, a LabError naming
the file when it cannot be written, and no temporary file left behind."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from compatlab.errors import LabError, Unwritable
from compatlab.runs.atomic import write_atomic, write_json_atomic


def test_a_file_is_replaced_whole_and_readable_by_everyone(tmp_path: Path) -> None:
    target = tmp_path / "site" / "index.html"
    write_atomic(target, "<p>old</p>\n")
    write_atomic(target, b"<p>new</p>\n")
    assert target.read_text(encoding="utf-8") == "<p>new</p>\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    write_json_atomic(tmp_path / "perf.json", {"speedup": 1.5}, mode=0o600)
    assert json.loads((tmp_path / "perf.json").read_text(encoding="utf-8")) == {"speedup": 1.5}
    assert (tmp_path / "perf.json").read_text(encoding="utf-8").endswith("}\n")
    assert stat.S_IMODE((tmp_path / "perf.json").stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["index.html", "perf.json", "site"]


def test_a_file_that_cannot_be_written_is_a_lab_error_naming_it(tmp_path: Path) -> None:
    (tmp_path / "reports").write_text("a file, not a folder\n", encoding="utf-8")
    with pytest.raises(LabError) as caught:
        write_atomic(tmp_path / "reports" / "compat.md", "# grid\n")
    assert str(caught.value) == f"cannot write {tmp_path}/reports/compat.md: {tmp_path}/reports is not a folder"
    (tmp_path / "latest" / "results.json").mkdir(parents=True)  # a folder where the file goes
    with pytest.raises(Unwritable) as replaced:
        write_atomic(tmp_path / "latest" / "results.json", "{}\n")
    assert str(replaced.value) == f"cannot write {tmp_path}/latest/results.json: Is a directory"
    assert [p.name for p in (tmp_path / "latest").iterdir()] == ["results.json"]  # no temporary file left
