"""compatlab.site on real bytes: a RECORD's hash field, and what counts as an ELF file (a FIFO is none, and
reading one must not block)."""

from __future__ import annotations

import base64
import hashlib
import os
from pathlib import Path

from compatlab.site import cuda_of_torch, record_sha256, walk_modules


def test_record_sha256() -> None:
    data = b"hello"
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    assert record_sha256(f"sha256={digest}") == hashlib.sha256(data).hexdigest()
    assert record_sha256("md5=abc") is None
    assert record_sha256("") is None


def test_walk_modules_takes_elf_files_only(tmp_path: Path) -> None:
    pkg = tmp_path / "kern"
    pkg.mkdir()
    (pkg / "_ops.cpython-311-x86_64-linux-gnu.so").write_bytes(b"\x7fELF\x02\x01\x01" + bytes(57))
    (pkg / "stub.so").write_bytes(b"not an ELF file")
    os.mkfifo(pkg / "pipe.so")  # no writer: opening it for reading without O_NONBLOCK would hang
    (pkg / "empty.so").write_bytes(b"")
    assert walk_modules(tmp_path, None) == [pkg / "_ops.cpython-311-x86_64-linux-gnu.so"]


def test_cuda_of_torch() -> None:
    assert cuda_of_torch("__version__ = '2.9.1+cu130'\ncuda: Optional[str] = '13.0'\n", "2.9.1+cu130") == "13.0"
    assert cuda_of_torch(None, "2.9.1+cu128") == "12.8"
    assert cuda_of_torch("cuda = None\n", "2.9.1") is None
