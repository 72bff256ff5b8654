"""Results, cell files and a lock nested 100,000 levels deep: one error line naming the file, no traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from compatlab.config.lock import load_lock
from compatlab.errors import ConfigError
from compatlab.runs import store
from compatlab.runs.model import CellState


def test_deep_json_results_are_one_error_line(tmp_path: Path) -> None:
    results = tmp_path / "results.json"
    results.write_text("[" * 100_000, encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        store.load_results(results)
    assert str(info.value) == f"{results}: not valid JSON: arrays or objects nested too deeply to read"


def test_a_deep_cell_file_is_an_error_cell(tmp_path: Path) -> None:
    (tmp_path / "cells").mkdir()
    (tmp_path / "cells" / "c1.json").write_text('{"a":' * 100_000, encoding="utf-8")
    ((path, cell),) = store.read_cells(tmp_path)
    assert path.name == "c1.json"
    assert cell.state == CellState.ERROR
    assert "nested too deeply" in cell.reason


def test_a_deep_lock_is_one_error_line(tmp_path: Path) -> None:
    lock = tmp_path / "matrix.lock"
    lock.write_text("x = " + "[" * 100_000, encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_lock(lock)
    assert str(info.value) == (
        f"{lock}: invalid TOML: arrays or tables nested too deeply to read; write it anew with `compatlab lock`"
    )
