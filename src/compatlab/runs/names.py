"""The one rule for a name that becomes a path (a run id, a shard's name): letters, digits and ``._+-``,
starting with a letter or digit, at most ``MAX`` characters. A run id of ``..``, ``/abs`` or 300 characters
would write outside reports/ and the venvs folder, or fail deep inside with a traceback; here it is one
line and exit 2, before anything is written."""

from __future__ import annotations

import re

from compatlab.errors import UsageError

__all__ = ["MAX", "check_name"]

MAX = 128
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")


def check_name(value: str, where: str) -> str:
    """*value* when it is a name (module docstring); else UsageError naming *where* it came from."""
    if len(value) > MAX:
        raise UsageError(f"{where}: a name of {len(value)} characters; at most {MAX}")
    if not _NAME.fullmatch(value) or value in (".", ".."):
        raise UsageError(
            f"{where}: {value!r} is not a name: letters, digits and . _ + - only, starting with a letter or digit "
            "(it becomes a folder under reports/runs/ and the venvs folder)"
        )
    return value
