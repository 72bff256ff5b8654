"""The import stage's reading of an environment against hostile files: FIFOs, absurd sections, RECORD rows
that point outside the environment."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from compatlab.incell import loadcheck
from compatlab.incell.loading.elf import dynamic_symbols, is_extension_module
from compatlab.incell.loading.installed import Installed
from fixtures.hostile import hard_deadline, record_hash, section, set_header, set_section, versioned_so
from fixtures.sofix import EXT_SUFFIX, ext_module

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is not installed")


def test_a_fifo_named_like_a_module_is_never_opened(tmp_path: Path) -> None:
    fifo = tmp_path / f"evil{EXT_SUFFIX}"
    os.mkfifo(fifo)
    with hard_deadline(5, "reading a FIFO named *.so"):
        assert dynamic_symbols(fifo) is None
        assert is_extension_module(fifo) is None


def test_a_section_claiming_900_gib_reads_as_broken_not_as_a_traceback(tmp_path: Path) -> None:
    so = versioned_so(tmp_path / "libhost.so")
    assert dynamic_symbols(so) is not None
    set_section(so, ".dynsym", sh_size=900 << 30)
    assert section(so, ".dynsym", "sh_size") == 900 << 30
    assert dynamic_symbols(so) is None


def test_a_symbol_table_claiming_huge_entries_has_no_symbols_but_the_file_is_still_read(tmp_path: Path) -> None:
    so = versioned_so(tmp_path / "libhost.so")
    before = dynamic_symbols(so, keep=True)
    assert before is not None
    assert "f" in before.defined
    set_section(so, ".dynsym", sh_entsize=1 << 40)
    after = dynamic_symbols(so)  # rewritten since: read again, not the answer kept from before
    assert after is not None
    assert (after.defined, after.undefined, after.needed) == (frozenset(), frozenset(), before.needed)


def test_record_rows_outside_the_environment_are_never_loaded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sp = tmp_path / "site"
    good = ext_module(sp / "hostpkg", "good")
    absolute = ext_module(tmp_path / "elsewhere", "evil")
    climbing = ext_module(tmp_path / "above", "climb")
    info = sp / "hostpkg-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: hostpkg\nVersion: 1.0\n", encoding="utf-8")
    rows = [
        f"hostpkg/{good.name},{record_hash(good)},{good.stat().st_size}",
        f"{absolute},{record_hash(absolute)},{absolute.stat().st_size}",
        f"hostpkg/../../above/{climbing.name},{record_hash(climbing)},{climbing.stat().st_size}",
        "hostpkg-1.0.dist-info/RECORD,,",
    ]
    (info / "RECORD").write_text("\n".join(rows) + "\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(sp))
    installed = Installed("hostpkg")
    assert [t.label for t in installed.targets if t.path] == [f"hostpkg/{good.name}"]
    assert installed.elf_files == [str(good)]
    assert installed.outside == [absolute.as_posix(), f"hostpkg/../../above/{climbing.name}"]


def test_the_import_graph_never_opens_a_fifo_named_py(tmp_path: Path) -> None:
    from compatlab.incell.reach import ImportGraph

    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("from . import real\nfrom . import piped\n", encoding="utf-8")
    (tmp_path / "pkg" / "real.py").write_text("X = 1\n", encoding="utf-8")
    os.mkfifo(tmp_path / "pkg" / "piped.py")
    with hard_deadline(5, "reading a package with a FIFO named piped.py"):
        graph = ImportGraph(tmp_path, "pkg")
        chains, _guarded = graph.reach()
        refs = list(graph.references("pkg.real"))
    assert chains["pkg.real"] == ("pkg", "pkg.real")
    assert graph.module("pkg.piped") is None
    assert refs


def test_a_module_this_reader_cannot_parse_is_still_loaded(tmp_path: Path) -> None:
    mod = ext_module(tmp_path, "stripped")
    set_header(mod, e_shoff=0, e_shnum=0, e_shstrndx=0)  # ld.so loads by program headers all the same
    assert dynamic_symbols(mod) is None
    assert is_extension_module(mod) == "stripped"
    failure, done = loadcheck.load_module(sys.executable, path=str(mod), name="stripped")
    assert failure is None, done.stderr
