"""Decompress a .zst file with the zstandard wheel carried beside it, for a machine without the zstd tool.

python3 scripts/device/unzstd.py WHEEL IN.zst OUT
"""

import sys
import tempfile
import zipfile

wheel, src, dst = sys.argv[1:]
where = tempfile.mkdtemp()
zipfile.ZipFile(wheel).extractall(where)
sys.path.insert(0, where)
import zstandard  # type: ignore[import-not-found]  # noqa: E402

with open(src, "rb") as f, open(dst, "wb") as out:
    zstandard.ZstdDecompressor().copy_stream(f, out)
