"""A $COMPATLAB_CACHE that cannot be written (read-only on a shared CI machine; here a path below a plain
file, which even root cannot make) costs speed, never a cell: each user falls back with one warning."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from compatlab import proc
from compatlab.incell import fakecuda
from compatlab.stages.static.elf import ElfCache
from fixtures.hostile import versioned_so


@pytest.fixture
def unwritable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "plain-file").write_text("not a folder\n", encoding="utf-8")
    cache = tmp_path / "plain-file" / "cache"
    monkeypatch.setenv("COMPATLAB_CACHE", str(cache))
    monkeypatch.setattr(proc, "_FALLBACK", [], raising=False)
    return cache


def test_the_incell_copy_falls_back_to_a_private_folder(unwritable: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        first = proc.incell_path()
        again = proc.incell_path()
    assert first == again
    assert (first / "compatlab" / "incell" / "loadcheck.py").is_file()
    assert not first.is_relative_to(unwritable.parent)
    assert [r.getMessage() for r in caplog.records] == [
        f"cannot write the cache {unwritable} (Not a directory): compatlab.incell is copied to {first.parent} for "
        "this process only"
    ]


@pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is not installed")
def test_the_elf_cache_reads_without_storing(
    unwritable: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    so = versioned_so(tmp_path / "lib" / "libhost.so")
    other = versioned_so(tmp_path / "lib" / "libother.so")
    cache = ElfCache()
    with caplog.at_level(logging.WARNING):
        assert cache.load(so).version_defs == ["VERS_1"]
        assert cache.load(other).version_defs == ["VERS_1"]
    assert cache.read_only
    assert [r.getMessage() for r in caplog.records] == [
        f"cannot write the ELF cache {unwritable}/elf-v2 (Not a directory): this run reads ELF files without "
        "storing them"
    ]


def test_the_stand_in_driver_is_built_in_the_cells_folder(unwritable: Path, tmp_path: Path) -> None:
    assert fakecuda.cache_dir(tmp_path / "work") == tmp_path / "work"
