"""What may go into a request's head, checked when a configuration is built (so that nothing
is sent): header names and values without line breaks or other control characters, and
proxies the relay can speak to; and how what goes there may be shown.

A CR or LF in a header value ends the header on the wire: the rest would be read as another
header, or a second request. The everyday case is an API key read from a file with its
trailing newline; it is refused with that fix rather than stripped, since a secret the relay
changed silently is a secret no one can check::

    check_header_value("api_key", open("key").read())   # ValueError: ... ends with a line break
    check_header("extra_headers['x-team']", "x-team", "a")  # fine
    check_proxy_url("socks5://127.0.0.1:1080", "proxy")      # ValueError: ... session_factory

A header value may be a credential (``Authorization``, ``X-Api-Key``, a cookie), and so may a
URL's password: messages never repeat them, and :func:`shown_url` is a URL as it may be
printed::

    shown_url("http://relay:s3cret@proxy:3128")  # 'http://relay:**********@proxy:3128'
"""

from __future__ import annotations

import re
import urllib.parse
import urllib.request

_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
"""RFC 9110's token: what a header name is made of."""
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
"""Control characters, which no header value may hold (a tab may)."""
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
    """Refuse a header whose name is not a token or whose value holds a control character
    (the value is not repeated: it may be a credential)."""
    check_header_name(where, name)
    check_header_value(where, value, secret=True)


def check_header_value(where: str, value: str, *, secret: bool = False) -> None:
    """Refuse a header value with a line break or another control character; a secret is
    not repeated in the message."""
    found = _CONTROL.search(value)
    if found is None:
        return
    shown = "the value" if secret else repr(value)
    if value.rstrip("\r\n") != value and _CONTROL.search(value.rstrip("\r\n")) is None:
        raise ValueError(
            f"{where}: {shown} ends with a line break (a value read from a file keeps its "
            "newline): strip it, e.g. Path(...).read_text().strip()"
        )
    raise ValueError(
        f"{where}: {shown} holds the control character {found.group()!r} at position "
        f"{found.start()}, which a header cannot carry: remove it"
    )


def check_header_name(where: str, name: str) -> None:
    """Refuse a header name that is not a token."""
    if not _TOKEN.fullmatch(name):
        raise ValueError(
            f"{where}: {name!r} is not a header name (letters, digits and !#$%&'*+-.^_`|~ only)"
        )


def check_proxy_url(url: str, where: str) -> None:
    """Refuse a proxy the relay would not speak to as its scheme says: only HTTP proxies
    (``http://``, and ``https://`` for TLS to the proxy) are spoken here."""
    scheme = urllib.parse.urlsplit(url).scheme.lower()
    if scheme in ("http", "https"):
        return
    shown = shown_url(url)
    if scheme.startswith("socks"):
        raise ValueError(
            f"{where}: {shown!r} is a SOCKS proxy, which the relay's HTTP client does not speak "
            "(sending through it as an HTTP proxy would be wrong, and unencrypted): give the "
            "endpoint a session_factory whose connector does, e.g. aiohttp-socks' "
            "ProxyConnector.from_url(...)"
        )
    raise ValueError(f"{where}: {shown!r} is not an http:// or https:// proxy URL")


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
