"""The relay as an OpenAI-compatible HTTP server (Starlette), over one shared switcher.

Routes: ``POST /v1/chat/completions`` and ``POST /v1/responses`` (streamed or whole; the
routes of a stored response, ``GET /v1/responses/{id}`` and the like, answer 404 saying that
none is stored), ``GET /v1/models``, ``GET /health`` and ``GET /readyz`` (200 while the large
model's server answers: ``"degraded"`` without the small one), ``GET /livez`` (the process
answers), ``GET /metrics`` (Prometheus). Clients choose the model name and the request, never
the upstream servers. Run it with ``relaygen serve``, or build the app yourself (any ASGI
server)::

    server = RelayServer(RelayConfig.from_env(), ServerSettings.from_env())
    app = server.app()  # uvicorn.run(app), hypercorn, ...
"""

from __future__ import annotations

import asyncio
import hmac
import re
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..chat.exchange import ChatRequest
from ..relay.config import RelayConfig, RequestHook
from ..relay.cues import CueSet
from ..relay.switcher import RelaySwitcher
from ..upstream.config import MODEL_ROLES, EndpointConfig, ModelRole
from ..upstream.endpoint import ModelInfo
from ..upstream.errors import RelayError
from .admission import Admission
from .connection import Limit
from .errors import ApiError
from .generation import GenerationResponse, Wire
from .logs import log, request_id
from .metrics import RelayMetrics
from .protocol import ChatCompletionRequest, parse_body
from .responses import ChatCompletionsWire, ResponseShaper
from .responses_output import ResponsesWire
from .responses_request import ResponsesRequest
from .settings import ServerSettings
from .tracing import TracingMiddleware, start_export

REQUEST_ID_HEADER = "x-request-id"
CUT_AHEAD = 0.5
"""Seconds before the shutdown timeout at which streams still running are ended."""
ROUTES = (
    "/v1/chat/completions",
    "/v1/responses",
    "/v1/models",
    "/health",
    "/readyz",
    "/livez",
    "/metrics",
)
_UNSAFE_ID = re.compile(r"[^A-Za-z0-9._:-]")


class RelayServer:
    """State shared by all requests: the switcher, the limits, the metrics, the key check."""

    def __init__(
        self,
        config: RelayConfig,
        settings: ServerSettings | None = None,
        *,
        cues: CueSet | None = None,
        request_hook: RequestHook | None = None,
    ) -> None:
        self.settings = settings or ServerSettings()
        self.config = _sized(config, self.settings.max_concurrent_generations)
        self.cues = cues if cues is not None else CueSet.load(config.cues)  # fails fast
        self.request_hook = request_hook
        self.metrics = RelayMetrics(multiprocess=self.settings.workers > 1)
        self.admission = Admission(
            self.settings.max_concurrent_generations, self.settings.retry_after, self.metrics
        )
        self.model_names = self.settings.served_model_names or [
            config.large.model,
            f"{config.large.model}+{config.small.model}",
        ]
        self.draining = False
        self.cut = asyncio.Event()
        """Set just before the shutdown timeout: streams still running end with an error
        event and ``[DONE]`` (:meth:`begin_draining`)."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._checked: tuple[float, asyncio.Future[tuple[str, str]]] | None = None
        self._keys = [key.get_secret_value().encode() for key in self.settings.api_keys]
        self._switcher: RelaySwitcher | None = None

    @property
    def switcher(self) -> RelaySwitcher:
        if self._switcher is None:
            raise RuntimeError("the relay server is not started (run the app with its lifespan)")
        return self._switcher

    @property
    def inflight(self) -> int:
        """Generations running now."""
        return self.admission.inflight

    def app(self) -> Starlette:
        """The ASGI application."""
        app = Starlette(
            routes=[
                Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
                Route("/v1/responses", self.responses, methods=["POST"]),
                Route("/v1/responses/{id}", self.stored_response, methods=["GET", "DELETE"]),
                Route("/v1/responses/{id}/input_items", self.stored_response, methods=["GET"]),
                Route("/v1/responses/{id}/cancel", self.stored_response, methods=["POST"]),
                Route("/v1/models", self.models, methods=["GET"]),
                Route("/health", self.health, methods=["GET"]),
                Route("/readyz", self.health, methods=["GET"]),
                Route("/livez", self.live, methods=["GET"]),
                Route("/metrics", self.metrics_text, methods=["GET"]),
            ],
            exception_handlers={
                ApiError: _api_error_response,
                HTTPException: _http_error_response,
                Exception: _internal_error_response,
            },
            lifespan=self._lifespan,
        )
        app.add_middleware(RequestContext, server=self)
        app.add_middleware(
            TracingMiddleware, routes=frozenset(ROUTES)
        )  # outermost: the whole request
        return app

    def begin_draining(self) -> None:
        """The shutdown has begun (any thread, a signal handler's too): refuse new work,
        and end the streams still running :data:`CUT_AHEAD` seconds before uvicorn's
        ``shutdown_timeout`` would cut their connections, so that each ends with an error
        event and ``[DONE]`` rather than a broken body."""
        self.draining = True
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        when = max(self.settings.shutdown_timeout - CUT_AHEAD, 0.0)
        loop.call_soon_threadsafe(loop.call_later, when, self.cut.set)

    @asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        self._loop = asyncio.get_running_loop()
        stop_export = start_export(self.settings.otlp_endpoint)  # this worker process's
        self._switcher = RelaySwitcher(self.config, cues=self.cues, request_hook=self.request_hook)
        log.info(
            "relay server started",
            extra={
                "fields": {
                    "large": self.config.large.base_url,
                    "small": self.config.small.base_url,
                    "models": self.model_names,
                    "cues": len(self.cues.cues),
                }
            },
        )
        watch = asyncio.get_running_loop().create_task(self.metrics.watch_event_loop())
        try:
            yield
        finally:
            watch.cancel()
            await self._switcher.aclose()
            self._switcher = None
            if stop_export is not None:
                await asyncio.to_thread(stop_export)  # the last spans sent

    def connection_limited(self, limit: Limit) -> None:
        """A client connection closed by a limit (:mod:`.connection`): logged, counted."""
        self.metrics.connections_limited.labels(limit).inc()
        settings = self.settings
        reason = {
            "head": f"its request head did not arrive within {settings.head_timeout:g} s "
            "(answered 408)",
            "send": f"it accepted nothing for {settings.send_timeout:g} s (its generation, "
            "if any, is cancelled)",
            "connections": f"{settings.max_connections} connections are open "
            "(--max-connections; answered 503)",
            "connections_per_client": f"{settings.max_connections_per_client} connections "
            "from its address are open (--max-connections-per-client; answered 503)",
        }[limit]
        log.warning(f"client connection closed: {reason}")

    def authorize(self, authorization: str | None) -> None:
        """Check a Bearer key in constant time (each configured key is compared in full)."""
        if not self._keys:
            return
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise ApiError(
                401,
                "missing API key: send the header 'Authorization: Bearer <key>'",
                code="invalid_api_key",
            )
        presented = token.strip().encode()
        matched = False
        for key in self._keys:
            matched |= hmac.compare_digest(presented, key)
        if not matched:
            raise ApiError(401, "incorrect API key", code="invalid_api_key")

    # --- routes ----------------------------------------------------------------------------

    async def chat_completions(self, request: Request) -> Response | GenerationResponse:
        if self.draining:
            raise ApiError(503, "the relay is shutting down; retry on another replica")
        body = ChatCompletionRequest.of(parse_body(await self._body(request)), self.settings)
        self._check_model(body.model)
        generation_id = _generation_id(request.scope["state"]["request_id"], request)
        turn = body.chat_request(self.config.sampling, generation_id)
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        shaper = ResponseShaper(id=generation_id, model=body.model)
        wire = ChatCompletionsWire(shaper, include_usage)
        return self._generation(turn, wire, body.stream)

    async def responses(self, request: Request) -> Response | GenerationResponse:
        """``POST /v1/responses``: the same relay, in the Responses API's shapes."""
        if self.draining:
            raise ApiError(503, "the relay is shutting down; retry on another replica")
        body = ResponsesRequest.of(parse_body(await self._body(request)), self.settings)
        self._check_model(body.model)
        generation_id = _generation_id(request.scope["state"]["request_id"], request, "resp_")
        turn = body.chat_request(self.config.sampling, generation_id)
        assert turn.sampling is not None  # chat_request sets it
        wire = ResponsesWire(
            generation_id,
            body.model,
            body.echo(turn.sampling),
            parallel_tool_calls=turn.parallel_tool_calls,
            summary=body.wants_summary,
        )
        return self._generation(turn, wire, body.stream)

    async def stored_response(self, request: Request) -> Response:
        """``GET`` or ``DELETE /v1/responses/{id}``, its ``input_items``, its ``cancel``: the
        routes of a stored response, answered 404 with the reason (not "no route"), since
        this server stores none."""
        raise ApiError(
            404,
            f"no response {request.path_params['id']!r}: this server stores no responses "
            "(store=true is refused), so none can be retrieved, listed, cancelled or deleted; "
            "send the whole input each time, the earlier output items included",
            code="not_found",
        )

    def _generation(self, turn: ChatRequest, wire: Wire, stream: bool) -> GenerationResponse:
        return GenerationResponse(
            self.switcher,
            self.admission,
            turn,
            wire,
            stream=stream,
            cut=self.cut,
            keepalive=self.settings.sse_keepalive,
        )

    def _check_model(self, model: str) -> None:
        if model not in self.model_names:
            raise ApiError(
                404,
                f"the model {model!r} does not exist on this server; it serves {self.model_names}",
                param="model",
                code="model_not_found",
            )

    async def models(self, request: Request) -> Response:
        """The served names, with the large model's root and context window when it answers."""
        try:
            info: ModelInfo | None = await self.switcher.endpoints["large"].model_info()
        except RelayError:
            info = None  # the names do not depend on the upstream; /health reports it
        created = int(time.time())
        data = [
            {
                "id": name,
                "object": "model",
                "created": created,
                "owned_by": "relay_integrations",
                "root": (info.root or info.id) if info else None,
                "max_model_len": info.max_model_len if info else None,
            }
            for name in self.model_names
        ]
        return JSONResponse({"object": "list", "data": data})

    async def live(self, request: Request) -> Response:
        """Liveness: the process answers (whatever its upstreams do, and while it drains)."""
        return JSONResponse({"status": "ok"})

    async def health(self, request: Request) -> Response:
        """Readiness (``/health``, ``/readyz``): 200 when the upstream servers answer
        ``/v1/models``: ``"ok"`` with both, ``"degraded"`` with the large one alone (it
        writes everything; unless ``SwitchPolicy.on_small_failure`` is ``"raise"``); 503
        if not, and while draining. Each model's state is ``"ok"`` or ``"unavailable"``: why
        goes to the log (it may quote the upstream). The checks go on the relay's own
        connections, and one answers every probe for ``health_cache_seconds`` (probes that
        arrive together share it)."""
        if self.draining:
            return JSONResponse({"status": "draining"}, status_code=503)
        large, small = await self._upstream_states()
        degrades = self.switcher.config.policy.on_small_failure == "use_large"
        if large == small == "ok":
            status = "ok"
        elif large == "ok" and degrades:
            status = "degraded"
        else:
            status = "unavailable"
        return JSONResponse(
            {"status": status, "large": large, "small": small},
            status_code=503 if status == "unavailable" else 200,
        )

    async def metrics_text(self, request: Request) -> Response:
        body, content_type = self.metrics.render()
        return Response(body, media_type=content_type)

    # --- helpers ---------------------------------------------------------------------------

    async def _body(self, request: Request) -> bytes:
        """The request body, refused with 413 as soon as it passes the size limit."""
        limit = self.settings.max_body_bytes
        too_large = ApiError(413, f"the request body is larger than {limit} bytes")
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise too_large
        chunks, size = [], 0
        try:
            async with asyncio.timeout(self.settings.body_timeout):
                async for chunk in request.stream():
                    size += len(chunk)
                    if size > limit:
                        raise too_large
                    chunks.append(chunk)
        except TimeoutError:
            self.metrics.connections_limited.labels("head").inc()
            raise ApiError(
                408,
                f"the request body did not arrive within {self.settings.body_timeout:g} s",
                code="request_timeout",
                headers={"connection": "close"},
            ) from None
        return b"".join(chunks)

    async def _upstream_states(self) -> tuple[str, str]:
        """Both upstreams' states, checked at most once per ``health_cache_seconds``."""
        loop = asyncio.get_running_loop()
        checked = self._checked
        if checked is None or loop.time() - checked[0] >= self.settings.health_cache_seconds:
            states = asyncio.ensure_future(self._probe_both())
            self._checked = checked = (loop.time(), states)
        return await asyncio.shield(checked[1])

    async def _probe_both(self) -> tuple[str, str]:
        large, small = await asyncio.gather(self._probe("large"), self._probe("small"))
        return large, small

    async def _probe(self, role: ModelRole) -> str:
        """``"ok"`` or ``"unavailable"``: why not goes to the log, not to whoever probes (it
        can quote the upstream, or a proxy naming the hosts behind it)."""
        timeout = self.settings.health_timeout
        try:
            async with asyncio.timeout(timeout):
                said = await self.switcher.endpoints[role].probe()
        except TimeoutError:
            said = f"no answer within {timeout:g} s"
        if said == "ok":
            return said
        endpoint = self.config.endpoint(role).base_url
        log.warning(
            f"health check: the {role} model's server is unavailable: {said}",
            extra={"fields": {"upstream": endpoint}},
        )
        return "unavailable"


class RequestContext:
    """ASGI middleware: request id, API key check, one log line and one count per request."""

    def __init__(self, app: ASGIApp, server: RelayServer) -> None:
        self.app = app
        self.server = server

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        rid = headers.get(REQUEST_ID_HEADER) or uuid.uuid4().hex
        token = request_id.set(rid)
        scope.setdefault("state", {})["request_id"] = rid
        path = scope["path"] if scope["path"] in ROUTES else "other"
        started, status = time.perf_counter(), 500

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message.setdefault("headers", [])
                message["headers"] = [
                    *message["headers"],
                    (REQUEST_ID_HEADER.encode(), rid.encode("latin-1")),
                ]
            await send(message)

        try:
            if scope["path"].startswith("/v1/"):
                try:
                    self.server.authorize(headers.get("authorization"))
                except ApiError as refused:
                    await refused.response()(scope, receive, send_with_id)
                    return
            await self.app(scope, receive, send_with_id)
        finally:
            self.server.metrics.requests.labels(path, str(status)).inc()
            if path not in ("/metrics", "/health", "/readyz", "/livez"):  # probes: not logged
                log.info(
                    "request",
                    extra={
                        "fields": {
                            "method": scope["method"],
                            "path": scope["path"],
                            "status": status,
                            "seconds": round(time.perf_counter() - started, 4),
                        }
                    },
                )
            request_id.reset(token)


def _sized(config: RelayConfig, generations: int) -> RelayConfig:
    """Endpoints left at the default client-side limit get a slot per admitted generation.

    A generation has at most one request open per endpoint, so the server's own limit (429
    beyond it) is the one that counts; a limit set explicitly (``RELAY_LARGE__MAX_CONCURRENCY``)
    is kept.
    """
    sized: dict[str, EndpointConfig] = {}
    for role in MODEL_ROLES:
        endpoint: EndpointConfig = getattr(config, role)
        if "max_concurrency" not in endpoint.model_fields_set:
            limit = max(endpoint.max_concurrency, generations)
            sized[role] = endpoint.model_copy(update={"max_concurrency": limit})
    return config.model_copy(update=sized)


def _generation_id(rid: str, request: Request, prefix: str = "chatcmpl-") -> str:
    """The upstream id (`prefix`: the API's, ``chatcmpl-`` or ``resp_``): the request id we
    made, or the client's plus a unique suffix.

    The client's id goes upstream in headers, so it is cut to 64 header-safe characters
    (any other character becomes ``_``); the response header still echoes it as sent.
    """
    if REQUEST_ID_HEADER in request.headers:
        safe = _UNSAFE_ID.sub("_", rid[:64])
        return f"{prefix}{safe}-{uuid.uuid4().hex[:8]}"
    return f"{prefix}{rid}"


async def _api_error_response(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return exc.response()


async def _http_error_response(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        return ApiError(404, f"no route {request.url.path}", code="not_found").response()
    if exc.status_code == 405:
        message = f"{request.method} is not allowed on {request.url.path}"
        return ApiError(405, message, code="method_not_allowed").response()
    return ApiError(exc.status_code, str(exc.detail)).response()


async def _internal_error_response(request: Request, exc: Exception) -> Response:
    log.error("unhandled error", exc_info=exc)
    return ApiError(500, f"internal error: {type(exc).__name__}", code="internal_error").response()
