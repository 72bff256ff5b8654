"""HTML: one self-contained page per run (inline CSS, a little inline JS), and the run index.

Formats a view.py RunView; nothing here decides what a cell says. Every string that came from a
results file goes through ``_e`` before it reaches the page: URL credentials redacted and hidden
characters made visible (``text.printable``), then html.escape.
"""

from __future__ import annotations

import itertools
import json
import operator
from collections.abc import Sequence
from html import escape
from typing import Any

from compatlab.render._assets import CSS, JS
from compatlab.render.text import SYMBOLS, fmt_number, one_line, printable
from compatlab.render.view import (
    CHANGE_TITLES,
    CellView,
    Change,
    ChangeKind,
    IndexEntry,
    RunRef,
    RunView,
    Summary,
    TableView,
)
from compatlab.runs.model import CELL_STATES, SCHEMA, CellState, StageResult

__all__ = ["render_html", "render_index"]

LIST_LIMIT = 60
# Stage-detail keys that hold logs: shown as text blocks rather than inside the JSON.
LOG_KEYS = ("log", "logs", "log_path", "log_paths", "log_tail", "stdout", "stderr", "output", "traceback")
CHANGE_BADGES = {
    ChangeKind.NEWLY_RED: ("▼ red", "newly red"),
    ChangeKind.NEWLY_GREEN: ("▲ green", "newly green"),
    ChangeKind.REASON: ("≠ reason", "reason changed"),
    ChangeKind.STATE: ("Δ state", "state changed"),
    ChangeKind.NEW: ("new", "new cell"),
    ChangeKind.REMOVED: ("removed", "removed cell"),
}


def _e(value: object) -> str:
    return escape(printable(str(value)), quote=True)


def _state_class(state: str) -> str:
    return "s-na" if state == CellState.NA else f"s-{state}"


def _page(title: str, body: str, nav: Sequence[tuple[str, str]] = (), brand: str = "") -> str:
    links = "".join(f'<a href="{_e(href)}">{_e(text)}</a>' for text, href in nav)
    return (
        '<!doctype html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{_e(title)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n"
        f'<header class="top"><div class="brand">compatlab<span>{_e(brand)}</span></div>'
        f"<nav>{links}</nav></header>\n<main>\n{body}\n</main>\n<script>{JS}</script>\n</body>\n</html>\n"
    )


def sparkline(values: Sequence[float], name: str, *, width: int = 54, height: int = 14) -> str:
    """An inline SVG line of *values* (oldest first); empty for fewer than two points."""
    if len(values) < 2:
        return ""
    lo, hi = min(values), max(values)
    span = (hi - lo) or 1.0
    step = (width - 2) / (len(values) - 1)
    # A flat series sits in the middle rather than on the floor.
    pts = [
        (1 + i * step, height / 2 if hi == lo else height - 1 - (v - lo) / span * (height - 2))
        for i, v in enumerate(values)
    ]
    points = " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)
    text = f"{name} over the last {len(values)} runs: " + ", ".join(fmt_number(v) for v in values)
    x, y = pts[-1]
    return (
        f'<svg class="spark" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="{_e(text)}"><title>{_e(text)}</title>'
        f'<polyline fill="none" stroke="currentColor" stroke-width="1.2" points="{points}"/>'
        f'<circle cx="{x:.1f}" cy="{y:.1f}" r="1.8" fill="currentColor"/></svg>'
    )


def _figs(cell: CellView) -> str:
    """The headline figures with their sparklines; the panel lists them all."""
    figs, series = cell.figures, cell.series
    if not figs:
        return ""
    items = "".join(
        f'<span title="{_e(name)}">{_e(name)} <b>{_e(fmt_number(v))}</b>{sparkline(series.get(name, ()), name)}</span>'
        for name, v in cell.headline.items()
    )
    more = len(figs) - len(cell.headline)
    extra = f'<span class="muted">+{more} more</span>' if more > 0 else ""
    return f'<div class="figs">{items}{extra}</div>'


def _figs_table(cell: CellView) -> str:
    figs, series = cell.figures, cell.series
    if not figs:
        return ""
    rows = "".join(
        f'<tr><td>{_e(name)}</td><td class="secs">{_e(fmt_number(v))}</td>'
        f"<td>{sparkline(series.get(name, ()), name, width=90)}</td></tr>"
        for name, v in figs.items()
    )
    return (
        '<h4>Perf figures</h4><table class="stages"><thead><tr><th>figure</th><th>value</th>'
        f"<th>recent runs</th></tr></thead><tbody>{rows}</tbody></table>"
    )


def _value(value: Any) -> str:
    """A stage-detail value: short scalars inline, lists as lists, long text and the rest preformatted."""
    if isinstance(value, str):
        if "\n" in value or len(value) > 100:
            return f"<pre>{_e(value)}</pre>"
        return f"<code>{_e(value)}</code>"
    if value is None or isinstance(value, bool | int | float):
        return f"<code>{_e(json.dumps(value))}</code>"
    if isinstance(value, list) and all(isinstance(v, str | int | float) for v in value):
        items = "".join(f"<li><code>{_e(v)}</code></li>" for v in value[:LIST_LIMIT])
        more = f'<li class="muted">… and {len(value) - LIST_LIMIT} more</li>' if len(value) > LIST_LIMIT else ""
        return f"<ul>{items}{more}</ul>" if value else '<span class="muted">(none)</span>'
    return f"<pre>{_e(json.dumps(value, indent=2, ensure_ascii=False, default=str))}</pre>"


def _log(value: Any) -> str:
    if isinstance(value, list):
        return "".join(_log(v) for v in value)
    if isinstance(value, str) and "\n" not in value:
        return f"<div><code>{_e(value)}</code></div>"  # a path: shown as text, it lives on the lab's disk
    return f"<pre>{_e(value if isinstance(value, str) else json.dumps(value, indent=2, default=str))}</pre>"


def _stage_details(stage: StageResult) -> str:
    if not stage.details:
        return ""
    rows = []
    for key, value in stage.details.items():
        body = _log(value) if key in LOG_KEYS else _value(value)
        rows.append(f"<dt>{_e(key)}</dt><dd>{body}</dd>")
    return (
        f'<details class="sub"><summary>{_e(stage.name)} details</summary>'
        f'<dl class="details">{"".join(rows)}</dl></details>'
    )


def _panel(view: CellView) -> str:
    cell, change = view.result, view.change
    parts = [f'<p><b>{_e(view.label)}</b></p><p class="muted">cell <code>{_e(cell.id)}</code></p>']
    if cell.expected:
        what = f"expected {cell.expected.state}"
        why = cell.expected.reason
        tag = " — <b>unexpected</b>: the result differs" if cell.unexpected else ""
        parts.append(f"<p>{_e(what)}{': ' + _e(why) if why else ''}{tag}</p>")
    elif cell.unexpected:
        parts.append("<p><b>unexpected</b> result</p>")
    if change is not None and change.kind != ChangeKind.NEW:
        was = f"was {change.old_state}" + (f": {one_line(change.old_reason)}" if change.old_reason else "")
        parts.append(f'<p class="muted">{_e(CHANGE_TITLES[change.kind])} — {_e(was)}</p>')
    if cell.state == CellState.NA:
        parts.append(f"<p>{_e(cell.reason or 'excluded by the matrix')}</p>")
    if cell.stages:
        rows = "".join(
            f"<tr><td>{_e(s.name)}{'' if s.required else ' <span class=muted>(optional)</span>'}</td>"
            f'<td class="ss-{_e(s.state)}">{_e(s.state)}</td><td class="secs">{s.seconds:.1f}s</td>'
            f'<td class="reason">{_e(s.reason)}</td></tr>'
            for s in cell.stages
        )
        parts.append(
            '<table class="stages"><thead><tr><th>stage</th><th>state</th><th>time</th>'
            f"<th>reason</th></tr></thead><tbody>{rows}</tbody></table>"
        )
        parts += [_stage_details(s) for s in cell.stages]
    parts.append(_figs_table(view))
    cmd = view.install_command
    if cmd or cell.install is not None:
        parts.append("<h4>Install</h4>")
        if cmd:
            parts.append(f"<pre>{_e(cmd)}</pre>")
        rest = {k: v for k, v in (cell.install.to_json() if cell.install else {}).items() if k != "argv"}
        if rest:
            rows = "".join(f"<dt>{_e(k)}</dt><dd>{_value(v)}</dd>" for k, v in rest.items())
            parts.append(f'<dl class="details">{rows}</dl>')
    if cell.freeze:
        parts.append(
            f'<details class="sub"><summary>freeze ({len(cell.freeze)} packages)</summary>'
            f"<pre>{_e(chr(10).join(cell.freeze))}</pre></details>"
        )
    meta = [
        f"started {cell.started}" if cell.started else "",
        f"finished {cell.finished}" if cell.finished else "",
        f"{cell.seconds:.1f}s" if cell.seconds else "",
        f"{cell.attempts} attempts" if cell.attempts > 1 else "",
    ]
    if any(meta):
        parts.append(f'<p class="muted">{_e(" · ".join(m for m in meta if m))}</p>')
    return f'<div class="panel">{"".join(parts)}</div>'


def _badges(cell: CellView, change: Change | None) -> str:
    out = ""
    if cell.shipped:
        title = f"{cell.shipped}'s own pinned stack"
        out += f'<span class="tag shipped" title="{_e(title)}">shipped together</span>'
    if cell.forced:
        title = "installed with the axis pins as overrides: " + ("; ".join(cell.forced_marks) or "pins unknown")
        out += f'<span class="tag forced" title="{_e(title)}">forced</span>'
    if cell.known:
        out += '<span class="tag known" title="the matrix expects this cell to fail">known</span>'
    if cell.result.run:
        title = f"the newest run did not run this cell: this is its result of run {cell.result.run}"
        out += f'<span class="tag older" title="{_e(title)}">run {_e(cell.result.run)}</span>'
    if cell.result.unexpected:
        title = "the result differs from what the matrix expects"
        out += f'<span class="tag unexpected" title="{title}">unexpected</span>'
    if change is not None:
        text, title = CHANGE_BADGES[change.kind]
        if change.old_state:
            title += f" (was {change.old_state})"
        out += f'<span class="tag chg chg-{change.kind}" title="{_e(title)}">{_e(text)}</span>'
    return out


def _cell(cell: CellView | None) -> str:
    if cell is None:
        return '<td class="cell s-none" title="no result for this combination in this run">·</td>'
    change = cell.change
    classes = ["cell", _state_class(cell.state)]
    if cell.known:
        classes.append("known")
    if change is not None:
        classes.append("changed")
    attrs = f'class="{" ".join(classes)}" id="c-{_e(cell.id)}" data-state="{_e(cell.state)}"'
    if cell.state == CellState.NA:
        why = cell.result.reason or "excluded by the matrix"
        return (
            f'<td {attrs} title="n/a: {_e(why)}"><div class="line">'
            f'<span class="st">{SYMBOLS[CellState.NA]} n/a</span>{_badges(cell, change)}</div></td>'
        )
    # A known fail says so in its tag.
    state = f'<span class="st">{SYMBOLS[cell.state]} {_e(cell.state)}</span>'
    head = f'<div class="line">{state}{_badges(cell, change)}</div>'
    why = ""
    if cell.state != CellState.PASS:
        stage, text = cell.culprit, one_line(cell.reason)
        where = f"<b>{_e(stage.name)}</b>{': ' if text else ''}" if stage is not None else ""
        why = f'<div class="why" title="{_e(cell.reason)}">{where}{_e(text)}</div>' if where or text else ""
        if len(cell.causes) > 1:
            listed = "; ".join(f"{b.stage}: {b.code}" for b in cell.causes)
            why += f'<div class="causes" title="{_e(listed)}">{len(cell.causes)} causes: {_e(listed)}</div>'
    warned = cell.warnings
    if warned:
        more = f" (+{len(warned) - 1} more)" if len(warned) > 1 else ""
        first = warned[0]
        why += (
            f'<div class="warns" title="{_e(first.reason)}">warning · <b>{_e(first.name)}</b>: '
            f"{_e(one_line(first.reason))}{_e(more)}</div>"
        )
    summary = head + why + _figs(cell)
    return f"<td {attrs}><details><summary>{summary}</summary>{_panel(cell)}</details></td>"


def _header(table: TableView) -> str:
    depth = max(len(table.col_axes), 1)
    corner = " · ".join(f'<span class="ax">{_e(a)}</span>' for a in table.row_axes)
    rows = []
    for level in range(depth):
        cells = (
            []
            if level
            else [f'<th class="corner" rowspan="{depth}" colspan="{max(len(table.row_axes), 1)}">{corner}</th>']
        )
        if table.col_axes:
            axis = table.col_axes[level]
            for prefix, group in itertools.groupby(table.col_keys, key=operator.itemgetter(slice(0, level + 1))):
                span = len(list(group))
                scope = "colgroup" if span > 1 else "col"
                name = f'<span class="ax">{_e(axis)}</span>{_e(prefix[-1])}'
                cells.append(f'<th scope="{scope}" colspan="{span}">{name}</th>')
        rows.append(f"<tr>{''.join(cells)}</tr>")
    return f"<thead>{''.join(rows)}</thead>"


def _table(table: TableView) -> str:
    body = []
    cols = table.col_keys or ((),)
    for row in table.row_keys:
        heads = "".join(f'<th scope="row">{_e(v or "—")}</th>' for v in row) or "<th></th>"
        tds = "".join(_cell(table.slots.get((row, col))) for col in cols)
        body.append(f"<tr>{heads}{tds}</tr>")
    anchor = "t-" + "-".join(table.key) if table.key else "t-all"
    return (
        f'<section><h2 id="{_e(anchor)}">{_e(table.title)}</h2><div class="scroll"><table class="grid">'
        f"{_header(table)}<tbody>{''.join(body)}</tbody></table></div></section>"
    )


def _counts(summary: Summary) -> str:
    counts = summary.counts
    chips = []
    for state in CELL_STATES:
        n = counts[state]
        extra = (
            f' <span class="muted">({counts["known"]} known)</span>'
            if state == CellState.FAIL and counts["known"]
            else ""
        )
        chips.append(f'<li class="chip {_state_class(state)}">{SYMBOLS[state]} {_e(state)} <b>{n}</b>{extra}</li>')
    if summary.older:
        title = "cells the newest run did not run: each shows its result of an older run"
        chips.append(f'<li class="chip older" title="{title}">{summary.older} from older runs</li>')
    return f'<ul class="counts">{"".join(chips)}</ul>'


def _changes(changes: Sequence[Change], previous: RunRef | None) -> str:
    if previous is None:
        return ""
    if not changes:
        return (
            f'<p class="muted">No cell changed since run <code>{_e(previous.id)}</code> ({_e(previous.started)}).</p>'
        )
    items = []
    for c in changes:
        text, _ = CHANGE_BADGES[c.kind]
        name = _e(c.label) if c.kind == ChangeKind.REMOVED else f'<a href="#c-{_e(c.cell_id)}">{_e(c.label)}</a>'
        states = " → ".join(_e(s) for s in (c.old_state, c.new_state) if s)
        if c.kind == ChangeKind.REASON:
            why = f"{one_line(c.old_reason, 80)} → {one_line(c.new_reason, 80)}"
        elif c.kind in (ChangeKind.NEWLY_GREEN, ChangeKind.REMOVED):
            why = f"was: {one_line(c.old_reason)}" if c.old_reason else ""
        else:
            why = one_line(c.new_reason)
        items.append(
            f'<li><span class="tag chg chg-{c.kind}">{_e(text)}</span>{name}'
            f'<span class="muted">{states}</span><span class="why" title="{_e(why)}">{_e(why)}</span></li>'
        )
    opened = " open" if len(changes) <= 20 else ""
    return (
        f'<details class="changes"{opened}><summary>{len(changes)} change{"s" if len(changes) != 1 else ""} '
        f"since run <code>{_e(previous.id)}</code> ({_e(previous.started)})</summary>"
        f"<ul>{''.join(items)}</ul></details>"
    )


_LEGEND = (
    '<div class="legend"><span><i class="sw s-pass"></i>✓ pass</span>'
    '<span><i class="sw s-fail"></i>✗ fail: incompatible</span>'
    '<span><i class="sw known"></i><span class="tag known">known</span> fail the matrix expects</span>'
    '<span><i class="sw s-partial"></i>◐ partial: GPU stages not run here</span>'
    '<span><i class="sw s-error"></i>⚠ error: lab or infrastructure</span>'
    '<span><i class="sw s-na"></i>– n/a: excluded by the matrix</span>'
    "<span>Click a cell for stages, install command, freeze.</span></div>"
)
_TOOLS = (
    '<div class="tools" id="tools" hidden><button type="button" id="expand-all">Expand all</button>'
    '<button type="button" id="collapse-all">Collapse all</button><label>Highlight <select id="focus">'
    '<option value="">all cells</option><option value="problems">not green</option>'
    '<option value="red">red only</option><option value="changed">changed</option></select></label></div>'
)


def _runs_table(entries: Sequence[IndexEntry]) -> str:
    rows = []
    for entry in entries:
        facts = entry.summary
        counts = facts.counts
        chips = "".join(
            f'<span class="chip {_state_class(s)}">{SYMBOLS[s]} <b>{counts[s]}</b></span> '
            for s in CELL_STATES
            if counts[s]
        )
        if entry.changes is None:
            changed = '<span class="muted">first run</span>'
        else:
            by_kind = {k: sum(1 for c in entry.changes if c.kind == k) for k in CHANGE_BADGES}
            changed = (
                " ".join(
                    f'<span class="tag chg chg-{k}">{_e(CHANGE_BADGES[k][0])} {n}</span>'
                    for k, n in by_kind.items()
                    if n
                )
                or '<span class="muted">no change</span>'
            )
        rows.append(
            f'<tr><td><a href="{_e(entry.href)}"><code>{_e(facts.id)}</code></a></td>'
            f"<td>{_e(facts.started)}</td><td>{_e(facts.matrix)}</td><td>{_e(facts.host)}</td>"
            f"<td>{chips}</td><td>{changed}</td></tr>"
        )
    return (
        '<div class="scroll"><table class="runs"><thead><tr><th>run</th><th>started</th><th>matrix</th>'
        f"<th>host</th><th>cells</th><th>changes</th></tr></thead><tbody>{''.join(rows)}</tbody></table></div>"
    )


def _answers(view: RunView) -> str:
    """The answers above the grid."""
    found = view.answers
    if found is None:
        return ""
    items = []
    if found.newest is None:
        items.append("<p><b>Newest working stack:</b> none: no cell passed.</p>")
    else:
        cell = found.newest
        marks = _badges(cell, None)
        state = "green" if cell.state == CellState.PASS else "amber: no GPU stage ran here"
        items.append(
            f'<p><b>Newest working stack</b> ({_e(state)}): <a href="#c-{_e(cell.id)}">{_e(cell.label)}</a> {marks}</p>'
        )
        if cell.forced:
            items.append(
                "<p>No working stack installs without force: this one breaks "
                + (_e("; ".join(found.breaks)) if found.breaks else "pins the lock did not know")
                + ".</p>"
            )
        if found.command:
            items.append(f"<pre>{_e(found.command)}</pre>")
    if found.neighbours:
        rows = "".join(
            f'<li><a href="#c-{_e(n.red_id)}">{_e(n.sentence)}</a>'
            + (f' → <a href="#c-{_e(n.green_id)}">{_e(n.green_id)}</a>' if n.green_id is not None else "")
            + "</li>"
            for n in found.neighbours
        )
        items.append(f"<p><b>Each red cell's nearest working neighbour</b> (one axis changed):</p><ul>{rows}</ul>")
    return f'<section class="answers"><h2 id="answers">Answers</h2>{"".join(items)}</section>'


def _by_cause(view: RunView) -> str:
    """The red cells grouped by cause (incell/causes.py), most frequent first: what to fix first, and where."""
    if not view.by_cause:
        return ""
    rows = "".join(
        f"<li><b>{_e(code)}</b> ({_e(title)}): {len(cells)} cell{'s' if len(cells) != 1 else ''}: "
        + ", ".join(f'<a href="#c-{_e(c.id)}">{_e(c.label)}</a>' for c in cells)
        + "</li>"
        for code, title, cells in view.by_cause
    )
    return f'<section class="causes"><h2 id="causes">Red cells by cause</h2><ul>{rows}</ul></section>'


def render_html(view: RunView, *, nav: Sequence[tuple[str, str]] = (), runs: Sequence[IndexEntry] = ()) -> str:
    """The run's page: facts, state counts, changes since the previous run, one grid per table, a legend.

    *runs*, when given, adds a list of runs at the bottom (the published front page).
    """
    facts = view.summary
    fact_items = [
        ("matrix", facts.matrix),
        ("started", facts.started),
        ("finished", facts.finished),
        ("host", facts.host),
        ("GPUs", facts.gpus),
        ("driver", facts.driver),
        ("platform", facts.platform),
        ("python", facts.python),
    ]
    dl = "".join(f"<div><dt>{_e(k)}</dt><dd>{_e(v)}</dd></div>" for k, v in fact_items if v)
    body = [
        f'<h1>Run <code>{_e(facts.id)}</code></h1><dl class="facts">{dl}</dl>',
        f'<div class="bar">{_counts(facts)}{_TOOLS}</div>',
        _answers(view),
        _by_cause(view),
        _changes(view.changes, view.previous),
        _LEGEND,
        *(_table(t) for t in view.tables),
    ]
    if not view.tables:
        body.append('<p class="muted">This run has no cells yet.</p>')
    if runs:
        body.append(f'<h2 id="runs">All runs</h2>{_runs_table(runs)}')
    body.append(
        f'<footer>Rendered from <a href="results.json">results.json</a> (schema <code>{_e(SCHEMA)}</code>)'
        ' · <a href="compat.md">compat.md</a> · axes: '
        f"{_e(', '.join(view.axis_titles))}</footer>"
    )
    title = f"compatlab · {facts.matrix} · run {facts.id}" if facts.matrix else f"compatlab · run {facts.id}"
    return _page(title, "\n".join(b for b in body if b), nav, brand=facts.matrix)


def render_index(entries: Sequence[IndexEntry], *, nav: Sequence[tuple[str, str]] = ()) -> str:
    """A page listing runs, newest first as given, each linking to its own page."""
    body = f'<h1>Runs</h1><p class="muted">{len(entries)} run{"s" if len(entries) != 1 else ""}.</p>'
    return _page("compatlab · runs", body + _runs_table(entries), nav, brand="runs")
