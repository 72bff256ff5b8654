"""The static stage against hostile ELF files: gcc-built objects edited byte by byte, FIFOs, lying RECORDs.

Each case hung, ran out of memory, passed silently or reused another file's verdict before; each now ends in
well under a second with a verdict about the file itself.
"""

from __future__ import annotations

import os
import shutil
import struct
from pathlib import Path

import pytest

from compatlab.runs.model import StageState
from compatlab.stages.static.elf import MAX_SECTION_BYTES, ElfCache, NotElf, read_elf
from compatlab.stages.static.stage import check_site_packages
from fixtures.hostile import dist, hard_deadline, replace_bytes, section, set_header, set_section, site, versioned_so
from fixtures.sofix import compile_so

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is not installed")


def test_version_chains_that_claim_four_billion_entries_end(tmp_path: Path) -> None:
    so = versioned_so(tmp_path / "libhost.so")
    # sh_info is the entry count pyelftools trusted; vn_next/vd_next of 0 (the end) kept it on one entry.
    set_section(so, ".gnu.version_r", sh_info=0xFFFFFFFF)
    set_section(so, ".gnu.version_d", sh_info=0xFFFFFFFF)
    with hard_deadline(5, "reading a looping .gnu.version_r"):
        info = read_elf(so)
    assert info.version_needs == {"libc.so.6": ["GLIBC_2.2.5"]}
    assert info.version_defs == ["VERS_1"]
    assert info.defined["f"] == ["VERS_1"]


def test_a_version_chain_that_leaves_its_section_cannot_be_read(tmp_path: Path) -> None:
    so = versioned_so(tmp_path / "libhost.so")
    set_section(so, ".gnu.version_r", sh_info=2)
    at = section(so, ".gnu.version_r", "sh_offset")
    data = bytearray(so.read_bytes())
    struct.pack_into("<I", data, at + 12, 0x1000)  # vn_next: the next entry, 4 KB on, past the section
    so.write_bytes(bytes(data))
    with pytest.raises(
        NotElf,
        match=r"libhost\.so: cannot read: the version-needed chain leaves its section "
        r"\(offset 4096 of 32 bytes\)$",
    ):
        read_elf(so)


def test_a_section_claiming_900_gib_is_one_error_line(tmp_path: Path) -> None:
    so = versioned_so(tmp_path / "libhost.so")
    offset = section(so, ".dynsym", "sh_offset")
    set_section(so, ".dynsym", sh_size=900 << 30)
    size = so.stat().st_size
    with pytest.raises(NotElf) as caught:
        read_elf(so)
    assert str(caught.value) == (
        f"{so}: cannot read: section 3 claims 966367641600 bytes at offset {offset}, "
        f"past the end of the {size}-byte file"
    )


def test_a_huge_dynsym_inside_the_file_is_refused_not_read(tmp_path: Path) -> None:
    so = versioned_so(tmp_path / "libhost.so")
    offset = section(so, ".dynsym", "sh_offset")
    set_section(so, ".dynsym", sh_size=(300 << 20) - offset)
    with so.open("r+b") as fh:  # a sparse tail: the file is 300 MiB on paper, a few KB on disk
        fh.truncate(300 << 20)
    with pytest.raises(
        NotElf,
        match=rf"cannot read: section \.dynsym is {(300 << 20) - offset} bytes, over the "
        rf"{MAX_SECTION_BYTES >> 20} MiB this lab reads of one section$",
    ):
        read_elf(so)


def test_a_module_without_section_headers_is_a_finding_not_a_pass(tmp_path: Path) -> None:
    sp = site(tmp_path)
    so = versioned_so(sp / "pkg" / "_mod.abi3.so")
    set_header(so, e_shoff=0, e_shnum=0, e_shstrndx=0)  # ld.so loads it by its program headers all the same
    dist(sp, "pkg", "1.0", ["pkg/_mod.abi3.so"])
    report = check_site_packages(sp, archs=[], cache=ElfCache(tmp_path / "cache"))
    assert report.state == StageState.WARN
    assert [f.message for f in report.findings] == [
        "pkg/_mod.abi3.so: cannot read: it has a PT_DYNAMIC segment but no dynamic section (section headers "
        "stripped or damaged); the static stage cannot check it"
    ]


def test_fifos_are_never_opened(tmp_path: Path) -> None:
    sp = site(tmp_path)
    versioned_so(sp / "pkg" / "_ok.abi3.so")
    os.mkfifo(sp / "pkg" / "_fifo.abi3.so")
    os.mkfifo(sp / "pkg" / "libfifo.so.1")
    os.mkfifo(sp / "pkg" / "loader.py")  # read for library names it loads by name
    dist(sp, "pkg", "1.0", ["pkg/_ok.abi3.so"])
    (sp / "fifo-1.0.dist-info").mkdir()
    os.mkfifo(sp / "fifo-1.0.dist-info" / "METADATA")
    os.mkfifo(sp / "fifo-1.0.dist-info" / "RECORD")
    with hard_deadline(5, "checking a site-packages with FIFOs named *.so, *.py, METADATA and RECORD"):
        report = check_site_packages(sp, archs=[], cache=ElfCache(tmp_path / "cache"))
        with pytest.raises(NotElf, match=r"_fifo\.abi3\.so: cannot read: a FIFO, not a regular file$"):
            read_elf(sp / "pkg" / "_fifo.abi3.so")
    assert report.modules == 1
    assert report.state == StageState.PASS


def test_the_cache_is_keyed_by_the_file_not_by_record(tmp_path: Path) -> None:
    # Two environments whose RECORDs list the same hash and size for pkg/_mod.abi3.so; in the second the
    # file was changed after install to need a library that is not there. One cache serves both.
    cache = ElfCache(tmp_path / "cache")
    good = site(tmp_path / "a")
    compile_so(good / "pkg" / "_mod.abi3.so", "int f(void) { return 0; }\n", "-Wl,--no-as-needed", "-lm")
    dist(good, "pkg", "1.0", ["pkg/_mod.abi3.so"])
    assert check_site_packages(good, archs=[], cache=cache).state == StageState.PASS

    changed = site(tmp_path / "b")
    (changed / "pkg").mkdir()
    shutil.copy(good / "pkg" / "_mod.abi3.so", changed / "pkg" / "_mod.abi3.so")
    shutil.copytree(good / "pkg-1.0.dist-info", changed / "pkg-1.0.dist-info")
    replace_bytes(changed / "pkg" / "_mod.abi3.so", b"libm.so.6\0", b"libq.so.6\0")
    report = check_site_packages(changed, archs=[], cache=cache)
    assert report.state == StageState.FAIL
    assert report.reason == (
        "pkg/_mod.abi3.so: libq.so.6 not found: not in site-packages nor in the system's library cache"
    )
