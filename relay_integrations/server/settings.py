"""Settings of ``relaygen serve``: who may call, how much, and how the server runs.

The relay itself (endpoints, cues, policy, sampling) is a :class:`RelayConfig`; these are the
HTTP server's own settings. Each field also comes from ``RELAY_SERVER_<FIELD>``
(``RELAY_SERVER_PORT=9000``, ``RELAY_SERVER_API_KEYS=key1,key2``)::

    settings = ServerSettings.from_env(port=9000)

A value that does not validate is a ``ValueError`` naming its variable
(``RELAY_SERVER_PORT (the field port): Input should be less than or equal to 65535``), never
the value; a ``RELAY_SERVER_*`` name that is no setting (``RELAY_SERVER_MAX_CONECTIONS``) is
ignored with a :class:`~relay_integrations.relay.config.RelayEnvironmentWarning` naming the
closest one.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from ..relay.config import EnvironmentVariables

ENV_PREFIX = "RELAY_SERVER_"


class ServerSettings(BaseModel):
    """The HTTP face of the relay."""

    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)
    """Errors name the field and the reason, never the value: an API key may be one."""

    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    served_model_names: list[str] = Field(
        default_factory=list,
        description="Names clients may send as 'model' (default: the large model's name and "
        "'LARGE+SMALL')",
    )
    api_keys: list[SecretStr] = Field(
        default_factory=list,
        description="Bearer keys clients must send to /v1/*; none: no key is asked for",
    )
    max_concurrent_generations: int = Field(
        default=256, ge=1, description="Generations in flight; one more is refused with 429"
    )
    retry_after: int = Field(default=1, ge=0, description="Retry-After seconds of a 429")
    max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    max_messages: int = Field(default=1024, ge=1)
    max_tokens_limit: int = Field(
        default=32768, ge=1, description="The largest max_tokens a request may ask for"
    )
    max_stop_strings: int = Field(
        default=4, ge=0, description="Stop strings a request may send (OpenAI's limit: 4)"
    )
    max_stop_length: int = Field(
        default=256, ge=1, description="Characters in each stop string a request sends"
    )
    shutdown_timeout: int = Field(
        default=30,
        ge=0,
        description="On SIGTERM: seconds in-flight streams may take to finish before they are "
        "cut (and their upstream requests cancelled)",
    )
    head_timeout: float = Field(
        default=30.0,
        gt=0,
        description="Seconds a client has to send a whole request head (from connecting, or "
        "from the first byte of its next request); then 408 and the connection is closed, as "
        "nginx's client_header_timeout",
    )
    body_timeout: float = Field(
        default=60.0,
        gt=0,
        description="Seconds a client has to send a request's whole body; then 408",
    )
    send_timeout: float = Field(
        default=60.0,
        gt=0,
        description="Seconds a client may acknowledge no byte while the server has bytes for "
        "it (measured on what its TCP stack takes, from the moment its request arrives, not "
        "once the socket buffers are full); then the connection is dropped and its generation "
        "cancelled, as nginx's send_timeout",
    )
    max_connections: int = Field(
        default=2048,
        ge=0,
        description="Client connections open at once (per worker process); one more is "
        "answered 503 with Retry-After and closed, as nginx's worker_connections; 0: no cap",
    )
    max_connections_per_client: int = Field(
        default=512,
        ge=0,
        description="Connections open at once from one client address (per worker process); "
        "one more is answered 503 with Retry-After and closed, as nginx's limit_conn; behind "
        "a load balancer every connection comes from its address: raise it, or 0 (no cap)",
    )
    sse_keepalive: float = Field(
        default=15.0,
        ge=0,
        description="Seconds a stream may stay silent (the relay waiting for an upstream) "
        "before it gets an SSE comment, which clients skip, so that proxies and load balancers "
        "that cut silent connections keep it open; 0: never",
    )
    keep_alive_timeout: int = Field(
        default=75,
        ge=1,
        description="Seconds an idle client connection stays open; longer than clients' own "
        "idle limits (httpx 5 s, load balancers 60 s), so that a client never reuses a "
        "connection the server is closing",
    )
    health_timeout: float = Field(
        default=5.0, gt=0, description="Seconds each upstream has to answer a health check"
    )
    health_cache_seconds: float = Field(
        default=1.0,
        ge=0,
        description="Seconds an upstream check answers every /health (/readyz) probe: probes "
        "from several sources (Kubernetes, load balancers) cost one check a second",
    )
    otlp_endpoint: str | None = Field(
        default=None,
        description="OTLP/HTTP collector to export traces to (its base URL: spans go to its "
        "/v1/traces), e.g. http://localhost:4318 for Jaeger or Tempo; the OTEL_EXPORTER_OTLP_* "
        "variables are read too. Each request's span continues the client's traceparent, the "
        "generation's spans beneath it (needs the otlp extra)",
    )
    workers: int = Field(
        default=1,
        ge=1,
        description="Processes serving the one listening port (relay_integrations.server."
        "workers); each has its own event loop and its own --max-concurrent-generations",
    )
    log_format: Literal["json", "text"] = "json"
    log_level: str = "info"

    @field_validator("otlp_endpoint")
    @classmethod
    def _collector_url(cls, value: str | None) -> str | None:
        """An http(s) URL with a host and no user or password (a collector's key goes in
        ``OTEL_EXPORTER_OTLP_HEADERS``); the error never shows the value."""
        if value is None:
            return None
        try:
            parts = urlsplit(value)
            scheme, host = parts.scheme, parts.hostname
            credentials = parts.username or parts.password
        except ValueError:  # e.g. an unclosed IPv6 bracket
            scheme, host, credentials = "", None, None
        if scheme not in ("http", "https") or not host:
            raise ValueError(
                "give the OTLP/HTTP collector's base URL, e.g. http://localhost:4318 "
                "(spans go to its /v1/traces)"
            )
        if credentials:
            raise ValueError(
                "the collector's URL holds a user or password, which logs would show: give "
                "its key in OTEL_EXPORTER_OTLP_HEADERS instead"
            )
        return value

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> ServerSettings:
        """``RELAY_SERVER_*`` variables, then keyword overrides (those that are not None)::

            ServerSettings.from_env({"RELAY_SERVER_PORT": "9000"}, host="0.0.0.0")

        A list (``RELAY_SERVER_API_KEYS``) is comma-separated. A variable that does not
        validate raises a ``ValueError`` naming each such variable and the reason (not the
        value: it may be a key), whatever the overrides; an unknown ``RELAY_SERVER_*`` name
        is warned about (:class:`~relay_integrations.relay.config.RelayEnvironmentWarning`)
        with the closest variable, and ignored.
        """
        env = os.environ if environ is None else environ
        variables = EnvironmentVariables(cls, ENV_PREFIX, "relaygen serve's settings")
        fields = {ENV_PREFIX + name.upper(): name for name in cls.model_fields}
        values: dict[str, Any] = {}
        sources: dict[tuple[str, ...], str] = {}
        for key in sorted(k for k in env if k.startswith(ENV_PREFIX)):
            name = fields.get(key)
            if name is None:
                variables.warn_ignored(key, stacklevel=2)
                continue
            raw = env[key]
            is_list = "list" in str(cls.model_fields[name].annotation)
            values[name] = [v.strip() for v in raw.split(",") if v.strip()] if is_list else raw
            sources[(name,)] = key
        problems = variables.invalid(values, sources)
        if problems:
            raise ValueError("invalid environment variables: " + "; ".join(problems))
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls.model_validate(values)
