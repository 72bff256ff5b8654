"""Text as every page shows it: state symbols, one-line reasons, numbers, and ``printable``.

Both formatters (html.py, markdown.py) and the view read these; each formatter escapes for its own
format after ``printable`` has made a string safe to show.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping

from compatlab.runs.model import CellState
from compatlab.urls import redact_text

__all__ = ["REASON_LIMIT", "SYMBOLS", "fmt_number", "one_line", "printable"]

SYMBOLS: Mapping[str, str] = {
    CellState.PASS: "✓",
    CellState.FAIL: "✗",
    CellState.PARTIAL: "◐",
    CellState.ERROR: "⚠",
    CellState.NA: "–",
}
REASON_LIMIT = 160
_SUSPECT = re.compile(r"[^\t\n\x20-\x7e]")
# Unicode categories that draw nothing of their own: controls (Cc), format characters (Cf: the bidi
# embeddings, overrides and isolates U+202A–U+202E and U+2066–U+2069, the marks U+200E/U+200F and
# U+061C, zero-width spaces and joiners), and the line and paragraph separators (Zl, Zp).
_HIDDEN = frozenset({"Cc", "Cf", "Zl", "Zp"})


def _visible(match: re.Match[str]) -> str:
    ch = match.group()
    return f"<U+{ord(ch):04X}>" if unicodedata.category(ch) in _HIDDEN else ch


def printable(text: str) -> str:
    """*text* as a page may show it: URL credentials as ``***``, and every character that would hide or
    reorder text (bidi controls, other control and format characters) as a visible ``<U+202E>``.

    Tabs and newlines stay: preformatted blocks need them, and the table helpers fold them anyway.
    """
    return _SUSPECT.sub(_visible, redact_text(text))


def one_line(text: str, limit: int = REASON_LIMIT) -> str:
    """The first non-empty line, whitespace collapsed, cut at *limit* characters with an ellipsis."""
    line = next((ln for ln in text.splitlines() if ln.strip()), "")
    line = re.sub(r"\s+", " ", line).strip()
    if len(line) > limit:
        line = line[: limit - 1].rstrip() + "…"
    return line


def fmt_number(value: float) -> str:
    """Three significant figures without exponent noise: 96, 1.07, 181, 12.5."""
    size = abs(value)
    text = f"{value:.0f}" if size >= 100 else f"{value:.1f}" if size >= 10 else f"{value:.2f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text
