"""Simple package indexes (PEP 503 HTML, PEP 691 JSON): what an index lists for a project, and what a
release requires.

A project page is ``<index>/<normalized-name>/`` (PEP 503 normalization: runs of ``-_.`` become ``-``,
lower case). Asked with ``Accept: application/vnd.pypi.simple.v1+json`` an index may answer PEP 691
JSON (``files``: ``filename``, ``url``, ``yanked``, ``core-metadata``), else HTML anchors whose attributes
say the same (``data-yanked``, ``data-core-metadata``, PEP 714's ``data-dist-info-metadata`` of older
indexes). A file's URL is relative to the page that lists it.

A release is yanked (PEP 592) when every file of it is; a pre-release is one PEP 440 calls so (``rc``,
``a``, ``b``, ``.dev``). A file that the index marks yanked is read for metadata only when its release is
yanked whole: such a release is locked only when the matrix asks for it (``yanked = true``, or listed).

A release's ``Requires-Dist`` lines are in its wheel's ``*.dist-info/METADATA``. Where the index serves
that file apart (PEP 658: the file's URL plus ``.metadata``), only it is read; otherwise the wheel's zip
central directory (at its end) and the METADATA member are read with HTTP range requests, as uv does, so
a 900 MB torch wheel costs a few hundred KiB. A server without range support serves a small file whole.

Credentials come in the index URL (``https://user:password@host/simple``); they are sent as HTTP basic
auth to that host only (never on a redirect elsewhere), and every URL in a message is redacted.
Nothing here knows matrix.toml: callers pass URLs and names.

An index's answers are believed only when complete, and asking is bounded work:

- every request (connection, headers and body together) has one wall-clock deadline, ``timeout``; a
  server that drips a byte at a time is cut off there, not at each read's socket timeout (``compatlab.net``,
  as for every client of the lab);
- a body shorter than its ``Content-Length`` (or a chunked body cut before its last chunk), or longer than
  the limit (``PAGE_LIMIT``, ``WHOLE_LIMIT``), is no answer; so is PEP 691 JSON that does not parse, whose
  ``name`` is another project, or that is not of PEP 691's shape (``PROJECT_PAGE``: a list of files, each
  with a string ``filename``);
- file links resolve against the URL that answered (after redirects); a remote page's links are followed
  only to http(s) (a ``file://`` link on a remote page would read this machine's files), and credentials go
  only to the host of the index they belong to;
- a release's metadata must name the project and version asked for (PEP 440 equality).
"""

from __future__ import annotations

import dataclasses
import email.parser
import http.client
import io
import struct
import zipfile
import zlib
from collections.abc import Sequence
from html.parser import HTMLParser
from typing import Any
from urllib.parse import unquote, urljoin, urlsplit

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from compatlab import net
from compatlab.errors import LabError
from compatlab.urls import Credentials, redact, redact_text, split

__all__ = [
    "ACCEPT_PROJECT",
    "ACCEPT_ROOT",
    "PROJECT_PAGE",
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
_MAX_RANGE_READS = 64  # HTTP range requests for one wheel's metadata
_CHUNK = 64 << 10
# What is read of a PEP 691 project page (other keys are not looked at).
PROJECT_PAGE = net.Obj(
    required={"files": net.ListOf(net.Obj(required={"filename": str}, optional={"url": str}))},
    optional={"name": str},
)


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
    url: str = ""  # the URL that answered, after redirects: file links are relative to it


class _Incomplete(ValueError):
    """A wheel whose metadata cannot be read within the bounds: too many or too large range requests."""


class _Refused(Exception):
    """An HTTP error status (4xx, 5xx) where a file was asked for."""

    def __init__(self, status: int) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status


def _get(
    url: str, credentials: Credentials | None, *, limit: int, timeout: float, headers: dict[str, str] | None = None
) -> net.Answer:
    """One request through ``compatlab.net``: whole within *timeout*, at most *limit* bytes, redirects
    followed (credentials to *url*'s own host only), the environment's proxies honoured as uv honours them."""
    answer = net.request(
        url,
        timeout=timeout,
        limit=limit,
        headers=headers,
        credentials=credentials,
        follow_redirects=True,
        proxies=True,
    )
    if answer.status >= 300:
        raise _Refused(answer.status)
    return answer


def fetch(url: str, credentials: Credentials | None, *, accept: str, limit: int, timeout: float) -> Page:
    """GET a page of an index (*url* without credentials; those apart), whole within *timeout* seconds."""
    try:
        answer = _get(url, credentials, limit=limit, timeout=timeout, headers={"Accept": accept})
    except _Refused as exc:
        return Page(status=exc.status)
    except net.Unreachable as exc:
        if isinstance(exc.error, FileNotFoundError):
            return Page(status=404)  # a file:// index without that page
        return Page(status=None, unreachable=exc.reason)
    except net.HttpError as exc:
        return Page(status=None, unreachable=exc.reason)
    ctype = answer.headers.get("Content-Type", "")
    if ctype.startswith("application/vnd.pypi.simple.v1+json"):
        try:
            data = answer.json()
        except net.BadJson:
            # Cut or broken JSON is no answer: read as complete, it lost releases without a word.
            return Page(status=None, unreachable=f"its PEP 691 JSON does not parse ({len(answer.body)} bytes)")
        return Page(status=answer.status, json=data, url=answer.url)
    parser = SimpleHTML()
    parser.feed(answer.text())
    return Page(status=answer.status, html=parser, url=answer.url)


def page_url(base: str, *parts: str) -> str:
    """``<base>/<part>/…/``; for a file:// index (a folder) the ``index.html`` in it."""
    url = base.rstrip("/") + "/" + "".join(f"{p}/" for p in parts)
    return url + "index.html" if url.startswith("file:") else url


def page_files(page: Page) -> list[str]:
    """The distribution file names a project page lists."""
    if isinstance(page.json, dict):
        files = page.json.get("files")
        return [str(f.get("filename", "")) for f in files if isinstance(f, dict)] if isinstance(files, list) else []
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
    project: str = ""  # the normalized name asked for: its metadata must say the same

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


def _link(base: str, href: str) -> str | None:
    """*href* resolved against *base* (the URL that answered); None for a link this lab must not follow:
    anything but http(s), except file:// links of a file:// index (a local folder)."""
    url = urljoin(base, href)
    scheme = urlsplit(url).scheme.lower()
    if scheme in ("http", "https") or (scheme == "file" and urlsplit(base).scheme.lower() == "file"):
        return url
    return None


def project_files(page: Page, url: str) -> list[DistFile]:
    """Every distribution file of a project page at *url*, its attributes read as PEP 691/592/658 say.

    Links resolve against the URL that answered (``page.url``, after redirects), else *url*; links this
    lab must not follow (a ``file://`` link on a remote page) are left out.
    """
    base = page.url or url
    out: list[DistFile] = []
    if isinstance(page.json, dict):
        files = page.json.get("files", [])
        for f in files if isinstance(files, list) else []:
            if not isinstance(f, dict) or not isinstance(f.get("filename"), str):
                continue
            link = _link(base, str(f.get("url", f["filename"])))
            if link is None:
                continue
            meta = f.get("core-metadata", f.get("data-dist-info-metadata"))
            out.append(
                DistFile(filename=f["filename"], url=link, yanked=_truthy(f.get("yanked")), metadata=_truthy(meta))
            )
        return out
    if page.html is None:
        return out
    for anchor in page.html.anchors:
        href = anchor.get("href") or ""
        name = unquote(href.split("#", 1)[0].split("?", 1)[0].rsplit("/", 1)[-1])
        if not name.endswith((".whl", ".tar.gz", ".zip")):
            continue
        link = _link(base, href.split("#", 1)[0])
        if link is None:
            continue
        meta = anchor.get("data-core-metadata", anchor.get("data-dist-info-metadata"))
        out.append(
            DistFile(
                filename=name, url=link, yanked="data-yanked" in anchor, metadata=meta is not None and meta != "false"
            )
        )
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
    if page.json is not None:
        if problem := net.check_shape(page.json, PROJECT_PAGE):
            raise IndexUnavailable(f"{shown} answered PEP 691 JSON of the wrong shape for {name}'s page: {problem}")
        listed = page.json.get("name")
        if isinstance(listed, str) and canonicalize_name(listed) != name:
            raise IndexUnavailable(f"{shown} answered the page of {listed!r} when asked for {name}'s")
    by_version: dict[Version, list[DistFile]] = {}
    for f in project_files(page, url):
        version = version_of(f.filename, name)
        if version is not None:
            by_version.setdefault(Version(version), []).append(f)
    return tuple(Release(version=str(v), files=tuple(by_version[v]), project=name) for v in sorted(by_version))


def _preferred(files: Sequence[DistFile]) -> list[DistFile]:
    """Wheels worth reading, best first: ones with PEP 658 metadata, pure ones, Linux x86-64 ones; yanked
    ones only for a release that has nothing else (a yanked release the matrix asked for)."""
    all_wheels = [f for f in files if f.filename.endswith(".whl")]
    wheels = [f for f in all_wheels if not f.yanked] or all_wheels

    def rank(f: DistFile) -> tuple[int, int]:
        name = f.filename
        where = 0 if name.endswith("-any.whl") else 1 if "x86_64" in name and "linux" in name else 2
        return (0 if f.metadata else 1, where)

    return sorted(wheels, key=rank)


class _RangeFile(io.RawIOBase):
    """A remote file read by HTTP range requests, each at least ``_CHUNK`` long, kept once read.

    Bounded: at most ``_MAX_RANGE_READS`` requests, none over ``WHOLE_LIMIT`` (a zip directory claiming
    900 GiB is refused, never allocated), each whole within the timeout, each a 206 of the span asked.
    """

    def __init__(self, credentials: Credentials | None, url: str, size: int, tail: bytes, timeout: float) -> None:
        super().__init__()
        self._credentials, self._url, self._size, self._timeout = credentials, url, size, timeout
        self._spans: list[tuple[int, bytes]] = [(size - len(tail), tail)]
        self._pos = 0
        self._reads = 0

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

    def read(self, size: int | None = -1) -> bytes:
        left = max(0, self._size - self._pos)
        n = left if size is None or size < 0 else min(size, left)
        if n > WHOLE_LIMIT:
            raise _Incomplete(f"reading its metadata would read {n} bytes of it")
        buffer = bytearray(n)
        got = self.readinto(buffer)
        return bytes(buffer[:got])

    def _cached(self, start: int, n: int) -> bytes | None:
        for at, data in self._spans:
            if at <= start and start + n <= at + len(data):
                return data[start - at : start - at + n]
        return None

    def readinto(self, buffer: Any) -> int:
        n = min(len(buffer), self._size - self._pos)
        if n <= 0:
            return 0
        data = self._cached(self._pos, n)
        if data is None:
            self._reads += 1
            if self._reads > _MAX_RANGE_READS:
                raise _Incomplete(f"reading its metadata took more than {_MAX_RANGE_READS} range requests")
            end = min(self._size, self._pos + max(n, _CHUNK)) - 1
            answer = _get(
                self._url,
                self._credentials,
                limit=end - self._pos + 1,
                timeout=self._timeout,
                headers={"Range": f"bytes={self._pos}-{end}"},
            )
            if answer.status != 206 or not answer.body:
                raise _Incomplete(f"HTTP {answer.status} with {len(answer.body)} bytes for a range request")
            self._spans.append((self._pos, answer.body))
            data = answer.body[:n]
        buffer[: len(data)] = data
        self._pos += len(data)
        return len(data)


def _metadata_member(archive: zipfile.ZipFile, filename: str) -> str:
    names = [n for n in archive.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")]
    if len(names) != 1:
        raise IndexUnavailable(f"{filename}: expected one *.dist-info/METADATA, found {len(names)}")
    info = archive.getinfo(names[0])
    if info.file_size > WHOLE_LIMIT or info.compress_size > WHOLE_LIMIT:
        raise IndexUnavailable(f"{filename}: its METADATA is {info.file_size} bytes, more than a wheel's metadata")
    if info.flag_bits & 0x1:
        raise IndexUnavailable(f"{filename}: not a readable wheel (its METADATA is encrypted)")
    if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        raise IndexUnavailable(
            f"{filename}: not a readable wheel (its METADATA is compressed with method "
            f"{info.compress_type}; a wheel uses stored or deflate)"
        )
    with archive.open(info) as member:
        data = member.read(WHOLE_LIMIT + 1)
    if len(data) > WHOLE_LIMIT:
        raise IndexUnavailable(f"{filename}: its METADATA is larger than {WHOLE_LIMIT >> 20} MiB")
    return data.decode("utf-8", "replace")


def _wheel_metadata(file: DistFile, credentials: Credentials | None, timeout: float) -> str:
    try:
        answer = _get(file.url, credentials, limit=WHOLE_LIMIT, timeout=timeout, headers={"Range": f"bytes=-{_TAIL}"})
    except net.TooLarge as exc:
        if exc.announced:
            raise IndexUnavailable(
                f"{redact(file.url)}: the server offers neither PEP 658 metadata nor range requests, and {exc.reason}"
            ) from None
        raise
    source: io.RawIOBase | io.BytesIO
    if answer.status == 206:
        total = answer.headers.get("Content-Range", "").rpartition("/")[2]
        size = int(total) if total.isdigit() else len(answer.body)
        if len(answer.body) > size:
            raise IndexUnavailable(f"{file.filename}: the server sent {len(answer.body)} bytes of a {size}-byte file")
        source = _RangeFile(credentials, file.url, size, answer.body, timeout)
    else:  # no range support: the whole file, when it is small
        source = io.BytesIO(answer.body)
    try:
        with zipfile.ZipFile(source) as archive:
            return _metadata_member(archive, file.filename)
    except (
        zipfile.BadZipFile,
        zipfile.LargeZipFile,
        NotImplementedError,
        RuntimeError,
        EOFError,
        zlib.error,
        struct.error,
    ) as exc:
        raise IndexUnavailable(f"{file.filename}: not a readable wheel ({exc})") from None


def _check_metadata(text: str, release: Release, filename: str) -> str:
    """*text* if it is the metadata of *release* (its Name and Version, by PEP 503 and PEP 440 equality)."""
    if not release.project:
        return text
    headers = email.parser.HeaderParser().parsestr(text, headersonly=True)
    name, version = str(headers.get("Name") or ""), str(headers.get("Version") or "")
    try:
        same_version = Version(version) == Version(release.version)
    except InvalidVersion:
        same_version = False
    if canonicalize_name(name) != release.project or not same_version:
        raise IndexUnavailable(
            f"{filename}: its metadata is of {name or '(no Name)'} {version or '(no Version)'}, "
            f"not of {release.project} {release.version}"
        )
    return text


def core_metadata(index: str, release: Release, *, timeout: float = TIMEOUT) -> str:
    """The METADATA text of one wheel of *release* on *index* (whose credentials go to its host only).

    Each request is whole within *timeout* seconds. Raises IndexUnavailable when no wheel can be read (the
    release has only an sdist, every server refused, or what came back is another project's or version's).
    """
    _, credentials = split(index)
    index_host = urlsplit(split(index)[0]).netloc
    problems: list[str] = []
    for file in _preferred(release.files)[:3]:
        mine = credentials if urlsplit(file.url).netloc == index_host else None
        try:
            if file.metadata:
                text = _get(file.url + ".metadata", mine, limit=WHOLE_LIMIT, timeout=timeout).text()
            else:
                text = _wheel_metadata(file, mine, timeout)
            return _check_metadata(text, release, file.filename)
        except _Refused as exc:
            problems.append(f"{file.filename}: HTTP {exc.status}")
        except net.HttpError as exc:
            problems.append(f"{file.filename}: {exc.reason}")
        except (OSError, http.client.HTTPException, ValueError) as exc:
            problems.append(f"{file.filename}: {redact_text(str(exc))}")
        except IndexUnavailable as exc:
            problems.append(str(exc))
    if not problems:
        raise IndexUnavailable(f"{redact(index)}: {release.version} has no wheel to read its Requires-Dist from")
    raise IndexUnavailable(f"{redact(index)}: cannot read the metadata of {release.version}: " + "; ".join(problems))


def requires_dist(metadata: str) -> tuple[str, ...]:
    """The ``Requires-Dist`` lines of a METADATA text (RFC 822 headers, continuation lines joined)."""
    headers = email.parser.HeaderParser().parsestr(metadata)
    return tuple(" ".join(str(v).split()) for v in headers.get_all("Requires-Dist") or [])
