"""An in-process server that speaks vLLM's OpenAI completions protocol, for fast unit tests
and fault injection without a GPU or a model (the ``server`` extra: starlette, uvicorn). The
real proof is against vLLM itself; this is how the project's own unit tests and benchmarks
stand in for it::

    trace = "<think>\nLet me see. Therefore, it is 4.\n</think>\n\nIt is 4."
    async with ScriptedVLLM(ScriptedModel("large", trace), ScriptedModel("small", trace)) as vllm:
        config = RelayConfig(
            large=EndpointConfig(base_url=vllm.base_url, model="large"),
            small=EndpointConfig(base_url=vllm.base_url, model="small"),
            cues=["Therefore,"],
        )
        async with RelaySwitcher(config) as relay:
            result = await relay.generate([{"role": "user", "content": "2 + 2?"}])
        vllm.models["small"].requests   # what the small model was sent

A :class:`ScriptedModel` continues every prompt with the rest of a scripted trace: the prompt
is the rendered chat (``ASSISTANT`` marks where the generation starts) plus whatever has been
generated so far, and the reply is the trace after that. Streaming, stop strings as vLLM's
detokenizer applies them (:mod:`.vllm_stops`: the first to end wins, kept or left out as
``include_stop_str_in_output`` says, a stop's possible start held back), ``min_tokens``,
``max_tokens``, ``stop_reason``, usage with cached tokens (and in every chunk with
``stream_options.continuous_usage_stats``), vLLM's cap on stop strings
(``max_stop_strings``), ``/tokenize``, ``/detokenize`` and ``/v1/models`` behave like
vLLM's; a request without ``"stream": true`` gets the whole completion in one response. With
``api_key``, the ``/v1`` routes want it as a bearer token, as vLLM's ``--api-key`` does.
``/tokenize`` renders chat messages (and tools) like vLLM with the Qwen3 chat template
(:func:`.qwen3_template.render_chat`). :class:`Fault` injects failures.

Synchronous code (a sync test suite, a LangChain app's ``invoke`` tests) serves it from a
thread of its own with :func:`serving`::

    pair = ScriptedVLLM(ScriptedModel("large", trace), ScriptedModel("small", trace))
    with serving(pair) as vllm:
        llm = RelayChatModel(large_url=vllm.base_url, large_model="large", ...)
        llm.invoke("2 + 2?")

A model's ``respond`` callback, when given, replaces the trace: it gets the prompt and the
request body and returns the continuation (an answer that depends on the chat, the tools or
the request's structured outputs).
"""

from __future__ import annotations

try:
    import starlette  # noqa: F401
    import uvicorn
except ImportError as missing:
    raise ImportError(
        f"relay_integrations.testing.scripted_vllm needs the server extra ({missing.name} is "
        "missing): pip install 'relay-integrations[server]'",
        name=missing.name,
    ) from missing


import asyncio
import json
import socket
import threading
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from .gpu_speed import Engine, EngineRequest, LatencyModel
from .qwen3_template import ASSISTANT, THINKING_OFF, render_chat, tokenize
from .vllm_stops import StopText

CACHE_BLOCK = 16
"""Tokens in one block of the scripted prefix cache (vLLM's GPU block size)."""


@dataclass
class Fault:
    """What the next request gets instead of a normal answer."""

    status: int | None = None  # answer with this HTTP status
    headers: dict[str, str] = field(default_factory=dict)
    stall: float = 0.0  # wait this long before the first chunk
    cut_after: int | None = None  # drop the connection after this many tokens
    stall_after: int | None = None  # send nothing after this many tokens (until the client goes)


@dataclass
class ScriptedModel:
    """One served model and what it saw.

    ``trace``: the text it writes (continued from wherever the prompt's generation has got
    to); ``respond(prompt, body)`` replaces it (the continuation of `prompt`).
    ``token_delay``: seconds per token, its stop token included; ``latency`` instead: the
    model's measured step times (:class:`.gpu_speed.LatencyModel`), run with continuous
    batching over all its requests (:class:`.gpu_speed.Engine`), its uncached prompt tokens
    costing their append time. ``tokens_per_chunk``: tokens a streamed chunk carries (vLLM
    merges the tokens of the steps a slow client has not read yet into one chunk; with
    ``latency`` it does so too). ``max_stop_strings``: vLLM's
    ``VLLM_MAX_STOP_STRINGS`` (4 by default there; None: no cap). ``chat_template``: how
    ``/tokenize`` renders its chats (messages, thinking, tools; Qwen3's by default).
    ``reports_cached_tokens``: usage carries ``prompt_tokens_details`` (vLLM's
    ``--enable-prompt-tokens-details``); ``prefix_caching`` off: nothing is ever cached
    (``--no-enable-prefix-caching``). ``returns_token_ids`` off: ``return_token_ids`` is
    ignored, as a vLLM without that field ignores it. ``faults``: what the next
    requests get instead (:class:`Fault`). ``requests``, ``headers``: every request's body and
    headers, for tests to read; ``memory`` keeps only the last that many of them (None: all),
    so that a long benchmark run does not grow. Cached tokens are counted as vLLM's prefix
    cache would serve them, from every prompt and output seen (blocks of 16 tokens).
    """

    name: str
    trace: str
    max_model_len: int = 4096
    token_delay: float = 0.0
    tokens_per_chunk: int = 1
    max_stop_strings: int | None = None
    chat_template: Callable[[list[dict[str, Any]], bool, list[dict[str, Any]] | None], str] = (
        render_chat
    )
    reports_cached_tokens: bool = True
    prefix_caching: bool = True
    returns_token_ids: bool = True
    respond: Callable[[str, dict[str, Any]], str] | None = None
    memory: int | None = None
    faults: list[Fault] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    renders: int = 0  # chats tokenized (/tokenize with messages)
    texts_tokenized: list[str] = field(default_factory=list)  # /tokenize with a prompt
    active: int = 0
    peak_active: int = 0
    cut_short: int = 0  # streams the client closed before their end
    latency: LatencyModel | None = None
    _cached_blocks: set[int] = field(default_factory=set)

    def continuation(self, prompt: str, body: dict[str, Any]) -> str:
        """The rest of the output after `prompt` (rendered chat + generation so far)."""
        if self.respond is not None:
            return self.respond(prompt, body)
        generated = prompt.split(ASSISTANT, 1)[1] if ASSISTANT in prompt else ""
        generated = generated.removeprefix(THINKING_OFF)
        assert self.trace.startswith(generated), (generated, self.trace)
        return self.trace[len(generated) :]

    def cached_tokens(self, prompt_tokens: list[str]) -> int:
        """The prompt tokens vLLM's prefix cache would serve: the whole blocks of the longest
        prefix of a sequence seen before (a prompt and what was written after it), short of
        the last token, which is always computed. The prompt is remembered."""
        cached, key = 0, 0
        if not self.prefix_caching:
            return 0
        for start in range(0, (len(prompt_tokens) - 1) // CACHE_BLOCK * CACHE_BLOCK, CACHE_BLOCK):
            key = hash((key, *prompt_tokens[start : start + CACHE_BLOCK]))
            if key not in self._cached_blocks:
                break
            cached += CACHE_BLOCK
        self.remember(prompt_tokens)
        return cached

    def remember(self, tokens: list[str]) -> None:
        """Put the whole blocks of `tokens` in the prefix cache (as vLLM caches a request's
        prompt and output)."""
        key = 0
        for start in range(0, len(tokens) // CACHE_BLOCK * CACHE_BLOCK, CACHE_BLOCK):
            key = hash((key, *tokens[start : start + CACHE_BLOCK]))
            self._cached_blocks.add(key)

    def record(self, body: dict[str, Any], headers: dict[str, str]) -> None:
        """Remember a request (its body and headers), within ``memory``."""
        self.requests.append(body)
        self.headers.append(headers)
        self._forget()

    def forget(self) -> None:
        """Forget every request, header and cached block (what a long test keeps)."""
        self.requests.clear()
        self.headers.clear()
        self._cached_blocks.clear()

    def _forget(self) -> None:
        if self.memory is not None:
            for remembered in (self.requests, self.headers):
                del remembered[: max(len(remembered) - self.memory, 0)]


class ScriptedVLLM:
    """Serves scripted models on a loopback port (a free one, or `port`: a server started
    again where one was stopped). Use as an async context manager."""

    def __init__(self, *models: ScriptedModel, api_key: str | None = None, port: int = 0) -> None:
        self.models = {m.name: m for m in models}
        self.api_key = api_key
        self.routes: Counter[str] = Counter()
        """Requests answered, by path (``/tokenize``: 12, ...)."""
        handlers = {
            "/v1/models": (self._models, ["GET"]),
            "/tokenize": (self._tokenize, ["POST"]),
            "/detokenize": (self._detokenize, ["POST"]),
            "/v1/completions": (self._completions, ["POST"]),
        }
        app = Starlette(
            routes=[
                Route(path, self._counted(path, handler), methods=methods)
                for path, (handler, methods) in handlers.items()
            ]
        )
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)  # TCP_NODELAY
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # the port of one stopped
        sock.bind(("127.0.0.1", port))
        self.port = sock.getsockname()[1]
        self._sock = sock
        self._server = uvicorn.Server(uvicorn.Config(app, log_level="critical", lifespan="off"))
        self._task: asyncio.Task[None] | None = None
        self.engines: dict[str, Engine] = {}
        """The engines of the models with a latency model (their steps and lag, for reports)."""

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def __aenter__(self) -> ScriptedVLLM:
        self._task = asyncio.create_task(self._server.serve(sockets=[self._sock]))
        while not self._server.started:  # noqa: ASYNC110 (uvicorn's server has only a flag)
            await asyncio.sleep(0.01)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._server.should_exit = True
        if self._task is not None:
            await self._task
        for engine in self.engines.values():
            await engine.aclose()

    def _counted(
        self, path: str, handler: Callable[[Request], Awaitable[Response]]
    ) -> Callable[[Request], Awaitable[Response]]:
        async def counted(request: Request) -> Response:
            self.routes[path] += 1
            return await handler(request)

        return counted

    def _engine_request(self, model: ScriptedModel, uncached: int) -> EngineRequest | None:
        """The request's place in its model's engine (None without a latency model)."""
        if model.latency is None:
            return None
        engine = self.engines.get(model.name)
        if engine is None:
            engine = self.engines[model.name] = Engine(model.latency)
        return engine.admit(uncached)

    def _ids(self, tokens: list[str]) -> list[int]:
        return [token_id(t) for t in tokens]

    def _unauthorized(self, request: Request) -> Response | None:
        """vLLM's answer to a /v1 request without the server's --api-key (the root routes,
        /tokenize among them, are open there too)."""
        if self.api_key is None or request.headers.get("authorization") == f"Bearer {self.api_key}":
            return None
        return JSONResponse({"error": "Unauthorized"}, status_code=401)

    async def _models(self, request: Request) -> Response:
        if refused := self._unauthorized(request):
            return refused
        data = [
            {
                "id": m.name,
                "object": "model",
                "root": f"/models/{m.name}",
                "max_model_len": m.max_model_len,
            }
            for m in self.models.values()
        ]
        return JSONResponse({"object": "list", "data": data})

    async def _tokenize(self, request: Request) -> Response:
        body = await request.json()
        thinking = (body.get("chat_template_kwargs") or {}).get("enable_thinking", True)
        model = self.models[body["model"]]
        if "messages" in body:
            text = model.chat_template(body["messages"], thinking, body.get("tools"))
            model.renders += 1
        else:
            text = body["prompt"]
            model.texts_tokenized.append(text)
        ids = self._ids(tokenize(text))
        return JSONResponse(
            {"count": len(ids), "max_model_len": model.max_model_len, "tokens": ids}
        )

    async def _detokenize(self, request: Request) -> Response:
        body = await request.json()
        return JSONResponse({"prompt": decode(body["tokens"])})

    async def _completions(self, request: Request) -> Response:
        if refused := self._unauthorized(request):
            return refused
        body = await request.json()
        model = self.models.get(body.get("model"))
        if model is None:
            return JSONResponse({"error": {"message": "model not found"}}, status_code=404)
        if isinstance(body.get("prompt"), list):  # token ids: the text they stand for
            ids = body["prompt"]
            try:
                body["prompt"], body["prompt_ids"] = decode(ids), ids
            except (AttributeError, TypeError, ValueError, OverflowError):
                message = "token id out of vocabulary (what vLLM 0.32 answers, in short)"
                return JSONResponse({"error": {"message": message, "code": 400}}, 400)
        model.record(body, dict(request.headers))
        stops = body.get("stop") or []
        if model.max_stop_strings is not None and len(stops) > model.max_stop_strings:
            message = (  # what vLLM 0.32 answers
                f"1 validation error:\n  {{'type': 'too_long', 'loc': 'body.stop', 'msg': 'List "
                f"should have at most {model.max_stop_strings} items after validation, not "
                f"{len(stops)}'}}"
            )
            return JSONResponse({"error": {"message": message, "type": "BadRequestError"}}, 400)
        if problem := _unresolved_reference(body.get("structured_outputs")):
            # vLLM answers 400 when xgrammar cannot compile the grammar
            return JSONResponse({"error": {"message": problem, "type": "BadRequestError"}}, 400)
        fault = model.faults.pop(0) if model.faults else Fault()
        if fault.status is not None:
            return JSONResponse({"error": {"message": "injected"}}, fault.status, fault.headers)
        if body.get("stream"):
            stream = self._stream(model, body, fault)
            return StreamingResponse(stream, media_type="text/event-stream")
        return JSONResponse(await self._complete(model, body, fault))

    async def _generate(
        self, model: ScriptedModel, body: dict[str, Any], fault: Fault, outcome: _Outcome
    ) -> AsyncIterator[str]:
        """The text pieces of one completion, one a token as vLLM's detokenizer streams them
        (:class:`.vllm_stops.StopText`: stop strings applied, a possible stop's start held
        back while stops are left out of the text), and the held-back rest when it ends;
        `outcome` gets the finish reason and usage at the end."""
        if fault.stall:
            await asyncio.sleep(fault.stall)
        prompt_tokens = tokenize(body["prompt"])
        outcome.prompt_tokens = len(prompt_tokens)
        cached = model.cached_tokens(prompt_tokens)
        include = body.get("include_stop_str_in_output", False)
        text, n = StopText(body.get("stop") or [], include_in_output=include), 0
        written: list[str] = []
        steps = self._engine_request(model, len(prompt_tokens) - cached)
        continuation = tokenize(model.continuation(body["prompt"], body))
        try:
            for index, token in enumerate(continuation):
                if n == body.get("max_tokens"):
                    outcome.finish = "length"
                    break
                if fault.cut_after is not None and n == fault.cut_after:
                    raise ConnectionResetError("injected cut")
                if fault.stall_after is not None and n == fault.stall_after:
                    await asyncio.Event().wait()  # a server hung mid-stream
                n += 1
                outcome.generated = n
                outcome.stop_reason = text.update(token, check=n > body.get("min_tokens", 0))
                # the decoding step of this token, the one that writes a stop string too
                if steps is not None:
                    last = outcome.stop_reason is not None or n == body.get("max_tokens")
                    last = last or index == len(continuation) - 1
                    outcome.backlog = await steps.take_token(last)
                else:
                    # a decoding step gives the loop a turn even when it takes no time, as
                    # vLLM's do: a client that left (a stream closed at a stop string found
                    # in it) is then noticed and its request ended, not written to (asyncio
                    # warns "socket.send() raised exception." past a few such writes)
                    await asyncio.sleep(model.token_delay)
                written.append(token)
                outcome.unsent.append(token)
                yield text.delta(finished=outcome.stop_reason is not None)
                if outcome.stop_reason is not None:
                    break
            if rest := text.delta(finished=True):  # the end, at the last token or max_tokens
                yield rest
        finally:
            if steps is not None:
                Engine.close(steps)
        model.remember(prompt_tokens + written)
        outcome.usage = {
            "prompt_tokens": len(prompt_tokens),
            "completion_tokens": n,
            "total_tokens": len(prompt_tokens) + n,
            "prompt_tokens_details": {"cached_tokens": cached}
            if model.reports_cached_tokens
            else None,
        }

    async def _stream(
        self, model: ScriptedModel, body: dict[str, Any], fault: Fault
    ) -> AsyncIterator[str]:
        """A streamed completion: a chunk a token (or ``tokens_per_chunk``), the finish,
        usage, ``[DONE]``."""
        model.active += 1
        model.peak_active = max(model.peak_active, model.active)
        finished = False
        try:
            outcome = _Outcome()
            continuous = bool((body.get("stream_options") or {}).get("continuous_usage_stats"))

            with_ids = bool(body.get("return_token_ids")) and model.returns_token_ids

            def chunk(text: str) -> str:
                """A chunk of `text`, and the ids of the tokens written since the last one
                (vLLM's ``return_token_ids``: they may run ahead of text held back)."""
                usage = outcome.so_far() if continuous else None
                ids = self._ids(outcome.unsent) if with_ids else None
                outcome.unsent.clear()
                return _chunk(model.name, text, None, usage=usage, ids=ids)

            merged, tokens = "", 0
            async for piece in self._generate(model, body, fault, outcome):
                merged, tokens = merged + piece, tokens + 1
                if tokens % model.tokens_per_chunk == 0 and not outcome.backlog:
                    yield chunk(merged)
                    merged = ""
            if merged or outcome.unsent:
                yield chunk(merged)
            # a loop turn before each of the last events, as between tokens: a client that
            # closed the stream at its last text is seen gone, not written to four times more
            # (asyncio's "socket.send() raised exception.")
            await asyncio.sleep(0)
            ids: list[int] | None = [] if with_ids else None
            yield _chunk(model.name, "", outcome.finish, outcome.stop_reason, ids=ids)
            await asyncio.sleep(0)
            final = {**_completion(model.name, []), "usage": outcome.usage}
            yield "data: " + json.dumps(final) + "\n\n"
            await asyncio.sleep(0)
            finished = True
            yield "data: [DONE]\n\n"
        finally:
            model.active -= 1
            model.cut_short += not finished

    async def _complete(
        self, model: ScriptedModel, body: dict[str, Any], fault: Fault
    ) -> dict[str, Any]:
        """A non-streamed completion: the same text as the stream, in one response."""
        model.active += 1
        try:
            outcome = _Outcome()
            text = "".join([piece async for piece in self._generate(model, body, fault, outcome)])
            choice = _choice(text, outcome.finish, outcome.stop_reason)
            return {**_completion(model.name, [choice]), "usage": outcome.usage}
        finally:
            model.active -= 1


@contextmanager
def serving(server: ScriptedVLLM) -> Iterator[ScriptedVLLM]:
    """Serve `server` on an event loop in a thread of its own until the block ends, for sync
    code (and async code that should not share its loop with the server)::

        pair = ScriptedVLLM(ScriptedModel("large", trace), ScriptedModel("small", trace))
        with serving(pair) as vllm:
            RelayChatModel(large_url=vllm.base_url, large_model="large", ...).invoke("2 + 2?")
    """
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="scripted-vllm", daemon=True)
    thread.start()
    try:
        asyncio.run_coroutine_threadsafe(server.__aenter__(), loop).result(timeout=30)
        try:
            yield server
        finally:
            asyncio.run_coroutine_threadsafe(server.__aexit__(None, None, None), loop).result(30)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=30)
        loop.close()


def token_id(token: str) -> int:
    """A token's id in the scripted models' one tokenizer (as models of one family share
    theirs): its UTF-8 bytes as a number, so that a server started again, or one in another
    process, gives every token the same id."""
    return int.from_bytes(b"\x01" + token.encode(), "big")


def decode(ids: list[int]) -> str:
    """The text of ids of :func:`token_id` (ValueError for any other id)."""
    return "".join(_token(i) for i in ids)


def _token(index: int) -> str:
    raw = index.to_bytes((index.bit_length() + 7) // 8, "big")
    if not raw.startswith(b"\x01"):
        raise ValueError(f"{index} is no token's id")
    return raw[1:].decode()


@dataclass
class _Outcome:
    """How a completion ended."""

    finish: str = "stop"
    stop_reason: str | None = None
    usage: dict[str, Any] = field(default_factory=dict)
    prompt_tokens: int = 0
    generated: int = 0
    backlog: bool = False  # more tokens written than streamed: merge them into one chunk
    unsent: list[str] = field(default_factory=list)  # tokens written since the last chunk

    def so_far(self) -> dict[str, int]:
        """vLLM's ``continuous_usage_stats`` usage of a chunk: the tokens up to it."""
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.generated,
            "total_tokens": self.prompt_tokens + self.generated,
        }


def _unresolved_reference(structured: Any) -> str | None:
    """What xgrammar would say of a ``$ref`` in `structured` (vLLM ``structured_outputs``:
    a ``json`` schema, or the ``json_schema`` elements of a structural tag) that points at
    nothing from its schema's root; None if every one resolves."""
    if not isinstance(structured, dict):
        return None
    schemas = [structured["json"]] if isinstance(structured.get("json"), dict) else []
    if isinstance(structured.get("structural_tag"), str):
        schemas += _json_schema_elements(json.loads(structured["structural_tag"]))
    for schema in schemas:
        for pointer in _references(schema):
            target: Any = schema
            for part in pointer.removeprefix("#").split("/")[1:]:
                if not isinstance(target, dict) or part not in target:
                    return f"Cannot find field {part} in {pointer}"
                target = target[part]
    return None


def _json_schema_elements(tag: Any) -> list[dict[str, Any]]:
    """The schemas of a structural tag's ``json_schema`` elements, each its own root."""
    if isinstance(tag, list):
        return [s for item in tag for s in _json_schema_elements(item)]
    if not isinstance(tag, dict):
        return []
    own = [tag["json_schema"]] if tag.get("type") == "json_schema" else []
    return own + [s for value in tag.values() for s in _json_schema_elements(value)]


def _references(schema: Any) -> Iterator[str]:
    """Every local ``$ref`` in `schema`."""
    if isinstance(schema, dict):
        ref = schema.get("$ref")
        if isinstance(ref, str) and ref.startswith("#"):
            yield ref
        for value in schema.values():
            yield from _references(value)
    elif isinstance(schema, list):
        for item in schema:
            yield from _references(item)


def _completion(model: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "id": "c",
        "object": "text_completion",
        "created": 0,
        "model": model,
        "choices": choices,
    }


def _choice(text: str, finish: str | None, stop_reason: str | None) -> dict[str, Any]:
    return {
        "index": 0,
        "text": text,
        "logprobs": None,
        "finish_reason": finish,
        "stop_reason": stop_reason,
    }


def _chunk(
    model: str,
    text: str,
    finish: str | None,
    stop_reason: str | None = None,
    usage: dict[str, int] | None = None,
    ids: list[int] | None = None,
) -> str:
    choice = _choice(text, finish, stop_reason)
    if ids is not None:
        choice["token_ids"] = ids
    payload = {**_completion(model, [choice]), "usage": usage}
    return "data: " + json.dumps(payload) + "\n\n"
