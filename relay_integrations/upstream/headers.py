"""What may go into a request's head, checked when a configuration is built (so that nothing
is sent): header names and values without line breaks or other control characters, and
proxies the relay can speak to.

A CR or LF in a header value ends the header on the wire: the rest would be read as another
header, or a second request. The everyday case is an API key read from a file with its
trailing newline; it is refused with that fix rather than stripped, since a secret the relay
changed silently is a secret no one can check::

    check_header_value("api_key", open("key").read())   # ValueError: ... ends with a line break
    check_header("extra_headers['x-team']", "x-team", "a")  # fine
    check_proxy_url("socks5://127.0.0.1:1080", "proxy")      # ValueError: ... session_factory
"""

from __future__ import annotations

import re
import urllib.parse
import urllib.request

_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
"""RFC 9110's token: what a header name is made of."""
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
"""Control characters, which no header value may hold (a tab may)."""


def check_header(where: str, name: str, value: str) -> None:
    """Refuse a header whose name is not a token or whose value holds a control character."""
    check_header_name(where, name)
    check_header_value(where, value)


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
    if scheme.startswith("socks"):
        raise ValueError(
            f"{where}: {url!r} is a SOCKS proxy, which the relay's HTTP client does not speak "
            "(sending through it as an HTTP proxy would be wrong, and unencrypted): give the "
            "endpoint a session_factory whose connector does, e.g. aiohttp-socks' "
            "ProxyConnector.from_url(...)"
        )
    raise ValueError(f"{where}: {url!r} is not an http:// or https:// proxy URL")


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
