"""Run the relay server under uvicorn, with a graceful shutdown.

On SIGTERM or SIGINT the server stops accepting connections, answers ``/health`` with 503
(draining), and lets in-flight streams finish for ``shutdown_timeout`` seconds; streams still
running then end with an error event and ``[DONE]``, and their upstream requests are
cancelled::

    serve(RelayConfig.from_env(), ServerSettings.from_env(port=9000))

With ``ServerSettings(workers=N)`` (N > 1) the server runs on N processes sharing the port,
each shutting down so (:mod:`.workers`).
"""

from __future__ import annotations

from ..relay.config import RelayConfig
from .app import RelayServer
from .draining import DrainingServer, uvicorn_config
from .logs import configure_logging
from .settings import ServerSettings
from .workers import serve_workers


def serve(config: RelayConfig, settings: ServerSettings) -> None:
    """Serve until SIGTERM/SIGINT; blocks. On ``settings.workers`` processes."""
    if settings.workers > 1:
        serve_workers(config, settings)
        return
    configure_logging(settings.log_format, settings.log_level)
    relay = RelayServer(config, settings)
    DrainingServer(uvicorn_config(relay), relay).run()
