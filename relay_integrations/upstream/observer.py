"""Watching the requests an endpoint sends: for tracing, metrics and benchmarks.

An observer given to an :class:`~relay_integrations.upstream.endpoint.Endpoint` sees each
streamed request open, each piece it returns and its close; the pieces the caller gets are
the endpoint's own, unchanged. Override what you need::

    class Timings(RequestObserver):
        async def opened(self, endpoint, request):
            self.sent[id(request)] = time.perf_counter()

        async def closed(self, endpoint, request, completed):
            print(endpoint.role, time.perf_counter() - self.sent.pop(id(request)), completed)

    endpoints = {role: Endpoint(config.endpoint(role), role, observer=Timings())
                 for role in MODEL_ROLES}
    relay = RelaySwitcher(config, endpoints=endpoints)

The three callbacks of one request get the same request object, so ``id(request)`` keys what
an observer records about it while it runs (the relay also numbers each request it sends in
its ``X-Request-Id`` header, which vLLM's logs show).
"""

from __future__ import annotations

from typing import Protocol

from .completion import CompletionRequest, StreamPiece
from .config import EndpointConfig, ModelRole


class ObservedEndpoint(Protocol):
    """What an observer sees of the endpoint (an :class:`~.endpoint.Endpoint`)."""

    role: ModelRole
    config: EndpointConfig
    stop_limit: int | None


class RequestObserver:
    """Callbacks around every streamed request of an endpoint; each does nothing by default.

    ``opened`` runs before the request is sent (retries included, it runs once), ``piece``
    for every piece before the caller gets it, ``closed`` when the stream ends: ``completed``
    is False when the caller closed it early (a hand-off opened ahead and not taken, a stop
    found in the stream, a cancelled generation) or it failed.
    """

    async def opened(self, endpoint: ObservedEndpoint, request: CompletionRequest) -> None:
        """The request is about to be sent."""

    def piece(
        self, endpoint: ObservedEndpoint, request: CompletionRequest, piece: StreamPiece
    ) -> None:
        """A piece of the stream, as the caller is about to get it."""

    async def closed(
        self, endpoint: ObservedEndpoint, request: CompletionRequest, completed: bool
    ) -> None:
        """The stream ended: read to its end (``completed``), or closed before it."""
