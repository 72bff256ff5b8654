"""Credentials in URLs: split them off, and redact every URL that a person or a file will see.

An index URL may carry HTTP basic credentials as its userinfo, ``https://user:password@host/simple``
(RFC 3986 §3.2.1; both parts percent-encoded, the last ``@`` of the authority ends them, as WHATWG
and uv parse it). The lab never writes them anywhere: the install spec, the argv, results, logs and
reports all hold the URL without them, and uv gets them from its per-index environment variables.
Wherever a URL is shown, ``redact`` puts ``***`` in place of the whole userinfo (user names are often
tokens too): ``https://***@host/simple``. ``redact_text`` does the same for every URL inside free text
(uv's messages, a rendered string), as defence in depth.

Standard library only: config/, envs and render/ all use it.
"""

from __future__ import annotations

import dataclasses
import re
from urllib.parse import unquote, urlsplit, urlunsplit

__all__ = ["MASK", "Credentials", "has_credentials", "redact", "redact_text", "split"]

MASK = "***"

# A scheme, "://", then an authority whose userinfo ends at its last "@". Characters that end a URL in
# prose, markup, JSON or TOML (whitespace, quotes, angle brackets, backslash, backtick) end the search,
# so that an "@" further on (an e-mail address) is never taken for one.
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://)[^\s/?#\"<>\\`]*@")


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Credentials:
    """HTTP basic credentials, percent-decoded; the password is never in ``repr``."""

    username: str
    password: str | None = dataclasses.field(default=None, repr=False)


def _parts(url: str) -> tuple[str, str, str] | None:
    """(scheme, userinfo, host[:port]) of *url*, or None when it has no authority."""
    try:
        parsed = urlsplit(url)
    except ValueError:
        return None
    userinfo, at, hostport = parsed.netloc.rpartition("@")
    if not at:
        return None
    return parsed.scheme, userinfo, hostport


def has_credentials(url: str) -> bool:
    """True when *url* carries a userinfo (``user@`` or ``user:password@``)."""
    return _parts(url) is not None or bool(_USERINFO.search(url))


def split(url: str) -> tuple[str, Credentials | None]:
    """*url* without its userinfo, and the credentials it carried (None when it carried none).

    >>> split("https://alice:p%40ss@host/simple")
    ('https://host/simple', Credentials(username='alice'))
    """
    parts = _parts(url)
    if parts is None:
        return url, None
    _, userinfo, hostport = parts
    parsed = urlsplit(url)
    clean = urlunsplit((parsed.scheme, hostport, parsed.path, parsed.query, parsed.fragment))
    user, colon, password = userinfo.partition(":")
    return clean, Credentials(username=unquote(user), password=unquote(password) if colon else None)


def redact(url: str) -> str:
    """*url* as it may be shown or written: ``https://***@host/simple``; unchanged without credentials."""
    parts = _parts(url)
    if parts is None:
        return redact_text(url)
    parsed = urlsplit(url)
    return urlunsplit((parsed.scheme, f"{MASK}@{parts[2]}", parsed.path, parsed.query, parsed.fragment))


def redact_text(text: str) -> str:
    """*text* with the userinfo of every URL in it replaced by ``***``."""
    return _USERINFO.sub(lambda m: f"{m.group(1)}{MASK}@", text)
