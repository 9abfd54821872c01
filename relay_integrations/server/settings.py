"""Settings of ``relaygen serve``: who may call, how much, and how the server runs.

The relay itself (endpoints, cues, policy, sampling) is a :class:`RelayConfig`; these are the
HTTP server's own settings. Each field also comes from ``RELAY_SERVER_<FIELD>``
(``RELAY_SERVER_PORT=9000``, ``RELAY_SERVER_API_KEYS=key1,key2``)::

    settings = ServerSettings.from_env(port=9000)
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr

ENV_PREFIX = "RELAY_SERVER_"


class ServerSettings(BaseModel):
    """The HTTP face of the relay."""

    model_config = ConfigDict(frozen=True, extra="forbid")

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
    workers: int = Field(
        default=1,
        ge=1,
        description="Processes serving the one listening port (relay_integrations.server."
        "workers); each has its own event loop and its own --max-concurrent-generations",
    )
    log_format: Literal["json", "text"] = "json"
    log_level: str = "info"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> ServerSettings:
        """``RELAY_SERVER_*`` variables, then keyword overrides (those that are not None)."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for name, field in cls.model_fields.items():
            raw = env.get(ENV_PREFIX + name.upper())
            if raw is None:
                continue
            is_list = "list" in str(field.annotation)
            values[name] = [v.strip() for v in raw.split(",") if v.strip()] if is_list else raw
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls.model_validate(values)
