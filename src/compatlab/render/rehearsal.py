"""A rehearsal on one screen, and as ``rehearsal.md`` and ``index.html`` beside its ``rehearsal.json``.

The screen (``rehearsal_lines``) is what ``compatlab rehearse`` prints: the swap (each distribution the install
changes, its build variant and CUDA), the pins it breaks, the verdict diff per module with its cause, the
verdict, and the safer command that was tried and what it kept. The Markdown and HTML say the same, with every
module listed. Strings go through ``printable`` (credentials redacted, hidden characters shown) on the way.
"""

from __future__ import annotations

from html import escape
from pathlib import Path

from compatlab.render._assets import CSS
from compatlab.render.markdown import md_code, md_text
from compatlab.render.text import printable
from compatlab.runs.rehearsal import Attempt, Change, ModuleChange, Outcome, Rehearsal

__all__ = ["change_line", "outcome_line", "rehearsal_html", "rehearsal_lines", "rehearsal_md"]

SCREEN_MODULES = 6  # modules listed on the screen per kind; rehearsal.md lists them all
SCREEN_ADDED = 8


def _variant(version: str) -> str:
    local = version.partition("+")[2]
    return f"+{local}" if local else "generic"


def change_line(c: Change) -> str:
    """``torch 2.9.1+cu130 → 2.10.0 (build +cu130 → generic; CUDA 13.0 → 12.8): flashish 0.6.0 requires torch``."""
    if not c.old:
        head = f"+ {c.name} {c.new}" + (f" (CUDA {c.new_cuda})" if c.new_cuda else "")
    elif not c.new:
        head = f"- {c.name} {c.old} (removed)"
    else:
        notes = []
        if c.old_variant != c.new_variant:
            notes.append(f"build {_variant(c.old)} → {_variant(c.new)}")
        if c.old_cuda != c.new_cuda:
            notes.append(f"CUDA {c.old_cuda or 'none'} → {c.new_cuda or 'none'}")
        head = f"{c.name} {c.old} → {c.new}" + (f" ({'; '.join(notes)})" if notes else "")
    return head + (f": {'; '.join(c.asked_by)}" if c.asked_by and c.old and c.new else "")


def _module_line(m: ModuleChange, *, was: bool = False) -> str:
    """``kernelish/_kernels.so: undefined symbol …``, the distribution named where the path does not say it;
    for a fix (*was*), why it failed before: ``torchvision — was: …``."""
    top = m.module.split("/", 1)[0].split(".", 1)[0]
    own = top.replace("_", "-").lower() == m.dist.replace("_", "-").lower()
    head = m.module + ("" if own or not m.dist else f" ({m.dist})")
    if not m.cause:
        return head
    return f"{head} — was: {m.cause}" if was else f"{head}: {m.cause}"


def outcome_line(a: Attempt) -> str:
    """What an attempt came to, in one line."""
    if a.outcome == Outcome.INSTALL_FAILS:
        return f"the install fails: {a.install.reason}; the environment would stay as it is"
    if a.outcome == Outcome.ERROR:
        why = a.judged.reason if a.judged else ""
        return "unanswered: the lab could not judge an environment" + (f" ({why})" if why else "")
    after = a.judged.state if a.judged else "?"
    if a.outcome == Outcome.BREAKS:
        n = len(a.breaks)
        what = "1 module that works now breaks" if n == 1 else f"{n} modules that work now break"
        return f"breaks: {what} (after: {after})"
    fixed = f"; {len(a.fixes)} fixed" if a.fixes else ""
    return f"safe: nothing that works now breaks (after: {after}){fixed}"


def _changes(a: Attempt) -> list[str]:
    moved = [c for c in a.changes if c.old and c.new]
    added = [c for c in a.changes if not c.old]
    removed = [c for c in a.changes if not c.new]
    lines = [f"  {change_line(c)}" for c in moved + removed]
    if added:
        shown = ", ".join(
            f"{c.name} {c.new}" + (f" (CUDA {c.new_cuda})" if c.new_cuda else "") for c in added[:SCREEN_ADDED]
        )
        more = f" and {len(added) - SCREEN_ADDED} more" if len(added) > SCREEN_ADDED else ""
        lines.append(f"  added ({len(added)}): {shown}{more}")
    return lines


def _modules(title: str, items: tuple[ModuleChange, ...], limit: int | None, *, was: bool = False) -> list[str]:
    if not items:
        return [f"{title}: none"]
    shown = items if limit is None else items[:limit]
    lines = [f"{title} ({len(items)}):", *(f"  {_module_line(m, was=was)}" for m in shown)]
    if len(shown) < len(items):
        lines.append(f"  and {len(items) - len(shown)} more (rehearsal.md lists them)")
    return lines


def _safer(r: Rehearsal) -> list[str]:
    if r.outcome != Outcome.BREAKS:
        return []
    if not r.safer:
        return [
            "safer command: none to try: nothing the install changes can be held (what breaks is what was asked for)"
        ]
    lines = []
    for a in r.safer:
        lines.append(f"tried on its own copy: {a.label}: {outcome_line(a)}")
        if a.outcome == Outcome.SAFE:
            kept = [change_line(c) for c in a.changes if c.old and c.new]
            added = [c for c in a.changes if not c.old]
            what = "; ".join(kept) + (f"; adds {len(added)}" if added else "")
            lines.append(f"  it changes: {what or 'nothing: what was asked for is already what it allows'}")
    best = r.suggested
    if best is None:
        lines.append("safer command: none found that keeps what works (none is suggested without being judged)")
    else:
        lines.append(f"run instead: {' '.join(best.command)}")
    return lines


def rehearsal_lines(r: Rehearsal) -> list[str]:
    """The screen: what the install changes, what it breaks, the verdict, and what to run instead."""
    a = r.request
    lines = [
        f"rehearsal of: {' '.join(a.command)}",
        f"  on {r.environment} (Python {r.python}; as it is: {r.original.state}), applied to a copy "
        f"({a.copy.get('linked', 0)} files shared, {a.copy.get('copied', 0)} copied, "
        f"{a.copy.get('rewritten', 0)} relocated)",
    ]
    if a.install.ok:
        lines.append(f"the install changes {len(a.changes)} distribution{'s' if len(a.changes) != 1 else ''}:")
        lines += _changes(a) or ["  nothing"]
        lines.append(f"pins it breaks ({len(a.broken_pins)}):" if a.broken_pins else "pins it breaks: none")
        lines += [f"  {p}" for p in a.broken_pins]
        lines += _modules("what worked and breaks", a.breaks, SCREEN_MODULES)
        lines += _modules("what was broken and is fixed", a.fixes, SCREEN_MODULES, was=True)
        if a.new_broken:
            lines += _modules("new, and broken", a.new_broken, SCREEN_MODULES)
        if a.gone:
            names = ", ".join(m.module for m in a.gone[:SCREEN_MODULES])
            more = f" and {len(a.gone) - SCREEN_MODULES} more" if len(a.gone) > SCREEN_MODULES else ""
            lines.append(f"no longer installed ({len(a.gone)} that loaded before): {names}{more}")
    lines.append(f"verdict: {outcome_line(a)}")
    lines += _safer(r)
    t = r.original.seconds
    lines.append(f"time: {r.seconds:.1f} s (judging the environment as it is: {t:.1f} s)")
    return [printable(line) for line in lines]


def rehearsal_md(r: Rehearsal) -> str:
    """rehearsal.md: the screen's facts, with every module and the command of each attempt."""
    out = [
        f"# Rehearsal {md_text(r.id)}",
        "",
        f"- environment: {md_code(r.environment)} (Python {md_text(r.python)}), as it is: **{r.original.state}**"
        + (f" — {md_text(r.original.reason)}" if r.original.reason else ""),
        f"- verdict: {md_text(outcome_line(r.request))}",
        f"- time: {r.seconds:.1f} s (the environment as it is: {r.original.seconds:.1f} s)",
        "",
    ]
    for n, a in enumerate((r.request, *r.safer)):
        out += [f"## {'The install as typed' if n == 0 else f'Safer command {n}: ' + md_text(a.label)}", ""]
        out += [md_code(" ".join(a.command)), "", md_text(outcome_line(a)), ""]
        if not a.install.ok:
            continue
        if a.changes:
            out += [
                "| distribution | before | after | build | CUDA | asked by |",
                "| --- | --- | --- | --- | --- | --- |",
            ]
            for c in a.changes:
                build = f"{_variant(c.old) if c.old else ''} → {_variant(c.new) if c.new else ''}"
                cuda = f"{c.old_cuda or '–'} → {c.new_cuda or '–'}"
                out.append(
                    f"| {md_text(c.name)} | {md_text(c.old or '–')} | {md_text(c.new or 'removed')} | {md_text(build)} "
                    f"| {md_text(cuda)} | {md_text('; '.join(c.asked_by))} |"
                )
            out.append("")
        out += ["Pins it breaks: " + (", ".join(md_text(p) for p in a.broken_pins) or "none"), ""]
        for title, items in (
            ("What worked and breaks", a.breaks),
            ("What was broken and is fixed", a.fixes),
            ("New, and broken", a.new_broken),
            ("No longer installed (loaded before)", a.gone),
        ):
            out.append(f"{title}: " + ("none" if not items else ""))
            out += [f"- {md_code(m.module)} ({md_text(m.dist)}): {md_text(m.cause)}" for m in items]
            out.append("")
        if a.judged:
            out += [f"Judged: {a.judged.state} in {a.judged.seconds:.1f} s; report: {md_code(a.judged.report)}", ""]
    best = r.suggested
    if best is not None:
        out += ["## Run instead", "", md_code(" ".join(best.command)), ""]
    return "\n".join(out).rstrip() + "\n"


def _e(text: str) -> str:
    return escape(printable(text), quote=True)


def rehearsal_html(r: Rehearsal) -> str:
    """index.html: the screen as a page, and a link to each environment's own one-cell report."""
    state = {Outcome.SAFE: "s-pass", Outcome.BREAKS: "s-fail"}.get(r.outcome, "s-error")
    links = [("the environment as it is", r.original.report)]
    links += [(a.label, a.judged.report) for a in (r.request, *r.safer) if a.judged]
    # Each report is a folder beside index.html (original/, after/, safer-1/ …): linked relatively.
    items = "".join(f'<li><a href="{_e(Path(path).name)}/index.html">{_e(label)}</a></li>' for label, path in links)
    body = (
        f"<h1>Rehearsal <code>{_e(r.id)}</code></h1>\n"
        f'<p><span class="chip {state}"><b>{_e(r.outcome.value)}</b></span> {_e(outcome_line(r.request))}</p>\n'
        f"<pre>{_e(chr(10).join(rehearsal_lines(r)))}</pre>\n"
        f"<h2>Each environment's report</h2>\n<ul>{items}</ul>\n"
    )
    return (
        '<!doctype html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>compatlab rehearsal {_e(r.id)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n"
        '<header class="top"><div class="brand">compatlab<span>rehearsal</span></div></header>\n'
        f"<main>\n{body}</main>\n</body>\n</html>\n"
    )
