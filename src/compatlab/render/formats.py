"""The formats of a run's page, one row each: the file it is written to and the function that formats the view
into it. ``publish.write_run`` writes every row, and the layout test reads each row's module: a formatter reads
only the view (view.py) and the text helpers, never another formatter. A new format is one row here."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from compatlab.render.html import render_html
from compatlab.render.markdown import render_markdown
from compatlab.render.view import IndexEntry, RunView

__all__ = ["FORMATS", "Format", "Page"]


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Page:
    """Where the page is published: its navigation links and, on the front page, the list of runs."""

    nav: Sequence[tuple[str, str]] = ()
    runs: Sequence[IndexEntry] = ()


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Format:
    """One file of a run's page and its formatter (``formatter(view)``, with the page's links where it
    shows them)."""

    file: str
    formatter: Callable[..., str]
    linked: bool = False  # the formatter takes the page's nav and runs

    @property
    def module(self) -> str:
        """The formatter's module (what the layout test holds to reading the view only)."""
        return self.formatter.__module__

    def render(self, view: RunView, page: Page) -> str:
        return self.formatter(view, nav=page.nav, runs=page.runs) if self.linked else self.formatter(view)


FORMATS: tuple[Format, ...] = (
    Format(file="index.html", formatter=render_html, linked=True),
    Format(file="compat.md", formatter=render_markdown),
)
