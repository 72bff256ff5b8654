"""Reading a file of an environment that strangers' wheels made: a regular file, and no more than a limit.

``open`` of a FIFO blocks until a writer comes (a FIFO named ``__init__.py`` or ``METADATA`` would hang the
stage forever), so the file is opened with O_NONBLOCK and checked with fstat before a byte is read; a device
or a directory is refused the same way. What is larger than *limit* is refused, not read in part (a part of
a RECORD or of a module's source read as the whole would be a wrong answer). Both failures are OSErrors, so
a caller's ``except OSError`` (a file gone, unreadable) covers them.

Standard library only: the import stage runs this inside the cell.
"""

from __future__ import annotations

import errno
import os
import stat

__all__ = ["TEXT_LIMIT", "is_elf", "read_regular", "read_text"]

# The most read of one text file of an installed distribution (torch's RECORD is ~2 MB, its largest .py ~1 MB).
TEXT_LIMIT = 64 << 20


def read_regular(path: str | os.PathLike[str], *, limit: int = TEXT_LIMIT) -> bytes:
    """The bytes of *path* (symlinks followed) if it is a regular file of at most *limit* bytes; else OSError."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file (a FIFO, a device or a directory)", str(path))
        if st.st_size > limit:
            raise OSError(errno.EFBIG, f"larger than the {limit >> 20} MiB read of one file", str(path))
        os.set_blocking(fd, True)
        chunks: list[bytes] = []
        total = 0
        while chunk := os.read(fd, min(1 << 20, limit + 1 - total)):
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:
                raise OSError(errno.EFBIG, f"larger than the {limit >> 20} MiB read of one file", str(path))
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_text(path: str | os.PathLike[str], *, limit: int = TEXT_LIMIT) -> str:
    """:func:`read_regular` decoded as UTF-8, undecodable bytes replaced (METADATA, RECORD, WHEEL)."""
    return read_regular(path, limit=limit).decode("utf-8", "replace")


def is_elf(path: str | os.PathLike[str]) -> bool:
    """Whether *path* is a regular file (symlinks followed) starting with the ELF magic; reads four bytes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        return stat.S_ISREG(os.fstat(fd).st_mode) and os.read(fd, 4) == b"\x7fELF"
    except OSError:
        return False
    finally:
        os.close(fd)
