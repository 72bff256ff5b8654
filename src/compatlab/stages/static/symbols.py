"""Symbol names for the messages: the function a demangled C++ symbol names, and GNU symbol versions."""

from __future__ import annotations

import re
from collections.abc import Sequence


def function_name(pretty: str) -> str | None:
    """``c10::cuda::f`` of ``void c10::cuda::f<int>(int, bool) const``; None for a non-function."""
    close = pretty.rfind(")")
    if close < 0:
        return None
    depth = 0
    start = -1
    for i in range(close, -1, -1):
        if pretty[i] == ")":
            depth += 1
        elif pretty[i] == "(":
            depth -= 1
            if depth == 0:
                start = i
                break
    if start <= 0:
        return None
    name = pretty[:start]
    depth = 0
    cut = 0
    for i, ch in enumerate(name):
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth -= 1
        elif ch == " " and depth == 0 and not name[:i].endswith("operator"):
            cut = i + 1
    return name[cut:]


def last_identifier(qualified: str) -> str:
    depth = 0
    base = []
    for ch in qualified:
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif depth == 0:
            base.append(ch)
    last = "".join(base).rsplit("::", 1)[-1]
    return last if re.fullmatch(r"[A-Za-z_]\w*", last) else ""


def _version_key(v: str) -> tuple[str, tuple[int, ...]]:
    m = re.match(r"^(.*?)(\d+(?:\.\d+)*)$", v)
    if not m:
        return v, ()
    return m.group(1), tuple(int(x) for x in m.group(2).split("."))


def symbol_offers(wanted: str, defs: Sequence[str]) -> str:
    prefix = _version_key(wanted)[0]
    same = sorted((d for d in defs if _version_key(d)[0] == prefix), key=_version_key)
    if len(same) > 3:
        return f"offers up to {same[-1]}"
    if same or defs:
        return "offers only " + ", ".join(same or sorted(defs))
    return "defines no symbol versions"
