"""Run the relay server under uvicorn, with a graceful shutdown.

On SIGTERM or SIGINT the server stops accepting connections, answers ``/health`` with 503
(draining), and lets in-flight streams finish for ``shutdown_timeout`` seconds; streams still
running then are cut, which cancels their upstream requests::

    serve(RelayConfig.from_env(), ServerSettings.from_env(port=9000))

With ``ServerSettings(workers=N)`` (N > 1) the server runs on N processes sharing the port,
each shutting down so (:mod:`.workers`).
"""

from __future__ import annotations

from types import FrameType

import uvicorn

from ..relay.config import RelayConfig
from .app import RelayServer
from .logs import configure_logging
from .settings import ServerSettings


class DrainingServer(uvicorn.Server):
    """uvicorn's server, telling the relay when the shutdown starts."""

    def __init__(self, config: uvicorn.Config, relay: RelayServer) -> None:
        super().__init__(config)
        self.relay = relay

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.relay.draining = True
        super().handle_exit(sig, frame)


def uvicorn_config(relay: RelayServer) -> uvicorn.Config:
    settings = relay.settings
    return uvicorn.Config(
        relay.app(),
        host=settings.host,
        port=settings.port,
        timeout_graceful_shutdown=settings.shutdown_timeout,
        timeout_keep_alive=settings.keep_alive_timeout,
        log_config=None,  # ours: configure_logging
        access_log=False,  # the relay logs each request, with its id
        lifespan="on",
    )


def serve(config: RelayConfig, settings: ServerSettings) -> None:
    """Serve until SIGTERM/SIGINT; blocks. On ``settings.workers`` processes."""
    if settings.workers > 1:
        from .workers import serve_workers  # it builds on this module's server

        serve_workers(config, settings)
        return
    configure_logging(settings.log_format, settings.log_level)
    relay = RelayServer(config, settings)
    DrainingServer(uvicorn_config(relay), relay).run()
