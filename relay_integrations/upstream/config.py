"""Configuration of one upstream vLLM server and of the sampling of its requests::

    from relay_integrations.upstream import EndpointConfig, SamplingConfig, SamplingOverrides

    small = EndpointConfig(base_url="http://gpu-b:8000/v1", model="Qwen/Qwen3-1.7B",
                           sampling=SamplingOverrides(temperature=0.3))
    SamplingConfig(max_tokens=8192).request_fields(small.sampling)  # one request's fields

The relay's configuration (both endpoints, the policy, the cue set) builds on these:
:mod:`relay_integrations.relay.config`.

An endpoint's secrets (its key, its headers' values, its proxy's password) never show: its
repr and JSON dumps hide them, and errors name the field and the reason, never the value::

    EndpointConfig(base_url=..., model="m", api_key="k", extra_headers={"X-Key": "k"})
    # EndpointConfig(..., api_key=SecretStr('**********'), extra_headers={'X-Key': '**********'})
"""

from __future__ import annotations

import ssl
import urllib.parse
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

import aiohttp
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    FieldSerializationInfo,
    SecretStr,
    field_serializer,
    field_validator,
    model_validator,
)

from .headers import (
    HIDDEN,
    check_header_value,
    check_headers,
    check_proxy_url,
    check_url_text,
    shown_url,
)
from .reserved_fields import check_extra_body

ModelRole = Literal["large", "small"]
MODEL_ROLES: tuple[ModelRole, ...] = get_args(ModelRole)
"""The two models, in the order the relay lists them."""


class Frozen(BaseModel):
    """A frozen pydantic model that refuses unknown fields."""

    model_config = ConfigDict(frozen=True, extra="forbid")


Temperature = Annotated[float, Field(ge=0, le=2, description="vLLM allows [0, 2]")]
TopP = Annotated[float, Field(gt=0, le=1)]
TopK = Annotated[int, Field(ge=-1, description="0 or -1: no top-k cut")]
MinP = Annotated[float, Field(ge=0, le=1)]
Penalty = Annotated[
    float, Field(ge=-2, le=2, description="presence/frequency penalty, vLLM allows [-2, 2]")
]
RepetitionPenalty = Annotated[
    float, Field(gt=0, allow_inf_nan=False, description="1 is none; vLLM allows (0, inf)")
]
Seed = Annotated[int, Field(ge=-(2**63), lt=2**63, description="vLLM's: a 64-bit integer")]


class OptionalSampling(BaseModel):
    """The sampling fields of one request, each optional (None: not set here): the fields of
    :class:`SamplingOverrides` and of ``relaygen serve``'s requests."""

    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: TopK | None = None
    min_p: MinP | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    repetition_penalty: RepetitionPenalty | None = None
    seed: Seed | None = None


MODEL_SAMPLING_FIELDS = tuple(OptionalSampling.model_fields)
"""The sampling fields of one upstream request (the token budget is the generation's)."""


class SamplingOverrides(OptionalSampling, Frozen):
    """One model's own sampling, over the shared :class:`SamplingConfig` (unset: shared)::

    EndpointConfig(base_url=..., model="Qwen/Qwen3-1.7B",
                   sampling=SamplingOverrides(temperature=0.3, presence_penalty=1.5))
    """


class SamplingConfig(Frozen):
    """Sampling shared by both models. Defaults are the RelayGen paper's; a field left None is
    not sent, so the server's default (the model's ``generation_config``) applies."""

    temperature: Temperature = Field(default=0.6, description="sampling temperature, [0, 2]")
    top_p: TopP = Field(default=0.95, description="nucleus sampling mass, (0, 1]")
    top_k: TopK | None = Field(default=20, description="top-k cut (0 or -1: none)")
    min_p: MinP | None = Field(default=None, description="min-p cut relative to the top token")
    presence_penalty: Penalty | None = Field(
        default=None,
        description="[-2, 2]; Qwen3's model card suggests up to 1.5 against endless repetition",
    )
    frequency_penalty: Penalty | None = Field(default=None, description="[-2, 2]")
    repetition_penalty: RepetitionPenalty | None = Field(
        default=None, description="vLLM's multiplicative penalty (1: none)"
    )
    seed: Seed | None = Field(default=None, description="seed of both models' sampling")
    max_tokens: int = Field(
        default=32768, ge=1, description="One budget for reasoning plus answer, over all segments"
    )

    def request_fields(self, own: SamplingOverrides | None = None) -> dict[str, Any]:
        """The sampling fields of one model's request: the shared values with the model's own
        over them; unset fields are left out (the server's defaults)."""
        fields = {name: getattr(self, name) for name in MODEL_SAMPLING_FIELDS}
        if own is not None:
            fields.update(own.model_dump(exclude_none=True))
        return {name: value for name, value in fields.items() if value is not None}


SECRET_ENDPOINT_FIELDS = ("api_key", "extra_headers")
"""The fields of :class:`EndpointConfig` whose values are secrets: the key, and the headers
(any header may carry a credential)."""
URL_ENDPOINT_FIELDS = ("base_url", "proxy")
"""The fields of :class:`EndpointConfig` that are URLs, whose password is a secret."""


def shown_endpoint_field(name: str, value: Any) -> Any:
    """The value of :class:`EndpointConfig`'s field `name` as it may be printed: the key as a
    ``SecretStr``, every header's value hidden, a URL's password hidden."""
    if value is None:
        return None
    if name == "api_key":
        return value if isinstance(value, SecretStr) else SecretStr(str(value))
    if name == "extra_headers" and isinstance(value, Mapping):
        return {header: HIDDEN for header in value}
    if name in URL_ENDPOINT_FIELDS and isinstance(value, str):
        return shown_url(value)
    return value


def dumped_endpoint_fields(fields: Mapping[str, Any]) -> dict[str, Any]:
    """:class:`EndpointConfig` fields (a model's own ``large=``/``small=`` settings) as a dump
    that may be stored: without the secrets (they come back from where secrets are kept: the
    environment) and the fields a dump excludes (a session factory), a URL's password hidden."""
    return {
        name: shown_endpoint_field(name, value)
        for name, value in fields.items()
        if name not in SECRET_ENDPOINT_FIELDS
        and not (name in EndpointConfig.model_fields and EndpointConfig.model_fields[name].exclude)
    }


class EndpointConfig(Frozen):
    """One vLLM OpenAI-compatible server and the model it serves."""

    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)
    """Errors name the field and the reason, never the value: an API key may be one."""

    base_url: str = Field(description="OpenAI base URL of the server, e.g. http://host:8000/v1")
    model: str = Field(description="Served model name (vLLM --served-model-name)")
    api_key: SecretStr | None = Field(default=None, description="Bearer key, if the server has one")
    connect_timeout: float = Field(default=10.0, gt=0, description="Seconds to open a connection")
    read_timeout: float = Field(
        default=600.0,
        gt=0,
        description="Seconds to wait for the next streamed chunk; a long reasoning trace is many "
        "chunks, so this bounds a stall, not a whole generation",
    )
    max_retries: int = Field(
        default=3, ge=0, description="Retries of a request that failed before its first token"
    )
    probe_interval: float = Field(
        default=1.0,
        gt=0,
        description="While the server is known down (failures_to_open requests in a row "
        "failed for good with no connection or a 502/503/504), requests to it fail at once "
        "but one every this many seconds, the half-open trial (GET /v1/models when no "
        "request comes); the trial's success brings it back",
    )
    failures_to_open: int = Field(
        default=5,
        ge=1,
        description="Requests in a row that must fail for good with no connection or a "
        "502/503/504 before the server is known down (its circuit breaker opens; Envoy's "
        "consecutive_5xx is 5 too); any answer from the server resets the count",
    )
    max_concurrency: int = Field(
        default=64, ge=1, description="Requests in flight to this endpoint at once"
    )
    max_stop_strings: int | None = Field(
        default=None,
        ge=0,
        description="Stop strings the server takes per request (vLLM: VLLM_MAX_STOP_STRINGS, "
        "4 unless set); None learns it from the server's first refusal. The relay finds the "
        "stop strings past it in the stream and closes the request there",
    )
    extra_headers: dict[str, str] = Field(default_factory=dict)
    verify: bool | str = Field(
        default=True,
        description="Check the server's TLS certificate (https): True (the system's CAs, and "
        "SSL_CERT_FILE / SSL_CERT_DIR), a CA bundle's path, or False (no check)",
    )
    cert: str | tuple[str, str] | None = Field(
        default=None,
        description="A client certificate for mutual TLS: a PEM file holding the certificate "
        "and its key, or (certificate file, key file)",
    )
    proxy: str | None = Field(
        default=None,
        description="An HTTP proxy for this server (http://[user:pass@]host:port; https:// for "
        "TLS to the proxy); None: the environment's HTTP_PROXY / HTTPS_PROXY / NO_PROXY when "
        "trust_env",
    )
    trust_env: bool = Field(
        default=True,
        description="Take proxies from HTTP_PROXY / HTTPS_PROXY / ALL_PROXY, bypassed for the "
        "hosts of NO_PROXY (and proxy credentials from ~/.netrc)",
    )
    session_factory: Callable[[], aiohttp.ClientSession] | None = Field(
        default=None,
        exclude=True,
        description="Makes the aiohttp ClientSession of this server's requests, once per event "
        "loop (a connector of one's own: a SOCKS proxy, a Unix socket, trace configs); the "
        "session then owns TLS and proxies",
    )
    extra_body: dict[str, Any] = Field(
        default_factory=dict, description="Extra vLLM request fields sent with every request"
    )
    sampling: SamplingOverrides = Field(
        default_factory=SamplingOverrides,
        description="This model's own sampling, over the shared values (e.g. a cooler small model)",
    )

    def __repr_args__(self) -> Iterable[tuple[str | None, Any]]:
        """The fields as pydantic shows them, with the secrets hidden."""
        for name, value in super().__repr_args__():
            yield name, value if name is None else shown_endpoint_field(name, value)

    @field_serializer(*URL_ENDPOINT_FIELDS, "extra_headers", when_used="json")
    def _hidden_in_json(self, value: Any, info: FieldSerializationInfo) -> Any:
        """JSON hides the secrets, as it hides the key (a ``SecretStr``); a Python dump keeps
        the values, as it keeps the key's ``SecretStr``."""
        return shown_endpoint_field(info.field_name, value)

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, url: str) -> str:
        """A URL the HTTP client can open; without this, a missing scheme would be tried
        (and retried) as a request, and then blamed on the server. A password in it is
        refused: the URL is in every message about the server (and in logs). So is what the
        requests' URLs would drop or change: whitespace and control characters (urllib drops a
        line break silently), a query or a fragment (the paths are added after them)."""
        check_url_text("base_url", url)
        shown = shown_url(url)
        if shown != url:  # it has user info
            raise ValueError(
                f"{shown!r} holds credentials, and the URL is shown in messages and "
                "logs: give the key as api_key (a Bearer token), or another scheme as a header "
                "in extra_headers (e.g. 'Authorization': 'Basic ...'), and leave them out of "
                "the URL"
            )
        if "://" not in url:
            raise ValueError(f"{url!r} has no scheme: write 'http://{url}'")
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https"):
            raise ValueError(
                f"{url!r} has the scheme {parts.scheme!r}: vLLM is served over http "
                "(https behind a proxy)"
            )
        if not parts.hostname:
            raise ValueError(f"{url!r} names no host: write e.g. 'http://127.0.0.1:8000/v1'")
        if "?" in url or "#" in url:
            raise ValueError(
                f"{url!r} has a query or a fragment, which its requests would drop (they go "
                "to base_url + '/completions', ...): leave it out (a key goes in api_key or "
                "extra_headers)"
            )
        return url

    @field_validator("extra_headers")
    @classmethod
    def _sendable_headers(cls, headers: dict[str, str]) -> dict[str, str]:
        check_headers("extra_headers", headers)
        return headers

    @field_validator("api_key")
    @classmethod
    def _sendable_key(cls, key: SecretStr | None) -> SecretStr | None:
        if key is not None:
            check_header_value("api_key", key.get_secret_value())
        return key

    @field_validator("verify", mode="before")
    @classmethod
    def _verify(cls, verify: Any) -> Any:
        """A boolean given as text (``RELAY_LARGE__VERIFY=false``) is one; CA certificates
        must load (:func:`load_ca`), here rather than at the first request."""
        if isinstance(verify, str):
            if verify.strip().lower() in ("true", "1", "yes", "false", "0", "no"):
                return verify.strip().lower() in ("true", "1", "yes")
            load_ca(ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT), verify)
        return verify

    @field_validator("cert")
    @classmethod
    def _certificate_files(cls, cert: str | tuple[str, str] | None) -> Any:
        """The client certificate and its key must load (:func:`load_client_certificate`),
        here rather than at the first request."""
        if cert is not None:
            load_client_certificate(ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT), cert)
        return cert

    @field_validator("proxy")
    @classmethod
    def _http_proxy(cls, proxy: str | None) -> str | None:
        if proxy is not None:
            check_proxy_url(proxy, "proxy")
        return proxy

    @model_validator(mode="after")
    def _one_owner_of_the_connections(self) -> EndpointConfig:
        """A session of one's own decides its TLS and proxies: settings for them here would
        be ignored."""
        if self.session_factory is not None:
            given = [
                name
                for name in ("verify", "cert", "proxy", "trust_env")
                if name in self.model_fields_set
            ]
            if given:
                raise ValueError(
                    f"{', '.join(given)} and session_factory: the session the factory makes "
                    "owns TLS and proxies; set them on it (its connector) and leave "
                    f"{', '.join(given)} out"
                )
        return self

    @field_validator("extra_body")
    @classmethod
    def _own_fields_only(cls, body: dict[str, Any]) -> dict[str, Any]:
        # logit_bias is this model's own token ids here, so it means what it says
        check_extra_body(body, "extra_body", MODEL_SAMPLING_FIELDS, allowed=("logit_bias",))
        return body

    @property
    def server_root(self) -> str:
        """The server URL without the `/v1` suffix (where vLLM serves /tokenize)."""
        root = self.base_url.rstrip("/")
        return root[: -len("/v1")] if root.endswith("/v1") else root


class _Passphrase(Exception):
    """A key asked for its passphrase (which the relay is not given)."""


def _no_passphrase() -> str:
    # without a callback, OpenSSL would prompt for it on the terminal, and wait
    raise _Passphrase


def load_ca(context: ssl.SSLContext, verify: str) -> None:
    """Trust the CA certificates at `verify`: a PEM bundle, or a directory of PEM files named
    by their subject hashes (``openssl rehash DIR``), read as certificates are checked. What
    cannot be used is a ``ValueError`` saying why::

        load_ca(ssl.create_default_context(), "/etc/relay/ca.pem")
    """
    if not verify.strip():
        raise ValueError(
            "verify: empty; give a CA bundle (a PEM file) or a directory, true or false"
        )
    if Path(verify).is_dir():
        context.load_verify_locations(capath=verify)
        return
    if not Path(verify).is_file():
        raise ValueError(f"verify: no CA bundle at {verify!r} (a PEM file, or a directory)")
    try:
        context.load_verify_locations(cafile=verify)
    except ssl.SSLError:
        raise ValueError(
            f"verify: {verify!r} holds no CA certificate in PEM (-----BEGIN CERTIFICATE-----)"
        ) from None
    except OSError as unreadable:
        raise ValueError(f"verify: cannot read {verify!r} ({unreadable.strerror})") from None


def load_client_certificate(context: ssl.SSLContext, cert: str | tuple[str, str]) -> None:
    """Load the client certificate `cert` (a PEM file with the certificate and its key, or
    the two files) into `context`. What cannot be used is a ``ValueError`` naming the file
    and what is wrong with it, never what it holds (a key)::

        load_client_certificate(context, ("client.pem", "client-key.pem"))
    """
    certificate, key = (cert, None) if isinstance(cert, str) else cert
    try:
        context.load_cert_chain(certificate, key, password=_no_passphrase)
    except _Passphrase:
        raise ValueError(
            f"cert: the key in {key or certificate!r} is encrypted, and the relay takes no "
            "passphrase: give it the key decrypted (openssl pkey -in KEY -out PLAIN_KEY)"
        ) from None
    except ssl.SSLError as refused:
        raise ValueError(f"cert: {_certificate_problem(certificate, key, refused)}") from None
    except OSError as unreadable:
        raise ValueError(
            f"cert: cannot read {unreadable.filename or certificate!r} ({unreadable.strerror})"
        ) from None


def _certificate_problem(certificate: str, key: str | None, refused: ssl.SSLError) -> str:
    """What OpenSSL's refusal of a certificate and key means, naming the file at fault."""
    if refused.reason == "KEY_VALUES_MISMATCH":
        return (
            f"the key in {key or certificate!r} is not the key of the certificate in "
            f"{certificate!r}"
        )
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cafile=certificate)
    except ssl.SSLError:
        return f"{certificate!r} holds no certificate in PEM (-----BEGIN CERTIFICATE-----)"
    if key is None:
        return (
            f"{certificate!r} holds a certificate but no private key in PEM that loads: give "
            "one file with both, or (certificate file, key file)"
        )
    return f"{key!r} holds no private key in PEM that loads (-----BEGIN PRIVATE KEY-----)"
