"""render_run: one run's grid into a folder (what `compatlab report` calls)."""

from __future__ import annotations

from pathlib import Path

from compatlab.errors import ConfigError
from compatlab.render._grid import load
from compatlab.render.history import load_runs
from compatlab.render.publish import write_run
from compatlab.runs.model import Results

__all__ = ["render_run"]


def render_run(results_path: Path, out_dir: Path, *, history_dir: Path | None, news: str = "") -> list[Path]:
    """Render *results_path* into *out_dir*: index.html, compat.md, results.json (a copy).

    With *history_dir* (``reports/runs``), the page marks what changed since the previous run (by start
    time), draws perf sparklines over recent runs, and changes.md is written too. *news* (Markdown, as
    ``compatlab lock --news`` writes it: the upstream releases new since the previous lock) leads
    changes.md, which is then written even for a first run. Returns the paths written.
    Raises ConfigError naming the file when the results cannot be read.
    """
    run = load(results_path)
    history: list[Results] = []
    if history_dir is not None:
        if not history_dir.is_dir():
            raise ConfigError(str(history_dir), ["history: not a directory of runs (<run-id>/results.json)"])
        history = load_runs(history_dir)
    return write_run(run, out_dir, history, news=news)
