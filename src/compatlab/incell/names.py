"""Distribution names as PEP 503 compares them, on the standard library alone (it runs in the cell).

A name's runs of ``-``, ``_`` and ``.`` are one ``-``, and case does not count: ``Flashinfer_Python``,
``flashinfer.python`` and ``flashinfer-python`` are one distribution. For a valid name this is what
``packaging.utils.canonicalize_name`` returns, which the cell may not have.
"""

from __future__ import annotations

import re

__all__ = ["canonicalize_name"]

_SEPARATORS = re.compile(r"[-_.]+")


def canonicalize_name(name: str) -> str:
    """*name* as PEP 503 compares it: ``Flashinfer_Python`` is ``flashinfer-python``."""
    return _SEPARATORS.sub("-", name).lower()
