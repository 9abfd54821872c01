"""What may go into a request's head, checked when a configuration is built (so that nothing
is sent): header names that are tokens and not the ones the HTTP client frames the message
with, header values of visible ASCII, URLs without control characters or whitespace, and
proxies the relay can speak to; and how what goes there may be shown.

A CR or LF in a header value ends the header on the wire: the rest would be read as another
header, or a second request. The everyday case is an API key read from a file with its
trailing newline; it is refused with that fix rather than stripped, since a secret the relay
changed silently is a secret no one can check::

    check_header_value("api_key", open("key").read())   # InvalidHeaderError: ... line break
    check_header("extra_headers['x-team']", "x-team", "a")  # fine
    check_header("extra_headers['Host']", "Host", "a")      # InvalidHeaderError: ... frames
    check_url_text("base_url", "http://gpu:8000/v1\\n")      # ValueError: ... line break
    check_proxy_url("socks5://127.0.0.1:1080", "proxy")      # ValueError: ... session_factory

A header value may be a credential (``Authorization``, ``X-Api-Key``, a cookie), and so may a
URL's password: messages never repeat them, and :func:`shown_url` is a URL as it may be
printed::

    shown_url("http://relay:s3cret@proxy:3128")  # 'http://relay:**********@proxy:3128'
"""

from __future__ import annotations

import re
import unicodedata
import urllib.parse
import urllib.request
from collections.abc import Mapping

import yarl

from .errors import InvalidHeaderError

_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
"""RFC 9110's token: what a header name is made of."""
_NOT_FIELD_VALUE = re.compile(r"[^\t\x20-\x7e]")
"""What RFC 9110's field-value may not hold: anything but visible ASCII, space and tab (its
obs-text, bytes 0x80-0xFF, is refused too: servers read them as Latin-1 or UTF-8 or refuse
them, and a line separator among them has split requests in some)."""
FRAMING_HEADERS = frozenset(
    {
        "connection",
        "content-length",
        "host",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
"""Headers that say where a message goes and how it is framed, which the HTTP client writes
from the request itself: given here, a ``content-length`` cuts the body, a
``transfer-encoding`` leaves the server waiting for chunks that never come, a ``host`` sends
the request to another site behind the same address."""
HIDDEN = "**********"
"""What a secret is shown as (as pydantic shows a ``SecretStr``)."""
_NETLOC_END = re.compile(r"[/?#]")


def shown_url(url: str) -> str:
    """`url` as it may be printed: the password of its user info hidden (the whole user info
    when it has no password: a token given as a user name)."""
    scheme, separator, rest = url.partition("://")
    if not separator:  # no scheme: the user info would be at the start
        scheme, rest = "", url
    end = _NETLOC_END.search(rest)
    netloc, path = (rest[: end.start()], rest[end.start() :]) if end else (rest, "")
    userinfo, at, host = netloc.rpartition("@")  # as urllib and yarl split it
    if not at:
        return url
    user, colon, _ = userinfo.partition(":")
    return f"{scheme}{separator}{f'{user}:{HIDDEN}' if colon else HIDDEN}@{host}{path}"


def check_header(where: str, name: str, value: str) -> None:
    """Refuse a header the relay will not send (:func:`check_header_name`,
    :func:`check_header_value`)."""
    check_header_name(where, name)
    check_header_value(where, value)


def check_headers(where: str, headers: Mapping[str, str]) -> None:
    """Refuse `headers` if one of them is refused (:func:`check_header`), naming it."""
    for name, value in headers.items():
        check_header(f"{where}[{name!r}]", name, value)


def check_header_value(where: str, value: str) -> None:
    """Refuse a header value that is not RFC 9110's field-value of visible ASCII (a line
    break, another control character, a character past ASCII) or that starts or ends with
    a space or tab (which the server strips); the message names the character's kind and
    position, never the value (it may be a credential)."""
    found = _NOT_FIELD_VALUE.search(value)
    if found is None:
        if value.strip(" \t") != value:
            raise InvalidHeaderError(
                f"{where}: the value starts or ends with a space or tab, which the server "
                "strips (it would not receive the value given): remove it"
            )
        return
    trimmed = value.rstrip("\r\n")
    if trimmed != value and _NOT_FIELD_VALUE.search(trimmed) is None:
        raise InvalidHeaderError(
            f"{where}: the value ends with a line break (a value read from a file keeps its "
            "newline): strip it, e.g. Path(...).read_text().strip()"
        )
    raise InvalidHeaderError(
        f"{where}: the value holds {_kind(found.group())} at position {found.start()}, "
        "which a header does not carry as it is (visible ASCII, spaces and tabs only): "
        "remove it, or encode the value (e.g. base64)"
    )


def check_header_name(where: str, name: str) -> None:
    """Refuse a header name that is not a token, or one the HTTP client frames the message
    with (:data:`FRAMING_HEADERS`)."""
    if not _TOKEN.fullmatch(name):
        raise InvalidHeaderError(
            f"{where}: {name!r} is not a header name (letters, digits and !#$%&'*+-.^_`|~ only)"
        )
    if name.lower() in FRAMING_HEADERS:
        raise InvalidHeaderError(
            f"{where}: {name!r} says where the request goes or how it is framed, which the "
            "HTTP client writes from the request itself (one given here would cut the body, "
            "hang the server or reach another site): leave it out"
        )


def check_url_text(where: str, url: str) -> None:
    """Refuse a URL holding a control character or whitespace (a line break, a tab, a
    space, U+2028, a zero-width character): urllib drops some of them silently and yarl
    quotes others, so the URL requested would not be the one given."""
    for position, char in enumerate(url):
        if char.isspace() or unicodedata.category(char) in ("Cc", "Cf", "Zl", "Zp", "Zs"):
            raise ValueError(
                f"{where}: {shown_url(url)!r} holds {_kind(char)} at position {position}, "
                "which a URL cannot carry as it is: remove it (or percent-encode it, if it "
                "is meant)"
            )


def _kind(char: str) -> str:
    """What `char` is, in a message that must not show the value it is in."""
    if unicodedata.category(char) in ("Cc", "Cf", "Zl", "Zp"):
        line_break = " (a line break)" if char in "\r\n\x85\u2028\u2029" else ""
        return f"the control character U+{ord(char):04X}{line_break}"
    if char.isspace():
        return f"the space character U+{ord(char):04X}" if char != " " else "a space"
    return "a character past ASCII"


def check_proxy_url(url: str, where: str) -> None:
    """Refuse a proxy the relay would not speak to as its scheme says (only HTTP proxies:
    ``http://``, and ``https://`` for TLS to the proxy), or whose URL the HTTP client
    would not read as given (no host, whitespace, control characters)."""
    check_url_text(where, url)
    shown = shown_url(url)
    scheme = urllib.parse.urlsplit(url).scheme.lower()
    if scheme.startswith("socks"):
        raise ValueError(
            f"{where}: {shown!r} is a SOCKS proxy, which the relay's HTTP client does not speak "
            "(sending through it as an HTTP proxy would be wrong, and unencrypted): give the "
            "endpoint a session_factory whose connector does, e.g. aiohttp-socks' "
            "ProxyConnector.from_url(...)"
        )
    if scheme not in ("http", "https"):
        raise ValueError(f"{where}: {shown!r} is not an http:// or https:// proxy URL")
    try:
        host = yarl.URL(url).host  # as the HTTP client reads it
    except ValueError:  # no host, a port that is not a number, ...
        host = None
    if not host:
        raise ValueError(
            f"{where}: {shown!r} is not a proxy URL the HTTP client reads (a host, and a "
            "port that is a number): write e.g. 'http://proxy:3128'"
        )


def environment_proxy(url: str) -> str | None:
    """The proxy the environment names for `url` (``HTTP_PROXY`` / ``HTTPS_PROXY`` /
    ``ALL_PROXY``, unless ``NO_PROXY`` covers its host), checked as :func:`check_proxy_url`
    checks; None for none."""
    parts = urllib.parse.urlsplit(url)
    proxies = urllib.request.getproxies_environment()
    proxy = proxies.get(parts.scheme) or proxies.get("all")
    bypass = urllib.request.proxy_bypass_environment  # type: ignore[attr-defined]
    if not proxy or bypass(parts.hostname or "", proxies):
        return None
    proxy = proxy if "://" in proxy else f"http://{proxy}"
    variable = f"{parts.scheme.upper()}_PROXY" if parts.scheme in proxies else "ALL_PROXY"
    check_proxy_url(proxy, f"the environment's {variable}")
    return proxy
