"""A copy of a virtual environment that shares its files with the original, relocated as a real move would be.

Every regular file is hard-linked (``os.link``: the copy costs directory entries, not bytes); where the
filesystem refuses a link (another filesystem, a filesystem without hard links) it is copied, with
``os.copy_file_range`` first, which a filesystem with reflinks (btrfs, XFS) turns into a shared extent. Folders
are made anew, so what the copy adds (a new wheel's files, ``__pycache__``) never lands in the original.

A hard-linked file is the original's file: it must never be written in place. uv never does: it removes a
distribution's files before it installs another's, and replaces a file it overwrites (a clash, a file no
RECORD lists) by a new one, whatever its link mode (hardlink, copy, clone: verified by the rehearsal's e2e
test, which hashes every file of the original before and after). ``Copy.check_untouched`` proves it for each
rehearsal: every file still shared has the size and mtime it had when it was linked.

What holds the environment's absolute path is rewritten into a new file (the link removed first, never
written through): ``pyvenv.cfg`` (``command = … -m venv /old``), the scripts of ``bin/`` (shebangs, the
activate scripts' ``VIRTUAL_ENV``) and the ``.pth`` files of site-packages. A symbolic link into the
environment by absolute path is pointed at the copy; one to the base interpreter stays as it is.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import re
import shutil
from pathlib import Path

from compatlab.errors import UsageError

__all__ = ["STAMP", "Copy", "UntouchedError", "copy_environment", "remove_copy"]

# Written into each copy: the lab removes or replaces a folder only when it made it.
STAMP = ".compatlab-rehearsal-copy"
# Text files whose absolute paths a relocation rewrites: scripts of bin/, and these anywhere below the root.
_TEXT_LIMIT = 4 << 20


class UntouchedError(RuntimeError):
    """A file the copy shares with the original changed: the original was written through a link."""


@dataclasses.dataclass(kw_only=True, slots=True)
class Copy:
    """The copy at *root* of the environment at *source*, and what making it cost."""

    source: Path
    root: Path
    linked: int = 0
    copied: int = 0
    rewritten: int = 0
    links: int = 0  # symbolic links
    bytes_copied: int = 0
    # Each shared file, by its path in the original: (size, mtime_ns) when it was linked.
    shared: dict[str, tuple[int, int]] = dataclasses.field(default_factory=dict)

    @property
    def python(self) -> Path:
        return self.root / "bin" / "python"

    def check_untouched(self) -> None:
        """Raise UntouchedError naming the first shared file whose size or mtime changed since it was linked."""
        for path, (size, mtime) in self.shared.items():
            try:
                st = os.stat(path, follow_symlinks=False)
            except FileNotFoundError:
                continue  # removed from the original by someone else, never by the copy: its link is its own
            if (st.st_size, st.st_mtime_ns) != (size, mtime):
                raise UntouchedError(
                    f"{path}: a file the copy at {self.root} shares with the original changed while the rehearsal "
                    "ran (written through a hard link, or by another process); check the original environment"
                )

    def to_json(self) -> dict[str, object]:
        return {
            "root": str(self.root),
            "linked": self.linked,
            "copied": self.copied,
            "rewritten": self.rewritten,
            "symlinks": self.links,
            "bytes_copied": self.bytes_copied,
        }


def _prefix_pattern(prefixes: list[str]) -> re.Pattern[bytes]:
    # The prefix itself, not a longer name beginning with it (/opt/env2 when the prefix is /opt/env).
    alternatives = b"|".join(re.escape(p.encode()) for p in sorted(set(prefixes), key=len, reverse=True))
    return re.compile(b"(?:" + alternatives + rb")(?![\w.-])")


def _relocatable(rel: str) -> bool:
    """Files a relocation reads for the old path: pyvenv.cfg, bin/'s scripts, site-packages' .pth files."""
    return rel == "pyvenv.cfg" or rel.startswith("bin/") or (rel.endswith(".pth") and "site-packages/" in rel)


def _copy_bytes(src: str, dst: str) -> int:
    """Copy *src* to a new file *dst*; copy_file_range first (a reflink where the filesystem has them)."""
    size = os.stat(src).st_size
    with open(src, "rb") as reader, open(dst, "xb") as writer:
        done = 0
        try:
            while done < size:
                n = os.copy_file_range(reader.fileno(), writer.fileno(), size - done)
                if n == 0:
                    break
                done += n
        except OSError:
            reader.seek(done)
            writer.seek(done)
            shutil.copyfileobj(reader, writer)
    shutil.copystat(src, dst)
    return size


def copy_environment(source: Path, root: Path, *, prefixes: list[str] | None = None) -> Copy:
    """Copy the environment at *source* to *root* (which must not exist, or be a copy this module made: it is
    replaced), sharing files by hard links, and relocate it. *prefixes*: the spellings of the original's path
    to rewrite (default: *source* and its real path)."""
    source = Path(os.path.abspath(source))
    root = Path(os.path.abspath(root))
    if root == source or root.is_relative_to(source):
        raise UsageError(f"{root}: the copy cannot be inside the environment it copies ({source})")
    remove_copy(root)
    spelled = prefixes or [str(source), os.path.realpath(source)]
    pattern = _prefix_pattern(spelled)
    new = str(root).encode()
    out = Copy(source=source, root=root)
    root.mkdir(parents=True)
    (root / STAMP).write_text(f"a rehearsal's copy of {source}\n", encoding="utf-8")
    can_link = True
    for folder, dirs, files in os.walk(source):
        rel_dir = os.path.relpath(folder, source)
        target_dir = root if rel_dir == "." else root / rel_dir
        for d in list(dirs):
            src = os.path.join(folder, d)
            if os.path.islink(src):  # a link to a folder: copied as a link, never walked
                dirs.remove(d)
                files.append(d)
                continue
            os.mkdir(target_dir / d)
            shutil.copystat(src, target_dir / d)
        for f in files:
            src = os.path.join(folder, f)
            dst = str(target_dir / f)
            rel = f if rel_dir == "." else f"{rel_dir}/{f}"
            st = os.lstat(src)
            if os.path.islink(src):
                link = os.readlink(src)
                moved = pattern.sub(new, link.encode()).decode() if os.path.isabs(link) else link
                os.symlink(moved, dst)
                out.links += 1
                continue
            if not os.path.isfile(src):
                continue  # a socket or fifo: nothing an interpreter reads
            if _relocatable(rel) and st.st_size <= _TEXT_LIMIT:
                with open(src, "rb") as fh:
                    data = fh.read()
                if b"\0" not in data[:8192] and pattern.search(data):
                    with open(dst, "xb") as fh:
                        fh.write(pattern.sub(new, data))
                    shutil.copystat(src, dst)
                    out.rewritten += 1
                    continue
            if can_link:
                try:
                    os.link(src, dst)
                except OSError as exc:
                    if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
                        raise
                    can_link = exc.errno == errno.EMLINK  # too many links to this one file: others may link
                else:
                    out.linked += 1
                    out.shared[src] = (st.st_size, st.st_mtime_ns)
                    continue
            out.bytes_copied += _copy_bytes(src, dst)
            out.copied += 1
    return out


def remove_copy(root: Path) -> None:
    """Remove the copy at *root*; a folder there that this module did not make is refused (UsageError)."""
    if not os.path.lexists(root):
        return
    if not (root / STAMP).is_file():
        raise UsageError(f"{root}: exists and is not a rehearsal's copy (no {STAMP}); remove it or pick another folder")
    shutil.rmtree(root)
