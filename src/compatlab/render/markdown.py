"""Markdown: the compat table to paste into an issue, and the change summary a nightly job posts.

Every string from a results file goes through ``printable`` (via ``md_text``/``md_code``) before it is
written: URL credentials redacted, and characters that would hide or reorder text shown as escapes.
"""

from __future__ import annotations

import collections
import re
import unicodedata
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from compatlab.render._grid import (
    SYMBOLS,
    Run,
    culprit,
    figures,
    fmt_number,
    headline,
    is_known,
    label,
    layout,
    load,
    one_line,
    reason,
    run_from_json,
)
from compatlab.render.answers import answers, is_forced, shipped
from compatlab.render.history import CHANGE_TITLES, diff_runs
from compatlab.runs.model import CELL_STATES, CellResult
from compatlab.urls import redact_text

__all__ = ["compat_md_diff", "printable", "render_markdown"]

MD_REASON_LIMIT = 120
# Relative change of a perf figure worth a line in the nightly summary.
PERF_CHANGE = 0.05
_MD_SPECIAL = re.compile(r"([\\`*_\[\]<>|&~#!])")
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


def md_text(text: str) -> str:
    """Plain text safe in a Markdown table cell: punctuation escaped, one line."""
    return _MD_SPECIAL.sub(r"\\\1", re.sub(r"\s+", " ", printable(text)).strip())


def md_code(text: str) -> str:
    """A code span holding *text* literally, also inside a table (``|`` escaped as GFM wants)."""
    text = re.sub(r"\s+", " ", printable(text)).strip()
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") or longest else ""
    return f"{fence}{pad}{text.replace('|', chr(92) + '|')}{pad}{fence}"


def _gpus(host: Mapping[str, Any]) -> str:
    gpus = host.get("gpus")
    if not isinstance(gpus, list) or not gpus:
        return "no GPU"
    names = [str(g.get("name", g)) if isinstance(g, dict) else str(g) for g in gpus]
    return ", ".join(f"{n}× {name}" for name, n in collections.Counter(names).items())


def run_summary(run: Run) -> dict[str, str]:
    """The header facts, as plain strings (callers escape)."""
    host = run.host
    return {
        "run": run.id,
        "matrix": run.matrix_name,
        "started": run.started or "unknown",
        "finished": run.finished or "in progress",
        "host": str(host.get("hostname") or "unknown host"),
        "gpus": _gpus(host),
        "driver": str(host.get("driver") or "no driver"),
        "platform": str(host.get("platform") or ""),
        "python": str(host.get("python") or ""),
    }


def counts_line(run: Run) -> str:
    counts = run.counts()
    parts = []
    for state in CELL_STATES:
        text = f"{SYMBOLS[state]} {state} {counts[state]}"
        if state == "fail" and counts["known"]:
            text += f" ({counts['known']} known)"
        parts.append(text)
    older = sum(1 for c in run.cells if c.run)
    if older:
        parts.append(f"{older} from older runs (marked *from run …*)")
    return " · ".join(parts)


def _figures_text(cell: CellResult) -> str:
    figs = figures(cell)
    shown = headline(figs)
    more = f", +{len(figs) - len(shown)} more" if len(figs) > len(shown) else ""
    return ", ".join(f"{name} {fmt_number(v)}" for name, v in shown.items()) + more


def md_cell(cell: CellResult | None) -> str:
    """One grid slot: symbol and word, then the culprit stage and its reason for non-green cells."""
    if cell is None:
        return " "
    if cell.state == "n/a":
        return SYMBOLS["n/a"]
    word = "known fail" if is_known(cell) else cell.state
    text = f"{SYMBOLS[cell.state]} {word}"
    if cell.unexpected:
        text += " *(unexpected)*"
    if shipped(cell):
        text += " *(shipped together)*"
    if is_forced(cell):
        text += " *(forced)*"
    if cell.run:
        text += f" *(from run {md_text(cell.run)})*"
    if cell.state != "pass":
        stage = culprit(cell)
        why = one_line(reason(cell), MD_REASON_LIMIT)
        if stage is not None:
            text += f" — **{md_text(stage.name)}**"
        if why:
            text += f": {md_code(why)}" if stage is not None else f" — {md_code(why)}"
    figs = _figures_text(cell)
    if figs:
        text += f" ({md_text(figs)})"
    return text


def answers_md(run: Run) -> list[str]:
    """The answers above the grid (render/answers.py), as Markdown lines."""
    if not run.cells:
        return []
    found = answers(run)
    lines = ["", "## Answers", ""]
    if found.newest is None:
        lines.append("**Newest working stack:** none: no cell passed.")
    else:
        cell = found.newest
        state = "green" if cell.state == "pass" else "amber: no GPU stage ran here"
        marks = (" *(shipped together)*" if shipped(cell) else "") + (" *(forced)*" if is_forced(cell) else "")
        lines.append(f"**Newest working stack** ({state}): {md_text(label(cell.axes))}{marks}")
        if is_forced(cell):
            lines += [
                "",
                "No working stack installs without force: this one breaks "
                + (md_text("; ".join(found.breaks)) if found.breaks else "pins the lock did not know")
                + ".",
            ]
        if found.command:
            lines += ["", "```sh", printable(found.command), "```"]
    if found.neighbours:
        lines += ["", "**Each red cell's nearest working neighbour** (one axis changed):", ""]
        lines += [f"- {md_text(n.sentence)}" for n in found.neighbours]
    return lines


def render_markdown(run: Run) -> str:
    """compat.md: a heading, the run's facts, one GitHub-flavoured table per table value, a legend."""
    facts = run_summary(run)
    title = f"compatlab: {facts['matrix']}" if facts["matrix"] else "compatlab"
    lines = [
        f"# {md_text(title)}",
        "",
        f"Run {md_code(facts['run'])} · started {md_text(facts['started'])} · finished "
        f"{md_text(facts['finished'])} · host {md_code(facts['host'])} · {md_text(facts['gpus'])} · "
        f"driver {md_text(facts['driver'])}",
        "",
        counts_line(run),
        *answers_md(run),
    ]
    for table in layout(run):
        lines += ["", f"## {md_text(table.title)}", ""]
        head = [md_text(" · ".join(table.row_axes)) or " "]
        head += [
            md_text(" · ".join(f"{a} {v}" for a, v in zip(table.col_axes, col, strict=True))) for col in table.col_keys
        ]
        lines.append("| " + " | ".join(head) + " |")
        lines.append("|" + "|".join(" --- " for _ in head) + "|")
        for row in table.row_keys:
            cells = [f"**{md_text(' · '.join(row))}**"]
            cells += [md_cell(table.slots.get((row, col))) for col in table.col_keys]
            lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "✓ pass · ✗ fail (incompatible; the stage and reason follow) · ◐ partial (GPU stages could not run "
        "on this machine) · ⚠ error (the lab or infrastructure failed) · – n/a (excluded by the matrix) · "
        "*known fail*: expected by the matrix",
        "",
    ]
    return "\n".join(lines)


# --- the nightly change summary ----------------------------------------------------------------------


def _as_run(value: Run | Mapping[str, Any] | Path, what: str) -> Run:
    if isinstance(value, Run):
        return value
    if isinstance(value, Path):
        return load(value)
    return run_from_json(value, what)


def _state(state: str | None) -> str:
    return f"{SYMBOLS.get(state or '', '?')} {state}" if state else "?"


def _perf_lines(old: Run, new: Run) -> list[str]:
    lines = []
    before = old.by_id
    for cell in new.cells:
        prev = before.get(cell.id)
        if prev is None:
            continue
        was = figures(prev)
        for name, value in figures(cell).items():
            base = was.get(name)
            if base is None or base == 0 or abs(value - base) / abs(base) < PERF_CHANGE:
                continue
            pct = (value - base) / abs(base) * 100
            lines.append(
                f"- {md_text(label(cell.axes))}: {md_text(name)} {fmt_number(base)} → {fmt_number(value)} ({pct:+.0f}%)"
            )
    return lines


def compat_md_diff(old_results: Run | Mapping[str, Any] | Path, new_results: Run | Mapping[str, Any] | Path) -> str:
    """A Markdown summary of what changed between two runs: newly red first, then newly green, etc.

    Each argument is a results.json path, its loaded JSON (checked by ``runs.model.Results.from_json``), or a
    loaded Run.
    Perf figures that moved by 5% or more get their own section.
    """
    old = _as_run(old_results, "old results")
    new = _as_run(new_results, "new results")
    changes = diff_runs(old, new)
    lines = [f"## compatlab: run {md_code(new.id)} compared with {md_code(old.id)}", "", counts_line(new), ""]
    if not changes:
        lines.append("No cell changed state or reason.")
    groups: dict[str, list[str]] = {}
    for c in changes:
        name = md_text(c.label)
        why = md_code(one_line(c.new_reason, MD_REASON_LIMIT)) if c.new_reason else ""
        was = md_code(one_line(c.old_reason, MD_REASON_LIMIT)) if c.old_reason else ""
        if c.kind in ("newly-red", "state"):
            text = f"{name}: {_state(c.old_state)} → {_state(c.new_state)}" + (f" — {why}" if why else "")
        elif c.kind == "newly-green":
            text = f"{name}: {_state(c.old_state)} → {_state(c.new_state)}" + (f" (was {was})" if was else "")
        elif c.kind == "reason":
            text = f"{name} ({_state(c.new_state)}): {was or '(none)'} → {why or '(none)'}"
        elif c.kind == "new":
            text = f"{name}: {_state(c.new_state)}" + (f" — {why}" if why and c.new_state != "pass" else "")
        else:
            text = f"{name} (was {_state(c.old_state)})"
        groups.setdefault(c.kind, []).append(f"- {text}")
    for kind, items in groups.items():
        lines += [f"### {CHANGE_TITLES[kind]} ({len(items)})", "", *items, ""]
    perf = _perf_lines(old, new)
    if perf:
        lines += [f"### Perf figures that moved {PERF_CHANGE:.0%} or more ({len(perf)})", "", *perf, ""]
    return "\n".join(lines).rstrip("\n") + "\n"
