"""Is a pin on its index? Ask the index as uv asks it (``probe_index``), for an install that uv found unsatisfiable.

uv's "not found" cannot tell a missing version from a broken index (uv reads a 404 for the whole index as "no
such project"). So each pin's index is asked directly: the project page ``<index>/<normalized-name>/`` (PEP 503
HTML, or PEP 691 JSON by content negotiation), and, when that is 404, the index root. An index that answers
without the pin is ``fail``; one that does not answer as an index, refuses the credentials, errs (5xx) or
cannot be reached is ``error`` (``uv_failures.explain_unsatisfiable`` says which).

An ``Index`` is an index of a cell's install as the spec names it (``index-1`` …, ``default``), its URL
without credentials, and those apart: they never reach a file or an argv.
"""

from __future__ import annotations

import dataclasses

from packaging.version import Version

from compatlab.index.client import (
    ACCEPT_PROJECT,
    ACCEPT_ROOT,
    PAGE_LIMIT,
    fetch,
    is_index_root,
    page_files,
    page_url,
    version_of,
)
from compatlab.urls import Credentials, redact, split

__all__ = ["PROBE_TIMEOUT", "Index", "Listing", "probe_index"]

PROBE_TIMEOUT = 15.0
_ROOT_LIMIT = 256 << 10


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Index:
    """An index of the install: its name in the spec, its URL without credentials, and those apart.

    ``shown`` is the URL as a person may see it (``urls.redact``): ``https://***@host/simple``.
    """

    name: str
    url: str
    shown: str
    credentials: Credentials | None = dataclasses.field(default=None, repr=False)

    @classmethod
    def of(cls, name: str, url: str) -> Index:
        """The index *name* for *url* as matrix.toml gives it, credentials and all."""
        clean, credentials = split(url)
        return cls(name=name, url=clean, shown=redact(url), credentials=credentials)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Listing:
    """What an index says of one project: its versions, or why it has none, or why it did not answer.

    ``problem`` set: the index is broken, refuses us or is unreachable (an ``error``). Otherwise the index
    answers: ``versions`` lists the project's versions, or is None with ``note`` saying why there are none.
    """

    versions: tuple[str, ...] | None = None
    note: str = ""
    problem: str = ""


def _refusal(index: Index, status: int, what: str) -> str:
    if status in (401, 403) and index.credentials is None:
        return (
            f"{index.shown} needs credentials (HTTP {status} for {what}); put them in the URL as "
            "https://user:password@host/…"
        )
    if status in (401, 403):
        return f"{index.shown} refused the credentials (HTTP {status} for {what}); check the user name and password"
    return f"{index.shown} answered HTTP {status} for {what}"


def probe_index(index: Index, package: str, *, timeout: float = PROBE_TIMEOUT) -> Listing:
    """Ask *index* for *package*'s PEP 503/691 page, as uv does, and tell what it lists.

    A 404 (or an HTML page without distribution links) on the project page is read against the root:
    a root that answers as a simple index means the index works and lacks the project; a root that is
    404 too, or an HTML page that is not an index (a web site's catch-all route), means the URL is not
    an index at all. Only the first 256 KiB of the root are read (PyPI's lists every project).
    """
    from packaging.utils import canonicalize_name

    name = canonicalize_name(package)
    what = f"{name}'s page"
    page = fetch(page_url(index.url, name), index.credentials, accept=ACCEPT_PROJECT, limit=PAGE_LIMIT, timeout=timeout)
    if page.status is None:
        return Listing(problem=f"{index.shown} is unreachable: {page.unreachable}")
    if page.status == 200 and (page.json is not None or page_files(page)):
        versions = sorted({v for f in page_files(page) if (v := version_of(f, name)) is not None}, key=Version)
        if versions:
            return Listing(versions=tuple(versions))
        return Listing(note="the index lists no files for it")
    if page.status not in (200, 404, 410):
        return Listing(problem=_refusal(index, page.status, what))
    root = fetch(page_url(index.url), index.credentials, accept=ACCEPT_ROOT, limit=_ROOT_LIMIT, timeout=timeout)
    if root.status is None:
        return Listing(problem=f"{index.shown} is unreachable: {root.unreachable}")
    if is_index_root(root):
        if page.status == 200:
            return Listing(note="the index lists no files for it")
        return Listing(note="the index has no such project")
    if root.status not in (200, 404, 410):
        return Listing(problem=_refusal(index, root.status, "its root"))
    if root.status == 200:
        return Listing(
            problem=f"{index.shown} does not answer as a package index: its root is an HTML page "
            "that is not a simple index (PEP 503); check the URL"
        )
    return Listing(
        problem=f"{index.shown} does not answer as a package index: HTTP {root.status} for its "
        f"root and {page.status} for {what}; check the URL"
    )
