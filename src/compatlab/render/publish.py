"""Publish: every run and the latest grid into a folder ready for static hosting (e.g. gh-pages)."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from compatlab.errors import ConfigError
from compatlab.render._grid import load, run_from_json
from compatlab.render.answers import answers_json
from compatlab.render.formats import FORMATS, Page
from compatlab.render.history import diff_runs, load_runs, previous_run
from compatlab.render.html import render_index
from compatlab.render.markdown import changes_md
from compatlab.render.text import printable
from compatlab.render.view import IndexEntry, build, summarize
from compatlab.runs import store
from compatlab.runs.atomic import write_atomic
from compatlab.runs.model import Results
from compatlab.urls import redact_text

__all__ = ["compat_md_diff", "publish", "write_run"]

log = logging.getLogger(__name__)


def write_run(
    run: Results,
    out_dir: Path,
    history: list[Results],
    *,
    nav: list[tuple[str, str]] | None = None,
    runs: list[IndexEntry] | None = None,
    news: str = "",
) -> list[Path]:
    """Write index.html, compat.md, results.json (and changes.md when there is an earlier run or *news*).

    Through runs/latest.py's write_latest: a folder that shows a newer run is left as it is (StaleRun), and
    one that shows an older run of the matrix keeps the cells this run did not run (store.whole_matrix).
    """
    run = store.whole_matrix(out_dir, run)
    previous = previous_run(history, run)
    view = build(run, previous=previous, history=history)
    page = Page(nav=nav or [], runs=runs or [])
    files = {f.file: f.render(view, page) for f in FORMATS}
    # Redacted as every other file: the commands and reasons in it came from results.
    files["answers.json"] = redact_text(json.dumps(answers_json(run), indent=2)) + "\n"
    written = [out_dir / name for name in files] + [out_dir / "results.json"]
    changed = [printable(news).rstrip("\n") + "\n"] if news.strip() else []
    if previous is not None:
        changed.append(changes_md(view))
    if changed:
        files["changes.md"] = "\n".join(changed)
        written.append(out_dir / "changes.md")
    store.write_latest(out_dir, run, files=files)
    log.info("wrote %s", ", ".join(str(p) for p in written))
    return written


def _as_run(value: Results | Mapping[str, Any] | Path, what: str) -> Results:
    if isinstance(value, Results):
        return value
    if isinstance(value, Path):
        return load(value)
    return run_from_json(value, what)


def compat_md_diff(
    old_results: Results | Mapping[str, Any] | Path, new_results: Results | Mapping[str, Any] | Path
) -> str:
    """A Markdown summary of what changed between two runs: newly red first, then newly green, etc.

    Each argument is a results.json path, its loaded JSON (checked by ``runs.model.Results.from_json``), or a
    loaded Results.
    Perf figures that moved by 5% or more get their own section.
    """
    old = _as_run(old_results, "old results")
    return changes_md(build(_as_run(new_results, "new results"), previous=old))


def _site_runs(site_dir: Path) -> list[Results]:
    """Runs already published (possibly ones no longer under runs_dir): kept and listed."""
    found = []
    for path in store.results_in(site_dir / "runs"):
        try:
            found.append(load(path))
        except ConfigError as exc:
            log.warning("published run left as it is: %s", exc)
    return found


def publish(site_dir: Path, runs_dir: Path) -> None:
    """Render every run under *runs_dir* into ``site_dir/runs/<id>/``, the latest grid into ``site_dir``.

    Nothing already under *site_dir* is deleted: runs published before (even ones since removed from
    *runs_dir*) stay reachable and listed in ``site_dir/runs/index.html`` and on the front page.
    Raises ConfigError when *runs_dir* holds no readable run.
    """
    history = load_runs(runs_dir)
    if not history:
        raise ConfigError(str(runs_dir), ["no runs found (expected <run-id>/results.json); run `nox -s matrix` first"])
    for run in history:
        write_run(
            run,
            site_dir / "runs" / _safe(run.run.id),
            history,
            nav=[("Latest", "../../index.html"), ("All runs", "../index.html")],
        )
    # Everything published, newest first: the union of what was there and what we just wrote.
    known = {r.run.id: r for r in _site_runs(site_dir)}
    everything = sorted(known.values(), key=lambda r: r.run.order, reverse=True)
    chronological = list(reversed(everything))

    def entries(prefix: str) -> list[IndexEntry]:
        out = []
        for run in everything:
            prev = previous_run(chronological, run)
            out.append(
                IndexEntry(
                    summary=summarize(run),
                    href=f"{prefix}{_safe(run.run.id)}/index.html",
                    changes=diff_runs(prev, run) if prev is not None else None,
                )
            )
        return out

    write_atomic(site_dir / "runs" / "index.html", render_index(entries(""), nav=[("Latest", "../index.html")]))
    latest = history[-1]
    write_run(
        latest,
        site_dir,
        history,
        nav=[(f"Run {latest.run.id}", f"runs/{_safe(latest.run.id)}/index.html"), ("All runs", "runs/index.html")],
        runs=entries("runs/"),
    )
    # gh-pages would otherwise run Jekyll, which hides files starting with "_".
    nojekyll = site_dir / ".nojekyll"
    if not nojekyll.exists():
        nojekyll.touch()
    log.info("published %d runs to %s (latest %s)", len(everything), site_dir, latest.run.id)


def _safe(run_id: str) -> str:
    """A run id as one path component: nothing that climbs out of runs/."""
    cleaned = "".join(ch if ch.isalnum() or ch in "-_.+" else "_" for ch in run_id).lstrip(".")
    return cleaned or "run"
