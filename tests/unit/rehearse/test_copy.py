"""rehearse.copy: a venv's copy shares its files by hard link, rewrites what holds the old path into new files,
and proves afterwards that nothing it shares was written in place."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from compatlab.errors import UsageError
from compatlab.rehearse.copy import UntouchedError, copy_environment, remove_copy


def _venv(root: Path) -> Path:
    """A venv's shape as uv makes it: pyvenv.cfg, bin/python a link to the base interpreter, a script whose
    shebang and an activate script that name the venv, a .pth into it, and a library."""
    venv = root / "serve-env"
    site = venv / "lib" / "python3.11" / "site-packages"
    (site / "pkg").mkdir(parents=True)
    (venv / "bin").mkdir()
    (venv / "pyvenv.cfg").write_text(f"home = /usr/bin\ncommand = /usr/bin/python3 -m venv {venv}\n")
    os.symlink("/usr/bin/python3", venv / "bin" / "python")
    os.symlink("python", venv / "bin" / "python3")
    os.symlink(f"{venv}/lib", venv / "lib64")
    (venv / "bin" / "serve").write_text(f"#!{venv}/bin/python\nimport pkg\n")
    (venv / "bin" / "activate").write_text(f"VIRTUAL_ENV='{venv}'\nOTHER='{venv}2/bin'\n")
    (site / "extra.pth").write_text(f"{venv}/lib/python3.11/site-packages/pkg\n")
    (site / "pkg" / "lib.so").write_bytes(b"\x7fELF" + b"\0" * 64 + str(venv).encode())
    return venv


def test_files_are_shared_and_paths_rewritten_into_new_files(tmp_path: Path) -> None:
    venv = _venv(tmp_path)
    copy = copy_environment(venv, tmp_path / "copy")
    new = tmp_path / "copy"
    assert (copy.linked, copy.rewritten, copy.copied, copy.links) == (1, 4, 0, 3)
    site = "lib/python3.11/site-packages"
    assert os.stat(new / site / "pkg" / "lib.so").st_ino == os.stat(venv / site / "pkg" / "lib.so").st_ino
    for rel in ("pyvenv.cfg", "bin/serve", "bin/activate", f"{site}/extra.pth"):
        assert os.stat(new / rel).st_ino != os.stat(venv / rel).st_ino, rel
    assert (new / "bin" / "serve").read_text() == f"#!{new}/bin/python\nimport pkg\n"
    # The old path as a prefix of another name (…/serve-env2) is not the old path.
    assert (new / "bin" / "activate").read_text() == f"VIRTUAL_ENV='{new}'\nOTHER='{venv}2/bin'\n"
    assert (new / "pyvenv.cfg").read_text() == f"home = /usr/bin\ncommand = /usr/bin/python3 -m venv {new}\n"
    assert (new / site / "extra.pth").read_text() == f"{new}/{site}/pkg\n"
    assert os.readlink(new / "bin" / "python") == "/usr/bin/python3"  # the base interpreter: as it was
    assert os.readlink(new / "bin" / "python3") == "python"
    assert os.readlink(new / "lib64") == f"{new}/lib"
    assert (venv / "bin" / "serve").read_text() == f"#!{venv}/bin/python\nimport pkg\n"  # the original's own
    copy.check_untouched()


def test_a_shared_file_written_in_place_is_caught(tmp_path: Path) -> None:
    venv = _venv(tmp_path)
    copy = copy_environment(venv, tmp_path / "copy")
    replaced = tmp_path / "copy" / "lib" / "python3.11" / "site-packages" / "pkg" / "lib.so"
    os.unlink(replaced)  # what uv does: the copy's own new file, the original's untouched
    replaced.write_bytes(b"new")
    copy.check_untouched()
    with open(tmp_path / "copy" / "pyvenv.cfg", "a") as fh:  # a file of its own: not shared
        fh.write("x = 1\n")
    copy.check_untouched()
    copy2 = copy_environment(venv, tmp_path / "copy2")
    shared = tmp_path / "copy2" / "lib" / "python3.11" / "site-packages" / "pkg" / "lib.so"
    with open(shared, "ab") as fh:  # through the link: the original changes too
        fh.write(b"written in place")
    with pytest.raises(UntouchedError, match=r"lib\.so: a file the copy at .* shares with the original changed"):
        copy2.check_untouched()


def test_a_copy_replaces_its_own_folder_and_never_another(tmp_path: Path) -> None:
    venv = _venv(tmp_path)
    copy_environment(venv, tmp_path / "copy")
    copy_environment(venv, tmp_path / "copy")  # its own, from an earlier rehearsal: replaced
    (tmp_path / "mine").mkdir()
    with pytest.raises(UsageError, match=r"mine: exists and is not a rehearsal's copy"):
        copy_environment(venv, tmp_path / "mine")
    with pytest.raises(UsageError, match=r"cannot be inside the environment it copies"):
        copy_environment(venv, venv / "inner")
    remove_copy(tmp_path / "copy")
    assert not (tmp_path / "copy").exists()
    assert (tmp_path / "mine").is_dir()
