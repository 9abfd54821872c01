"""What a failed upstream request means, in words that name the fix.

The SDK's own texts ("Connection error.", "Error code: 404") name neither the server nor what
to do. :func:`explain_failure` turns the final error of a request into the ``detail`` of an
``UpstreamFailure``: the URL, vLLM's own message, and for the mistakes met most (a server that
is not up, a base URL without ``/v1``, a wrong key) the fix. It reads only what the failed
request already says, so the happy path pays nothing::

    large endpoint: cannot reach http://127.0.0.1:8101/v1 (connection refused; 4 attempts over
    3.5 s). Check that the large vLLM server is up at that address.
    large endpoint: GET http://127.0.0.1:8101/models answered 404 Not Found. The base URL
    http://127.0.0.1:8101 does not end in /v1, where vLLM serves its OpenAI API: use
    base_url='http://127.0.0.1:8101/v1'.
"""

from __future__ import annotations

import socket
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeVar

import aiohttp
import openai

from ._http import ClientCertificateRefused, ClosedBeforeAnswer, IncompleteStream
from .config import EndpointConfig, ModelRole
from .headers import shown_url

E = TypeVar("E", bound=BaseException)
ERROR_OBJECT = "sent an error object"
"""What the error of an event stream whose body is a JSON error object says (its code is
the status of the SDK error it is raised as; the HTTP status was 200)."""
OUTAGE_STATUS = frozenset({502, 503, 504})
"""Statuses that say the server (or every replica behind a router) is out, not the request."""


class ServerDown(openai.APIConnectionError):
    """A request not sent: the server is known down (its breaker is open: see
    :mod:`.availability`)."""


def is_outage(failure: BaseException) -> bool:
    """Whether a request's final failure says the server is out: no connection (refused,
    not found, none within the connect timeout, lost before an answer), or a 502, 503, 504.
    Not a refused request, a busy server (429), one that accepted the request and was
    slow to answer (the read timeout: it is up, and a probe would say so), nor a
    :func:`misfit` (TLS, a client certificate the server wants, a proxy's refusal, a response
    that broke HTTP, a URL it cannot use):
    a restart fixes none of those. Nor an answer whose event stream ended short before its
    first piece (:class:`IncompleteStream`, its connection not lost): the server answered,
    and the request is tried again as one whose connection was lost."""
    if isinstance(failure, openai.APIStatusError):
        return failure.status_code in OUTAGE_STATUS
    if isinstance(failure, openai.APITimeoutError):
        return _in_chain(failure, "ConnectTimeout")
    incomplete = _found(failure, IncompleteStream)
    return (
        isinstance(failure, openai.APIConnectionError)
        and misfit(failure) is None
        and (incomplete is None or incomplete.lost)
    )


def answered(failure: BaseException) -> bool:
    """Whether the server itself answered the request, whatever it said (a refusal, an error
    status that is not an outage, a body that is not vLLM's, an error event: any failure
    that is not the SDK's): it is up."""
    if isinstance(failure, openai.APIStatusError):
        return failure.status_code not in OUTAGE_STATUS
    incomplete = _found(failure, IncompleteStream)
    if incomplete is not None:  # it answered; then its stream fell short, or was lost
        return not incomplete.lost
    return isinstance(failure, openai.APIResponseValidationError) or not isinstance(
        failure, openai.APIError
    )


@dataclass(frozen=True)
class Misfit:
    """A failure before any answer that is not the server being out: ``what`` it was, in
    words that name no address, and the ``fix``. Neither retried nor counted by the breaker:
    every request meets it until a setting (or what is in between) changes::

        the server's TLS certificate failed verification (self-signed certificate)
        the server requires a TLS client certificate and none was sent (tlsv13 alert
        certificate required)
    """

    what: str
    fix: str


PROXY_CREDENTIALS = (
    "The proxy wants credentials: put them in its URL (proxy='http://user:password@host:port', "
    "or HTTP_PROXY / HTTPS_PROXY / ALL_PROXY with trust_env)."
)


def misfit(failure: BaseException) -> Misfit | None:
    """What a connection error is when it is not the server being out, by aiohttp's own
    exception under it; None for an outage (or any other failure)."""
    if not isinstance(failure, openai.APIConnectionError):
        return None
    for error in _chain(failure):
        if isinstance(error, ClientCertificateRefused):  # mutual TLS, told after the handshake
            if error.sent:
                return Misfit(
                    f"the server refused the TLS client certificate ({error.sign})",
                    "Set cert to a client certificate the server accepts (signed by a CA it "
                    "trusts, and not expired).",
                )
            return Misfit(
                f"the server requires a TLS client certificate and none was sent ({error.sign})",
                "Set cert to the client certificate the server accepts: cert='client.pem' "
                "(certificate and key in one file), or cert=('client.crt', 'client.key').",
            )
        if isinstance(error, aiohttp.ClientConnectorCertificateError):
            said = error.certificate_error
            reason = getattr(said, "verify_message", None) or str(said)
            return Misfit(
                f"the server's TLS certificate failed verification ({reason})",
                "Set verify to the CA bundle that signed it (verify='/path/to/ca.pem', or "
                "SSL_CERT_FILE), or verify=False not to check it.",
            )
        if isinstance(error, aiohttp.ClientSSLError):
            os_error = error.os_error
            reason = getattr(os_error, "reason", None) or str(os_error)
            return Misfit(
                f"the TLS handshake failed ({str(reason).replace('_', ' ').lower()})",
                "Check that the server speaks TLS at that address (http:// if it does not), "
                "and set cert if it asks for a client certificate.",
            )
        if isinstance(error, aiohttp.ClientHttpProxyError):  # the answer to CONNECT
            return Misfit(
                f"the proxy refused with {error.status} {error.message}".rstrip(),
                _proxy_fix(error.status),
            )
        if isinstance(error, aiohttp.ClientResponseError):  # aiohttp's parser refused it
            return Misfit(
                f"the server's response broke HTTP ({_first_line(error.message)})",
                "vLLM speaks plain HTTP/1.1: something else answers at that address, or a "
                "proxy or load balancer in between mangles the response; check base_url "
                "and what is on the way.",
            )
        if isinstance(error, aiohttp.InvalidURL):  # (a proxy's URL is checked when it is set)
            reason = _first_line(str(error.__cause__ or error.description or "malformed"))
            return Misfit(
                f"its URL is not one the HTTP client can use ({reason})",
                f"Fix the URL {shown_url(str(error.url))} (base_url).",
            )
    return None


def _proxy_fix(status: int) -> str:
    if status == 407:
        return PROXY_CREDENTIALS
    if status == 403:
        return (
            "The proxy does not let the relay through to that host and port: check its rules, "
            "or keep this server out of the proxy (NO_PROXY, or trust_env=False)."
        )
    return "Check the proxy (proxy=, or HTTP_PROXY / HTTPS_PROXY / ALL_PROXY)."


def _first_line(message: str) -> str:
    """aiohttp's reason without the bytes it quotes (``Got more than 8190 bytes when reading:
    b'aaa...'``): the first line, up to a quoted value."""
    line = message.strip().splitlines()[0] if message.strip() else "no reason given"
    return line.split(": b'")[0].split(': b"')[0].rstrip(":. ")


@dataclass(frozen=True)
class Tries:
    """How hard a request was tried before it failed for good."""

    attempts: int
    seconds: float

    def __str__(self) -> str:
        if self.attempts == 1:
            return "1 attempt"
        return f"{self.attempts} attempts over {self.seconds:.1f} s"


def explain_failure(
    cause: BaseException, role: ModelRole, config: EndpointConfig, tries: Tries
) -> str:
    """What failed, at which URL, and what to check: the ``detail`` of an UpstreamFailure.

    ``cause`` is the request's final error (the SDK's, or an error event); ``tries`` how many
    attempts it had and how long they took.
    """
    if isinstance(cause, ServerDown):
        return (
            f"{config.base_url} is {cause.message}: the request was not sent. Check that the "
            f"{role} vLLM server is up at that address."
        )
    if fault := misfit(cause):
        return f"{config.base_url}: {fault.what}; {tries}. {fault.fix}"
    if isinstance(cause, openai.APITimeoutError) and not _in_chain(cause, "ConnectTimeout"):
        return (
            f"{config.base_url} accepted the request but sent nothing for "
            f"{config.read_timeout:g} s ({tries}): the {role} vLLM server there is overloaded "
            "or stuck, or read_timeout is too short."
        )
    if (incomplete := _found(cause, IncompleteStream)) is not None:
        return (
            f"{incomplete} ({tries}). vLLM ends every stream with a finish reason and [DONE]: "
            f"the {role} vLLM server there failed mid-request (see its log), or a proxy or "
            "load balancer in between cut the response."
        )
    if _found(cause, ClosedBeforeAnswer) is not None:
        return (
            f"{config.base_url} closed the connection before answering ({tries}). Check that "
            f"the {role} vLLM server is up there and not restarting (see its log)."
        )
    if isinstance(cause, openai.APIConnectionError):
        proxy = _proxy_address(cause)
        return f"cannot reach {config.base_url} ({_transport_reason(cause, config)}; {tries}). " + (
            f"Check that the proxy at {proxy} is up (proxy=, or HTTP_PROXY / HTTPS_PROXY)."
            if proxy
            else f"Check that the {role} vLLM server is up at that address."
        )
    if isinstance(cause, openai.APIStatusError):
        return _status_detail(cause, role, config, tries)
    if isinstance(cause, openai.APIResponseValidationError):
        return (
            f"{cause.message}. That is not the answer of vLLM's OpenAI API: check that "
            f"base_url={config.base_url!r} reaches the {role} vLLM server itself (not a "
            "gateway's login page, or a path a proxy serves something else at)."
        )
    return f"{cause} (from {config.base_url})"  # an error event: vLLM's message is in it


def public_reason(cause: BaseException, config: EndpointConfig) -> str:
    """Why a request failed, in words that name no address (no URL, no host): what a
    remote client of ``relaygen serve`` is told, while the log keeps the detail."""
    if isinstance(cause, ServerDown):
        return cause.message
    if isinstance(cause, openai.APITimeoutError):
        if _in_chain(cause, "ConnectTimeout"):
            return f"no connection within {config.connect_timeout:g} s"
        return f"it sent nothing for {config.read_timeout:g} s"
    if fault := misfit(cause):
        return fault.what
    if _found(cause, IncompleteStream) is not None:
        return "its event stream ended before the answer was whole"
    if _found(cause, ClosedBeforeAnswer) is not None:
        return "it closed the connection before answering"
    if isinstance(cause, openai.APIConnectionError):
        chain = _chain(cause)
        if any(isinstance(error, ConnectionRefusedError) for error in chain):
            return "it refused the connection"
        if any(isinstance(error, socket.gaierror) for error in chain):
            return "its host name was not found"
        return "the connection to it failed"
    if isinstance(cause, openai.APIStatusError) and cause.status_code == 407:
        return "the proxy on the way answered 407 Proxy Authentication Required"
    if isinstance(cause, openai.APIStatusError):
        said = _server_message(cause.body)
        return f"it answered {cause.status_code}" + (f": {said}" if said else "")
    if isinstance(cause, openai.APIResponseValidationError):
        return "it answered something that is not vLLM's OpenAI API"
    return str(cause)  # an error event: vLLM's own words


def explain_broken_stream(
    cause: BaseException, role: ModelRole, config: EndpointConfig, breaks: int
) -> str:
    """Why a turn gave up after its stream broke `breaks` times, each after it had sent text
    (the turn resumed from the text so far after all but the last): the ``detail`` of its
    UpstreamFailure."""
    said = str(cause) or type(cause).__name__
    if breaks == 1:
        tried = "once, with SwitchPolicy.max_resumes=0"
    else:
        resumes = "1 resume" if breaks == 2 else f"{breaks - 1} resumes"
        tried = f"{breaks} times in one turn (the request and {resumes} from the text so far)"
    return (
        f"the stream from {config.base_url} broke after sending text, {tried}; last: {said}. "
        f"Check the {role} vLLM server's log for a crash or restart, and any proxy or load "
        "balancer in between for a response or idle timeout; SwitchPolicy.max_resumes allows "
        "more resumes. The text written so far is in the error's .partial."
    )


def _transport_reason(cause: openai.APIConnectionError, config: EndpointConfig) -> str:
    """Why no connection was made, from the exceptions under the SDK's "Connection error."."""
    chain = _chain(cause)
    if any(isinstance(error, ConnectionRefusedError) for error in chain):
        return "connection refused"
    if any(isinstance(error, socket.gaierror) for error in chain):
        # aiohttp names the host it looked up: the proxy's, when there is one
        connector = [e for e in chain if isinstance(e, aiohttp.ClientConnectorError)]
        host = connector[0].host if connector else cause.request.url.host
        return f"host name {host!r} not found"
    if _in_chain(cause, "ConnectTimeout"):
        return f"no connection within connect_timeout={config.connect_timeout:g} s"
    innermost = chain[-1]
    return str(innermost) or type(innermost).__name__


def _status_detail(
    cause: openai.APIStatusError, role: ModelRole, config: EndpointConfig, tries: Tries
) -> str:
    request, response = cause.request, cause.response
    if ERROR_OBJECT in cause.message:  # a 200 event stream whose body was an error object
        text = f"{cause.message} (code {response.status_code})"
    else:
        text = f"{request.method} {request.url} answered {response.status_code}"
        reason = response.reason_phrase
        text += f" {reason}" if reason else ""
        said = _server_message(cause.body)
        if said and said.lower() != reason.lower():  # FastAPI's bare 404 says "Not Found"
            text += f": {said}"
    if tries.attempts > 1:
        text += f" ({tries})"
    hint = _status_hint(cause, role, config)
    return f"{text.rstrip('.')}. {hint}" if hint else text


def _status_hint(cause: openai.APIStatusError, role: ModelRole, config: EndpointConfig) -> str:
    status, base_url = cause.status_code, config.base_url.rstrip("/")
    if 300 <= status < 400:
        return _redirect_hint(cause, config)
    # vLLM serves its OpenAI routes under /v1 only: a 404 on one of them from a base URL
    # without /v1 is that mistake (a wrong model name is a 404 from /v1/... itself).
    if status == 404 and not base_url.endswith("/v1") and _is_openai_route(cause):
        return (
            f"The base URL {config.base_url} does not end in /v1, where vLLM serves its "
            f"OpenAI API: use base_url={_with_v1(base_url)!r}."
        )
    if status == 401 and config.api_key is None:
        return f"The {role} vLLM server wants an API key (--api-key): set api_key."
    if status == 401:
        return f"Check api_key: it must be the --api-key the {role} vLLM server was started with."
    if status == 407:  # a plain-HTTP request's proxy answers it itself (no CONNECT)
        return f"That is the proxy's answer, not the server's. {PROXY_CREDENTIALS}"
    return ""


def _redirect_hint(cause: openai.APIStatusError, config: EndpointConfig) -> str:
    """Where a redirect points, as the base URL to use: the relay follows none (a request
    body sent again elsewhere, a key sent to another host)."""
    location = cause.response.headers.get("location")
    if not location:
        return "The relay follows no redirect: set base_url to the server's own address."
    target = urllib.parse.urljoin(str(cause.request.url), location)
    asked = str(cause.request.url)
    base = config.base_url.rstrip("/")
    tail = asked[len(base) :] if asked.startswith(base) else ""
    suggested = target[: -len(tail)] if tail and target.endswith(tail) else target
    return (
        f"It redirects to {target}; the relay follows no redirect (the request and its key "
        f"would go elsewhere): use base_url={suggested!r}."
    )


def _is_openai_route(cause: openai.APIStatusError) -> bool:
    # /tokenize and /detokenize are at the server root, where a 404 means "not vLLM"
    return str(cause.request.url.path).rstrip("/").endswith(("/models", "/completions"))


def _with_v1(base_url: str) -> str:
    """The base URL ending in /v1: cut after a /v1 inside it (".../v1/completions"), or add it."""
    head, v1, _ = base_url.partition("/v1/")
    return head + "/v1" if v1 else base_url + "/v1"


def _proxy_address(cause: openai.APIConnectionError) -> str | None:
    """The proxy's ``host:port`` when the connection that failed was the one to the proxy."""
    for error in _chain(cause):
        if isinstance(error, aiohttp.ClientConnectorError):
            proxied = isinstance(error, aiohttp.ClientProxyConnectionError)
            if proxied or error.host != cause.request.url.host:
                return f"{error.host}:{error.port}"
    return None


def _server_message(body: object) -> str | None:
    """vLLM's own words in an error body: ``{"message": ...}`` (the SDK unwraps ``"error"``),
    FastAPI's ``{"detail": ...}``, or a bare string (vLLM's 401: ``{"error": "Unauthorized"}``).
    """
    if isinstance(body, Mapping):
        message = body.get("message") or body.get("detail")
        return str(message) if message else None
    if isinstance(body, str):
        return body.strip() or None
    return None


def _found(failure: BaseException, kind: type[E]) -> E | None:
    """The first exception of `kind` in `failure`'s chain (an :class:`IncompleteStream`: an
    answer whose event stream fell short before its first piece), if any."""
    for error in _chain(failure):
        if isinstance(error, kind):
            return error
    return None


def _chain(error: BaseException) -> list[BaseException]:
    """`error` and the exceptions it was raised from, outermost first."""
    chain = [error]
    while (cause := chain[-1].__cause__ or chain[-1].__context__) and cause not in chain:
        chain.append(cause)
    return chain


def _in_chain(error: BaseException, name_part: str) -> bool:
    # by name: httpx and httpx2 (per openai version) have their own exception classes
    return any(name_part in type(link).__name__ for link in _chain(error))
