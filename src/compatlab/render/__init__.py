"""Render a run's results.json into an HTML grid, a Markdown table and a change summary; publish them.

Renderers only read results: nothing here installs, imports or runs a cell.
"""

from __future__ import annotations

from compatlab.render._grid import load
from compatlab.render.history import Change, diff_runs, load_runs
from compatlab.render.markdown import render_markdown
from compatlab.render.publish import compat_md_diff, publish
from compatlab.render.run import render_run

__all__ = [
    "Change",
    "compat_md_diff",
    "diff_runs",
    "load",
    "load_runs",
    "publish",
    "render_markdown",
    "render_run",
]
