"""uvicorn's server for the relay, telling it when the shutdown starts (one process or each
worker of several)::

    relay = RelayServer(config, settings)
    DrainingServer(uvicorn_config(relay), relay).run()
"""

from __future__ import annotations

from types import FrameType

import uvicorn

from .app import RelayServer
from .connection import ConnectionLimits, limited_protocol


class DrainingServer(uvicorn.Server):
    """uvicorn's server, telling the relay when the shutdown starts."""

    def __init__(self, config: uvicorn.Config, relay: RelayServer) -> None:
        super().__init__(config)
        self.relay = relay

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.relay.begin_draining()
        super().handle_exit(sig, frame)


def uvicorn_config(relay: RelayServer) -> uvicorn.Config:
    settings = relay.settings
    limits = ConnectionLimits(
        head_timeout=settings.head_timeout,
        send_timeout=settings.send_timeout,
        max_connections=settings.max_connections,
        max_connections_per_client=settings.max_connections_per_client,
        retry_after=settings.retry_after,
    )
    protocol = limited_protocol(limits, relay.connection_limited)
    return uvicorn.Config(
        relay.app(),
        host=settings.host,
        port=settings.port,
        http=protocol,
        timeout_graceful_shutdown=settings.shutdown_timeout,
        timeout_keep_alive=settings.keep_alive_timeout,
        log_config=None,  # ours: configure_logging
        access_log=False,  # the relay logs each request, with its id
        lifespan="on",
    )
