"""A file's label: its path relative to site-packages, as the import stage names it."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from compatlab.incell.imports.labels import record_label, site_label
from compatlab.incell.loading.installed import LoadTarget


def test_a_label_is_the_path_below_the_longest_entry_of_sys_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "path", ["", str(tmp_path), str(tmp_path / "inner") + "/"])
    assert site_label(str(tmp_path / "inner" / "x.so")) == "x.so"
    assert site_label(str(tmp_path / "pkg" / "x.so")) == "pkg/x.so"
    assert site_label("/elsewhere/x.so") == "/elsewhere/x.so"


def test_a_record_label_is_the_targets_own_else_below_the_first_entry_of_sys_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "path", [str(tmp_path), str(tmp_path / "inner")])
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "_ops.so").write_bytes(b"")
    os.symlink(tmp_path / "pkg" / "_ops.so", tmp_path / "link.so")
    target = LoadTarget(dist="pkg", label="pkg/_ops.so", name="pkg._ops", path=str(tmp_path / "pkg" / "_ops.so"))
    assert record_label(str(tmp_path / "link.so"), [target]) == "pkg/_ops.so"  # the same file
    assert record_label(str(tmp_path / "inner" / "x.so"), [target]) == "inner/x.so"  # the first entry, not the longest
    assert record_label("/elsewhere/x.so", []) == "/elsewhere/x.so"
