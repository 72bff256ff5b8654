"""compatlab.stages.static.elf against shared objects compiled by gcc in the test."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from compatlab.proc import run
from compatlab.stages.static.elf import (
    CACHE_SCHEMA,
    ElfCache,
    NotElf,
    UndefinedSymbol,
    demangle,
    read_elf,
)

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")


def _cc(out: Path, source: str, *args: str) -> Path:
    """Compile C++ *source* into the shared object *out*."""
    out.parent.mkdir(parents=True, exist_ok=True)
    src = out.parent / f"{out.name}.cpp"
    src.write_text(source, encoding="utf-8")
    done = run(["g++", "-shared", "-fPIC", "-o", str(out), str(src), *args], timeout=120)
    assert done.ok, done.stderr
    return out


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("elf")
    (d / "v.map").write_text("VERS_1 { global: prov_fn; local: *; };\n", encoding="utf-8")
    prov = _cc(
        d / "lib" / "libprov.so",
        'namespace ns { void check(int) {} }\nextern "C" int prov_fn(void) { return 1; }\n',
        "-Wl,-soname,libprov.so.1",
        f"-Wl,--version-script={d / 'v.map'}",
    )
    cons = _cc(
        d / "cons.so",
        'namespace ns { void check(int); }\nextern "C" int prov_fn(void);\n'
        'extern "C" int entry(void) { ns::check(1); return prov_fn(); }\n',
        f"-L{d / 'lib'}",
        "-lprov",
        "-Wl,-rpath,$ORIGIN/lib",
        "-Wl,--enable-new-dtags",
    )
    old = _cc(
        d / "old.so",
        'extern "C" int prov_fn(void);\nint f(void) { return prov_fn(); }\n',
        f"-L{d / 'lib'}",
        "-lprov",
        "-Wl,-rpath,$ORIGIN/lib:/opt/x",
        "-Wl,--disable-new-dtags",
    )
    return {"prov": prov, "cons": cons, "old": old}


def test_provider_exports_and_versions(built: dict[str, Path]) -> None:
    info = read_elf(built["prov"])
    assert info.soname == "libprov.so.1"
    assert info.elf_class == 64
    assert info.version_defs == ["VERS_1"]
    assert info.defined["prov_fn"] == ["VERS_1"]
    # The version script hides everything but prov_fn: ns::check is local and not exported.
    assert "_ZN2ns5checkEi" not in info.defined


def test_consumer_needs_and_runpath(built: dict[str, Path]) -> None:
    info = read_elf(built["cons"])
    assert "libprov.so.1" in info.needed
    assert info.runpath == ["$ORIGIN/lib"]
    assert info.rpath == []
    assert UndefinedSymbol("prov_fn", "VERS_1", "libprov.so.1", False) in info.undefined
    assert UndefinedSymbol("_ZN2ns5checkEi", "", "", False) in info.undefined
    assert info.version_needs["libprov.so.1"] == ["VERS_1"]
    assert "entry" in info.defined


def test_old_style_rpath(built: dict[str, Path]) -> None:
    info = read_elf(built["old"])
    assert info.rpath == ["$ORIGIN/lib", "/opt/x"]
    assert info.runpath == []


def test_not_elf(tmp_path: Path) -> None:
    text = tmp_path / "libfake.so"
    text.write_text("INPUT(-lc)\n", encoding="utf-8")  # a linker script, as some distros ship libc.so
    with pytest.raises(NotElf, match=r"libfake\.so: not a readable ELF file"):
        read_elf(text)


def test_demangle() -> None:
    assert demangle("_ZN3c104cuda29c10_cuda_check_implementationEiPKcS2_ib") == (
        "c10::cuda::c10_cuda_check_implementation(int, char const*, char const*, int, bool)"
    )
    assert demangle("_ZN3c104cuda29c10_cuda_check_implementationEiPKcS2_jb") == (
        "c10::cuda::c10_cuda_check_implementation(int, char const*, char const*, unsigned int, bool)"
    )
    assert demangle("cudaMalloc") == "cudaMalloc"
    assert demangle("_Znot-a-symbol") == "_Znot-a-symbol"


def test_cache_reads_each_content_once(built: dict[str, Path], tmp_path: Path) -> None:
    cache = ElfCache(tmp_path / "cache")
    first = cache.load(built["cons"])
    again = cache.load(built["cons"])
    assert again is first
    assert (cache.hits, cache.misses) == (1, 1)
    # A second process (a new cache object) reads the JSON entry instead of the ELF file.
    other = ElfCache(tmp_path / "cache")
    from_disk = other.load(built["cons"])
    assert (other.hits, other.misses) == (1, 0)
    assert from_disk == first
    entries = list((tmp_path / "cache").rglob("*.json"))
    assert len(entries) == 1
    assert json.loads(entries[0].read_text(encoding="utf-8"))["soname"] == ""


def test_cache_is_keyed_by_content_and_survives_corruption(built: dict[str, Path], tmp_path: Path) -> None:
    # A hash handed in (RECORD's) is not the key: the file's own sha256 is.
    cache = ElfCache(tmp_path)
    cache.load(built["prov"], "ab" * 32)
    digest = hashlib.sha256(built["prov"].read_bytes()).hexdigest()
    entry = tmp_path / f"elf-v{CACHE_SCHEMA}" / digest[:2] / f"{digest}.json"
    assert entry.is_file()
    assert not list(tmp_path.rglob("abab*.json"))
    entry.write_text("{not json", encoding="utf-8")
    fresh = ElfCache(tmp_path)
    assert fresh.load(built["prov"]).soname == "libprov.so.1"
    assert (fresh.hits, fresh.misses) == (0, 1)
    assert json.loads(entry.read_text(encoding="utf-8"))["soname"] == "libprov.so.1"


def test_prefetch_reads_unseen_files_in_worker_processes_and_load_answers_as_it_would_itself(
    tmp_path: Path, built: dict[str, Path]
) -> None:
    """Issue 35: the static stage reads the files it has never seen on every core, before its walk. What
    load() then answers is what a cache that read them itself answers, counted as the misses they were; a
    file that is no ELF is left to load(), which says why; files seen before are not read again."""
    paths = [built["prov"], built["cons"], built["old"]]
    junk = tmp_path / "junk.so"
    junk.write_bytes(b"not an ELF file at all")
    cache = ElfCache(tmp_path / "cache")
    assert cache.prefetch([*paths, junk], jobs=2) == 3
    assert (cache.hits, cache.misses) == (0, 0)
    fetched = [cache.load(p) for p in paths]
    assert (cache.hits, cache.misses) == (0, 3)
    serial = ElfCache(tmp_path / "serial")
    assert fetched == [serial.load(p) for p in paths]
    with pytest.raises(NotElf, match="no ELF magic"):
        cache.load(junk)

    again = ElfCache(tmp_path / "cache")  # another run over the same cache: stored by the workers
    assert again.prefetch(paths, jobs=2) == 0
    assert [again.load(p) for p in paths] == fetched
    assert (again.hits, again.misses) == (3, 0)
    assert ElfCache(tmp_path / "one").prefetch(paths, jobs=1) == 0  # one core: load() reads them itself
