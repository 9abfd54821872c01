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
    check_proxy_url("socks5://127.0.0.1:1080", "proxy")      # InvalidProxyError: ... SOCKS

A proxy of the environment (``HTTP_PROXY``, ``HTTPS_PROXY``, ``ALL_PROXY``) is checked as the
``proxy`` setting is, when an endpoint is made: a value the HTTP client cannot use is an
:class:`InvalidProxyError` naming the variable and the fix::

    os.environ["HTTPS_PROXY"] = "http://relay:s3cret@:3128"
    environment_proxy("https://gpu:8000/v1")
    # InvalidProxyError: the environment's HTTPS_PROXY: 'http://relay:**********@:3128' is
    # not a proxy URL the HTTP client reads (a host, and a port that is a number): ...

A header value may be a credential (``Authorization``, ``X-Api-Key``, a cookie), and so may a
URL's password: messages never repeat them, and :func:`shown_url` is a URL as it may be
printed::

    shown_url("http://relay:s3cret@proxy:3128")  # 'http://relay:**********@proxy:3128'
"""

from __future__ import annotations

import os
import re
import unicodedata
import urllib.parse
import urllib.request
from collections.abc import Mapping

import yarl

from .errors import InvalidHeaderError, InvalidProxyError

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
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")
"""A URL's scheme, as RFC 3986 spells one, and its ``://``."""


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
    problem = _text_problem(url)
    if problem is not None:
        raise ValueError(f"{where}: {shown_url(url)!r} {problem}")


def _text_problem(url: str, secret_before: int = 0) -> str | None:
    """What in `url` a URL cannot carry as it is (:func:`check_url_text`), or None; where it
    is, unless that is before `secret_before` (in a password, whose length is not shown)."""
    for position, char in enumerate(url):
        if char.isspace() or unicodedata.category(char) in ("Cc", "Cf", "Zl", "Zp", "Zs"):
            place = "in its user info" if position < secret_before else f"at position {position}"
            return (
                f"holds {_kind(char)} {place}, which a URL cannot carry as it is: remove it "
                "(or percent-encode it, if it is meant)"
            )
    return None


def _kind(char: str) -> str:
    """What `char` is, in a message that must not show the value it is in."""
    if unicodedata.category(char) in ("Cc", "Cf", "Zl", "Zp"):
        line_break = " (a line break)" if char in "\r\n\x85\u2028\u2029" else ""
        return f"the control character U+{ord(char):04X}{line_break}"
    if char.isspace():
        return f"the space character U+{ord(char):04X}" if char != " " else "a space"
    return "a character past ASCII"


def check_proxy_url(url: str, where: str) -> None:
    """Refuse (:class:`InvalidProxyError`) a proxy the relay would not speak to as its scheme
    says (only HTTP proxies: ``http://``, and ``https://`` for TLS to the proxy), or whose
    URL the HTTP client would not read as given (no host, a port that is not a number,
    whitespace, control characters)."""
    shown = _shown_proxy(url)
    problem = _text_problem(url, secret_before=url.rfind("@"))
    if problem is not None:
        raise InvalidProxyError(f"{where}: {shown!r} {problem}")
    named = _SCHEME.match(url)
    scheme = named.group(1).lower() if named else ""
    if scheme.startswith("socks"):
        raise InvalidProxyError(
            f"{where}: {shown!r} is a SOCKS proxy, which the relay's HTTP client does not speak "
            "(sending through it as an HTTP proxy would be wrong, and unencrypted): give the "
            "endpoint a session_factory whose connector does, e.g. aiohttp-socks' "
            "ProxyConnector.from_url(...)"
        )
    if scheme not in ("http", "https"):
        raise InvalidProxyError(
            f"{where}: {shown!r} is not an http:// or https:// proxy URL: write e.g. "
            "'http://proxy:3128' (https:// for TLS to the proxy)"
        )
    try:
        host = yarl.URL(url).host  # as the HTTP client reads it
    except ValueError:  # no host, a port that is not a number, a bracket never closed, ...
        host = None
    if not host:
        credentials = (
            ", with a user name and password percent-encoded (urllib.parse.quote: a ':', '/', "
            "'?', '#' or '@' in them ends them early)"
            if "@" in url
            else ""
        )
        raise InvalidProxyError(
            f"{where}: {shown!r} is not a proxy URL the HTTP client reads (a host, and a "
            f"port that is a number): write e.g. 'http://proxy:3128'{credentials}"
        )


def _shown_proxy(url: str) -> str:
    """`url` as a message about it may show it, however malformed: what stands between its
    scheme and its last ``@`` hidden as a password (the user name before it kept), even
    where the URL's own parse would end its user info sooner (a password holding ``/``,
    ``#`` or ``?``, not percent-encoded)."""
    scheme, separator, rest = url.partition("://")
    if not separator:
        scheme, rest = "", url
    userinfo, at, host = rest.rpartition("@")
    if not at:
        return url
    user, colon, _ = userinfo.partition(":")
    shown_user = f"{user}:{HIDDEN}" if colon and not _NETLOC_END.search(user) else HIDDEN
    return f"{scheme}{separator}{shown_user}@{host}"


def environment_proxy(url: str) -> str | None:
    """The proxy the environment names for `url` (``HTTP_PROXY`` / ``HTTPS_PROXY`` /
    ``ALL_PROXY``, or their lower-case names, unless ``NO_PROXY`` covers its host), checked
    as :func:`check_proxy_url` checks (an :class:`InvalidProxyError` names the variable);
    None for none."""
    parts = urllib.parse.urlsplit(url)
    proxies = urllib.request.getproxies_environment()
    key = parts.scheme if parts.scheme in proxies else "all"
    proxy = proxies.get(key)
    bypass = urllib.request.proxy_bypass_environment  # type: ignore[attr-defined]
    if not proxy or bypass(parts.hostname or "", proxies):
        return None
    variable = _variable_of(key, proxy)
    given = proxy if "://" in proxy else f"http://{proxy}"
    try:
        check_proxy_url(given, f"the environment's {variable}")
    except InvalidProxyError as refused:
        raise InvalidProxyError(
            f"{refused}; or unset {variable}, or set trust_env=False for this endpoint not "
            "to take proxies from the environment"
        ) from None
    return given


def _variable_of(key: str, value: str) -> str:
    """The environment variable `value` of the proxies for `key` (``https``, ``all``) came
    from: ``https_proxy`` before ``HTTPS_PROXY``, as urllib reads them."""
    lower = f"{key}_proxy"
    named = [name for name, given in os.environ.items() if name.lower() == lower]
    for name in sorted(named, key=lambda name: name != lower):
        if os.environ[name] == value:
            return name
    return lower.upper()
