"""A library of the module's own package that no RUNPATH finds: the file its package loads first."""

from __future__ import annotations

from pathlib import Path

from compatlab.incell.imports.load import own_library
from compatlab.incell.loading.failure import LoadFailure
from compatlab.incell.loading.installed import LoadTarget


def _missing(library: str) -> LoadFailure:
    return LoadFailure(kind="missing-library", message=f"{library}: cannot open shared object file", library=library)


def test_the_library_is_found_anywhere_in_the_modules_top_level_package(tmp_path: Path) -> None:
    for rel in ("torchaudio/lib/_torchaudio.so", "torchaudio/libs/libtorchaudio.so"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(b"")
    module = str(tmp_path / "torchaudio" / "lib" / "_torchaudio.so")
    target = LoadTarget(
        dist="torchaudio", label="torchaudio/lib/_torchaudio.so", name="torchaudio.lib._torchaudio", path=module
    )
    assert own_library(target, _missing("libtorchaudio.so")) == str(
        tmp_path / "torchaudio" / "libs" / "libtorchaudio.so"
    )
    assert own_library(target, _missing("libcudart.so.12")) is None  # not its package's
    assert own_library(target, _missing("_torchaudio.so")) is None  # the module itself
    assert own_library(target, _missing("/abs/libtorchaudio.so")) is None
    assert own_library(target, None) is None
    assert (
        own_library(LoadTarget(dist="torchaudio", label="torchaudio", name="torchaudio"), _missing("libtorchaudio.so"))
        is None
    )
