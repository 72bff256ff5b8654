"""Simple package indexes (PEP 503 HTML, PEP 691 JSON): what an index lists for a project, and what a
release requires.

A project page is ``<index>/<normalized-name>/`` (PEP 503 normalization: runs of ``-_.`` become ``-``,
lower case). Asked with ``Accept: application/vnd.pypi.simple.v1+json`` an index may answer PEP 691
JSON (``files``: ``filename``, ``url``, ``yanked``, ``core-metadata``), else HTML anchors whose attributes
say the same (``data-yanked``, ``data-core-metadata``, PEP 714's ``data-dist-info-metadata`` of older
indexes). A file's URL is relative to the page that lists it.

A release is yanked (PEP 592) when every file of it is; a pre-release is one PEP 440 calls so (``rc``,
``a``, ``b``, ``.dev``). A file that the index marks yanked is never read for metadata.

A release's ``Requires-Dist`` lines are in its wheel's ``*.dist-info/METADATA``. Where the index serves
that file apart (PEP 658: the file's URL plus ``.metadata``), only it is read; otherwise the wheel's zip
central directory (at its end) and the METADATA member are read with HTTP range requests, as uv does, so
a 900 MB torch wheel costs a few hundred KiB. A server without range support serves a small file whole.

Credentials come in the index URL (``https://user:password@host/simple``); they are sent as HTTP basic
auth to that host only (never on a redirect elsewhere), and every URL in a message is redacted.
Nothing here knows matrix.toml: callers pass URLs and names.
"""

from __future__ import annotations

import dataclasses
import email.parser
import http.client
import io
import json
import urllib.error
import urllib.request
import zipfile
from collections.abc import Sequence
from html.parser import HTMLParser
from typing import Any
from urllib.parse import unquote, urljoin, urlsplit

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from compatlab.errors import LabError
from compatlab.urls import Credentials, redact, redact_text, split

__all__ = [
    "ACCEPT_PROJECT",
    "ACCEPT_ROOT",
    "DistFile",
    "IndexUnavailable",
    "Page",
    "Release",
    "SimpleHTML",
    "core_metadata",
    "fetch",
    "is_index_root",
    "page_files",
    "page_url",
    "project_files",
    "releases",
    "requires_dist",
    "version_of",
]

TIMEOUT = 30.0
# PEP 691 content negotiation: JSON first for a project page; HTML first for a root, which is read
# only in part and so must be parseable from its beginning.
ACCEPT_PROJECT = "application/vnd.pypi.simple.v1+json, application/vnd.pypi.simple.v1+html;q=0.2, text/html;q=0.01"
ACCEPT_ROOT = "application/vnd.pypi.simple.v1+html, text/html;q=0.5, application/vnd.pypi.simple.v1+json;q=0.1"
PAGE_LIMIT = 64 << 20
# A wheel read whole when its server cannot serve ranges, and the METADATA member, are at most this big.
WHOLE_LIMIT = 64 << 20
_TAIL = 256 << 10  # the end of a wheel read first: the zip's central directory is there
_CHUNK = 64 << 10


class IndexUnavailable(LabError):
    """An index that could not be asked, or did not answer as an index: the question is unanswered."""


class SimpleHTML(HTMLParser):
    """The anchors of a PEP 503 page (href and attributes) and its PEP 629 ``pypi:repository-version`` meta."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.anchors: list[dict[str, str | None]] = []
        self.has_meta = False

    @property
    def hrefs(self) -> list[str]:
        return [a.get("href") or "" for a in self.anchors]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag == "a" and found.get("href"):
            self.anchors.append(found)
        elif tag == "meta" and found.get("name") == "pypi:repository-version":
            self.has_meta = True


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Page:
    """One answer of an index: ``status`` None means no HTTP answer at all (``unreachable`` says why)."""

    status: int | None
    unreachable: str = ""
    json: Any = None
    html: SimpleHTML | None = None


def _opener(url: str, credentials: Credentials | None) -> urllib.request.OpenerDirector:
    """Basic auth towards *url*'s own host only: a redirect to another host gets no credentials."""
    handlers: list[urllib.request.BaseHandler] = []
    if credentials is not None:
        parts = urlsplit(url)
        manager = urllib.request.HTTPPasswordMgrWithPriorAuth()
        manager.add_password(None, f"{parts.scheme}://{parts.netloc}/", credentials.username,
                             credentials.password or "", is_authenticated=True)
        handlers.append(urllib.request.HTTPBasicAuthHandler(manager))
    return urllib.request.build_opener(*handlers)


def fetch(url: str, credentials: Credentials | None, *, accept: str, limit: int, timeout: float) -> Page:
    """GET a page of an index (*url* without credentials; those apart)."""
    # The URL is an index of matrix.toml, which admits only http(s):// and file:// ones.
    request = urllib.request.Request(url, headers={"Accept": accept, "User-Agent": "compatlab"})  # noqa: S310
    try:
        with _opener(url, credentials).open(request, timeout=timeout) as answer:
            body = answer.read(limit)
            ctype = answer.headers.get("Content-Type", "")
            status = answer.status or 200  # a file:// answer has no status
    except urllib.error.HTTPError as exc:
        return Page(status=exc.code)
    except (OSError, http.client.HTTPException, ValueError) as exc:
        if isinstance(exc, urllib.error.URLError) and isinstance(exc.reason, FileNotFoundError):
            return Page(status=404)  # a file:// index without that page
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        return Page(status=None, unreachable=redact_text(str(reason)) or type(exc).__name__)
    text = body.decode("utf-8", "replace")
    if ctype.startswith("application/vnd.pypi.simple.v1+json"):
        try:
            return Page(status=status, json=json.loads(text))
        except ValueError:
            return Page(status=status, json={"meta": {}} if '"api-version"' in text else None)
    parser = SimpleHTML()
    parser.feed(text)
    return Page(status=status, html=parser)


def page_url(base: str, *parts: str) -> str:
    """``<base>/<part>/…/``; for a file:// index (a folder) the ``index.html`` in it."""
    url = base.rstrip("/") + "/" + "".join(f"{p}/" for p in parts)
    return url + "index.html" if url.startswith("file:") else url


def page_files(page: Page) -> list[str]:
    """The distribution file names a project page lists."""
    if isinstance(page.json, dict):
        return [str(f.get("filename", "")) for f in page.json.get("files", []) if isinstance(f, dict)]
    if page.html is None:
        return []
    names = [unquote(href.split("#", 1)[0].split("?", 1)[0].rsplit("/", 1)[-1]) for href in page.html.hrefs]
    return [n for n in names if n.endswith((".whl", ".tar.gz", ".zip"))]


def is_index_root(page: Page) -> bool:
    """PEP 691 JSON, the PEP 629 meta, or HTML whose every link goes to a project page (``…/name/``)."""
    if page.status != 200:
        return False
    if page.json is not None:
        return isinstance(page.json, dict) and "meta" in page.json
    if page.html is None:
        return False
    hrefs = [h.split("#", 1)[0].split("?", 1)[0] for h in page.html.hrefs]
    return page.html.has_meta or (bool(hrefs) and all(h.endswith("/") for h in hrefs))


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class DistFile:
    """A file of a release as its project page lists it; ``url`` is absolute and carries no credentials."""

    filename: str
    url: str
    yanked: bool = False
    metadata: bool = False  # PEP 658: the index serves ``url + ".metadata"``


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Release:
    """One version of a project: yanked when every file is, a pre-release by PEP 440."""

    version: str
    files: tuple[DistFile, ...]

    @property
    def yanked(self) -> bool:
        return bool(self.files) and all(f.yanked for f in self.files)

    @property
    def prerelease(self) -> bool:
        return Version(self.version).is_prerelease


def _truthy(value: object) -> bool:
    """PEP 691 ``yanked``/``core-metadata``: false, true, a reason string, or a hash table."""
    return value not in (None, False, "false") and value != {}


def version_of(filename: str, name: str) -> str | None:
    """The version a wheel or sdist file name gives for project *name* (normalized), or None."""
    from packaging.utils import (
        InvalidSdistFilename,
        InvalidWheelFilename,
        parse_sdist_filename,
        parse_wheel_filename,
    )

    try:
        if filename.endswith(".whl"):
            project, version, _, _ = parse_wheel_filename(filename)
        else:
            project, version = parse_sdist_filename(filename)
    except (InvalidWheelFilename, InvalidSdistFilename, InvalidVersion):
        return None
    return str(version) if canonicalize_name(project) == name else None


def project_files(page: Page, url: str) -> list[DistFile]:
    """Every distribution file of a project page at *url*, its attributes read as PEP 691/592/658 say."""
    out: list[DistFile] = []
    if isinstance(page.json, dict):
        for f in page.json.get("files", []):
            if not isinstance(f, dict) or not isinstance(f.get("filename"), str):
                continue
            meta = f.get("core-metadata", f.get("data-dist-info-metadata"))
            out.append(DistFile(filename=f["filename"], url=urljoin(url, str(f.get("url", f["filename"]))),
                                yanked=_truthy(f.get("yanked")), metadata=_truthy(meta)))
        return out
    if page.html is None:
        return out
    for anchor in page.html.anchors:
        href = anchor.get("href") or ""
        name = unquote(href.split("#", 1)[0].split("?", 1)[0].rsplit("/", 1)[-1])
        if not name.endswith((".whl", ".tar.gz", ".zip")):
            continue
        meta = anchor.get("data-core-metadata", anchor.get("data-dist-info-metadata"))
        out.append(DistFile(filename=name, url=urljoin(url, href.split("#", 1)[0]),
                            yanked="data-yanked" in anchor, metadata=meta is not None and meta != "false"))
    return out


def releases(index: str, package: str, *, timeout: float = TIMEOUT) -> tuple[Release, ...]:
    """Every release of *package* on the simple index *index* (a URL, credentials allowed), oldest first.

    Raises IndexUnavailable when the index cannot be reached, refuses us, or has no such project (a
    selector over a project the index does not have is a mistake to tell, not an empty axis).
    """
    clean, credentials = split(index)
    shown = redact(index)
    name = canonicalize_name(package)
    url = page_url(clean, name)
    page = fetch(url, credentials, accept=ACCEPT_PROJECT, limit=PAGE_LIMIT, timeout=timeout)
    if page.status is None:
        raise IndexUnavailable(f"{shown} is unreachable: {page.unreachable}")
    if page.status in (401, 403):
        what = "refused the credentials" if credentials else "needs credentials (put them in the URL)"
        raise IndexUnavailable(f"{shown} {what}: HTTP {page.status} for {name}'s page")
    if page.status in (404, 410):
        raise IndexUnavailable(f"{shown} has no project {name!r} (HTTP {page.status} for {page_url(shown, name)})")
    if page.status != 200 or (page.json is None and page.html is None):
        raise IndexUnavailable(f"{shown} answered HTTP {page.status} for {name}'s page")
    by_version: dict[Version, list[DistFile]] = {}
    for f in project_files(page, url):
        version = version_of(f.filename, name)
        if version is not None:
            by_version.setdefault(Version(version), []).append(f)
    return tuple(Release(version=str(v), files=tuple(by_version[v])) for v in sorted(by_version))


def _preferred(files: Sequence[DistFile]) -> list[DistFile]:
    """Wheels worth reading, best first: ones with PEP 658 metadata, pure ones, Linux x86-64 ones."""
    wheels = [f for f in files if f.filename.endswith(".whl") and not f.yanked]

    def rank(f: DistFile) -> tuple[int, int]:
        name = f.filename
        where = 0 if name.endswith("-any.whl") else 1 if "x86_64" in name and "linux" in name else 2
        return (0 if f.metadata else 1, where)

    return sorted(wheels, key=rank)


class _RangeFile(io.RawIOBase):
    """A remote file read by HTTP range requests, each at least ``_CHUNK`` long, kept once read."""

    def __init__(self, opener: urllib.request.OpenerDirector, url: str, size: int, tail: bytes,
                 timeout: float) -> None:
        super().__init__()
        self._opener, self._url, self._size, self._timeout = opener, url, size, timeout
        self._spans: list[tuple[int, bytes]] = [(size - len(tail), tail)]
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def _cached(self, start: int, n: int) -> bytes | None:
        for at, data in self._spans:
            if at <= start and start + n <= at + len(data):
                return data[start - at:start - at + n]
        return None

    def readinto(self, buffer: Any) -> int:
        n = min(len(buffer), self._size - self._pos)
        if n <= 0:
            return 0
        data = self._cached(self._pos, n)
        if data is None:
            end = min(self._size, self._pos + max(n, _CHUNK)) - 1
            request = urllib.request.Request(self._url, headers={"Range": f"bytes={self._pos}-{end}",  # noqa: S310
                                                                 "User-Agent": "compatlab"})
            with self._opener.open(request, timeout=self._timeout) as answer:
                chunk = answer.read(end - self._pos + 1)
            self._spans.append((self._pos, chunk))
            data = chunk[:n]
        buffer[:len(data)] = data
        self._pos += len(data)
        return len(data)


def _metadata_member(archive: zipfile.ZipFile, filename: str) -> str:
    names = [n for n in archive.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")]
    if len(names) != 1:
        raise IndexUnavailable(f"{filename}: expected one *.dist-info/METADATA, found {len(names)}")
    info = archive.getinfo(names[0])
    if info.file_size > WHOLE_LIMIT:
        raise IndexUnavailable(f"{filename}: its METADATA is {info.file_size} bytes, more than a wheel's metadata")
    return archive.read(names[0]).decode("utf-8", "replace")


def _wheel_metadata(file: DistFile, credentials: Credentials | None, timeout: float) -> str:
    opener = _opener(file.url, credentials)
    request = urllib.request.Request(file.url, headers={"Range": f"bytes=-{_TAIL}",  # noqa: S310
                                                        "User-Agent": "compatlab"})
    with opener.open(request, timeout=timeout) as answer:
        status = answer.status or 200
        if status == 206:
            total = answer.headers.get("Content-Range", "").rpartition("/")[2]
            tail = answer.read(_TAIL + 1)
            size = int(total) if total.isdigit() else len(tail)
            source: io.RawIOBase | io.BytesIO = _RangeFile(opener, file.url, size, tail, timeout)
        else:  # no range support: the whole file, when it is small
            length = answer.headers.get("Content-Length", "")
            if length.isdigit() and int(length) > WHOLE_LIMIT:
                raise IndexUnavailable(f"{redact(file.url)}: the server offers neither PEP 658 metadata nor range "
                                       f"requests, and the file is {int(length) >> 20} MiB")
            source = io.BytesIO(answer.read(WHOLE_LIMIT + 1))
    try:
        with zipfile.ZipFile(source) as archive:
            return _metadata_member(archive, file.filename)
    except zipfile.BadZipFile as exc:
        raise IndexUnavailable(f"{file.filename}: not a readable wheel ({exc})") from None


def core_metadata(index: str, release: Release, *, timeout: float = TIMEOUT) -> str:
    """The METADATA text of one wheel of *release* on *index* (whose credentials go to its host only).

    Raises IndexUnavailable when no wheel can be read (the release has only an sdist, or every server
    refused).
    """
    _, credentials = split(index)
    index_host = urlsplit(split(index)[0]).netloc
    problems: list[str] = []
    for file in _preferred(release.files)[:3]:
        mine = credentials if urlsplit(file.url).netloc == index_host else None
        try:
            if file.metadata:
                request = urllib.request.Request(file.url + ".metadata",  # noqa: S310
                                                 headers={"User-Agent": "compatlab"})
                with _opener(file.url, mine).open(request, timeout=timeout) as answer:
                    return str(answer.read(WHOLE_LIMIT).decode("utf-8", "replace"))
            return _wheel_metadata(file, mine, timeout)
        except urllib.error.HTTPError as exc:
            problems.append(f"{file.filename}: HTTP {exc.code}")
        except (OSError, http.client.HTTPException, ValueError) as exc:
            reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
            problems.append(f"{file.filename}: {redact_text(str(reason))}")
        except IndexUnavailable as exc:
            problems.append(str(exc))
    if not problems:
        raise IndexUnavailable(f"{redact(index)}: {release.version} has no wheel to read its Requires-Dist from")
    raise IndexUnavailable(f"{redact(index)}: cannot read the metadata of {release.version}: " + "; ".join(problems))


def requires_dist(metadata: str) -> tuple[str, ...]:
    """The ``Requires-Dist`` lines of a METADATA text (RFC 822 headers, continuation lines joined)."""
    headers = email.parser.HeaderParser().parsestr(metadata)
    return tuple(" ".join(str(v).split()) for v in headers.get_all("Requires-Dist") or [])
