"""Markdown: the compat table to paste into an issue, and the change summary a nightly job posts.

Both format a view.py RunView; nothing here decides what a cell says.

Every string from a results file goes through ``printable`` (via ``md_text``/``md_code``) before it is
written: URL credentials redacted, and characters that would hide or reorder text shown as escapes.
"""

from __future__ import annotations

import re

from compatlab.render.text import SYMBOLS, fmt_number, one_line, printable
from compatlab.render.view import CHANGE_TITLES, PERF_CHANGE, CellView, ChangeKind, RunView, Summary
from compatlab.runs.model import CELL_STATES, CellState

__all__ = ["changes_md", "md_code", "md_text", "render_markdown"]

MD_REASON_LIMIT = 120
_MD_SPECIAL = re.compile(r"([\\`*_\[\]<>|&~#!])")


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


def counts_line(summary: Summary) -> str:
    counts = summary.counts
    parts = []
    for state in CELL_STATES:
        text = f"{SYMBOLS[state]} {state} {counts[state]}"
        if state == CellState.FAIL and counts["known"]:
            text += f" ({counts['known']} known)"
        parts.append(text)
    if summary.older:
        parts.append(f"{summary.older} from older runs (marked *from run …*)")
    return " · ".join(parts)


def _figures_text(cell: CellView) -> str:
    figs = cell.figures
    shown = cell.headline
    more = f", +{len(figs) - len(shown)} more" if len(figs) > len(shown) else ""
    return ", ".join(f"{name} {fmt_number(v)}" for name, v in shown.items()) + more


def md_cell(cell: CellView | None) -> str:
    """One grid slot: symbol and word, then the culprit stage and its reason for non-green cells."""
    if cell is None:
        return " "
    if cell.state == CellState.NA:
        return SYMBOLS[CellState.NA]
    word = "known fail" if cell.known else cell.state
    text = f"{SYMBOLS[cell.state]} {word}"
    if cell.result.unexpected:
        text += " *(unexpected)*"
    if cell.shipped:
        text += " *(shipped together)*"
    if cell.forced:
        text += " *(forced)*"
    if cell.result.run:
        text += f" *(from run {md_text(cell.result.run)})*"
    if cell.state != CellState.PASS:
        stage = cell.culprit
        why = one_line(cell.reason, MD_REASON_LIMIT)
        if stage is not None:
            text += f" — **{md_text(stage.name)}**"
        if why:
            text += f": {md_code(why)}" if stage is not None else f" — {md_code(why)}"
        if len(cell.causes) > 1:
            also = "; ".join(f"{b.stage}: {b.code}" for b in cell.causes)
            text += f" *({len(cell.causes)} causes: {md_text(also)})*"
    figs = _figures_text(cell)
    if figs:
        text += f" ({md_text(figs)})"
    return text


def answers_md(view: RunView) -> list[str]:
    """The answers above the grid, as Markdown lines."""
    found = view.answers
    if found is None:
        return []
    lines = ["", "## Answers", ""]
    if found.newest is None:
        lines.append("**Newest working stack:** none: no cell passed.")
    else:
        cell = found.newest
        state = "green" if cell.state == CellState.PASS else "amber: no GPU stage ran here"
        marks = (" *(shipped together)*" if cell.shipped else "") + (" *(forced)*" if cell.forced else "")
        lines.append(f"**Newest working stack** ({state}): {md_text(cell.label)}{marks}")
        if cell.forced:
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


def by_cause_md(view: RunView) -> list[str]:
    """The red cells grouped by cause (incell/causes.py): what to fix first, and where."""
    if not view.by_cause:
        return []
    lines = ["", "## Red cells by cause", ""]
    for code, title, cells in view.by_cause:
        names = ", ".join(md_text(c.label) for c in cells)
        lines.append(
            f"- **{md_text(code)}** ({md_text(title)}): {len(cells)} cell{'s' if len(cells) != 1 else ''}: {names}"
        )
    return lines


def render_markdown(view: RunView) -> str:
    """compat.md: a heading, the run's facts, one GitHub-flavoured table per table value, a legend."""
    facts = view.summary
    title = f"compatlab: {facts.matrix}" if facts.matrix else "compatlab"
    lines = [
        f"# {md_text(title)}",
        "",
        f"Run {md_code(facts.id)} · started {md_text(facts.started)} · finished "
        f"{md_text(facts.finished)} · host {md_code(facts.host)} · {md_text(facts.gpus)} · "
        f"driver {md_text(facts.driver)}",
        "",
        counts_line(facts),
        *answers_md(view),
        *by_cause_md(view),
    ]
    for table in view.tables:
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


def _state(state: str | None) -> str:
    return f"{SYMBOLS.get(state or '', '?')} {state}" if state else "?"


def changes_md(view: RunView) -> str:
    """changes.md: what changed since the view's previous run, newly red first, then newly green, etc.

    Perf figures that moved by PERF_CHANGE or more get their own section.
    """
    if view.previous is None:
        raise ValueError("changes_md: the view has no previous run to compare with")
    changes = view.changes
    lines = [
        f"## compatlab: run {md_code(view.summary.id)} compared with {md_code(view.previous.id)}",
        "",
        counts_line(view.summary),
        "",
    ]
    if not changes:
        lines.append("No cell changed state or reason.")
    groups: dict[ChangeKind, list[str]] = {}
    for c in changes:
        name = md_text(c.label)
        why = md_code(one_line(c.new_reason, MD_REASON_LIMIT)) if c.new_reason else ""
        was = md_code(one_line(c.old_reason, MD_REASON_LIMIT)) if c.old_reason else ""
        if c.kind in (ChangeKind.NEWLY_RED, ChangeKind.STATE):
            text = f"{name}: {_state(c.old_state)} → {_state(c.new_state)}" + (f" — {why}" if why else "")
        elif c.kind == ChangeKind.NEWLY_GREEN:
            text = f"{name}: {_state(c.old_state)} → {_state(c.new_state)}" + (f" (was {was})" if was else "")
        elif c.kind == ChangeKind.REASON:
            text = f"{name} ({_state(c.new_state)}): {was or '(none)'} → {why or '(none)'}"
        elif c.kind == ChangeKind.NEW:
            text = f"{name}: {_state(c.new_state)}" + (f" — {why}" if why and c.new_state != CellState.PASS else "")
        else:
            text = f"{name} (was {_state(c.old_state)})"
        groups.setdefault(c.kind, []).append(f"- {text}")
    for kind, items in groups.items():
        lines += [f"### {CHANGE_TITLES[kind]} ({len(items)})", "", *items, ""]
    perf = [
        f"- {md_text(m.label)}: {md_text(m.name)} {fmt_number(m.before)} → {fmt_number(m.after)} "
        f"({(m.after - m.before) / abs(m.before) * 100:+.0f}%)"
        for m in view.moves
    ]
    if perf:
        lines += [f"### Perf figures that moved {PERF_CHANGE:.0%} or more ({len(perf)})", "", *perf, ""]
    return "\n".join(lines).rstrip("\n") + "\n"
