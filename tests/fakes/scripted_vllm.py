"""An in-process server that speaks vLLM's OpenAI completions protocol, for fast unit tests
and fault injection. The real proof is against vLLM itself (tests/integration).

A :class:`ScriptedModel` continues every prompt with the rest of a scripted trace: the prompt
is the rendered chat (``ASSISTANT`` marks where the generation starts) plus whatever has been
generated so far, and the reply is the trace after that. Streaming, stop strings with
``include_stop_str_in_output``, ``min_tokens``, ``max_tokens``, ``stop_reason``, usage with
cached tokens, ``/tokenize``, ``/detokenize`` and ``/v1/models`` behave like vLLM's.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

ASSISTANT = "<|im_start|>assistant\n"
THINKING_OFF = "<think>\n\n</think>\n\n"
_TOKEN = re.compile(r" ?[A-Za-z]+| ?\d| ?[^\sA-Za-z\d]|\s")


def tokenize(text: str) -> list[str]:
    return _TOKEN.findall(text)


def render_chat(messages: list[dict[str, Any]], thinking: bool = True) -> str:
    text = "".join(
        f"<|im_start|>{m['role']}\n{m.get('content') or ''}<|im_end|>\n" for m in messages
    )
    return text + ASSISTANT + ("" if thinking else THINKING_OFF)


@dataclass
class Fault:
    """What the next request gets instead of a normal answer."""

    status: int | None = None  # answer with this HTTP status
    headers: dict[str, str] = field(default_factory=dict)
    stall: float = 0.0  # wait this long before the first chunk
    cut_after: int | None = None  # drop the connection after this many tokens


@dataclass
class ScriptedModel:
    name: str
    trace: str
    max_model_len: int = 4096
    token_delay: float = 0.0
    max_stop_strings: int | None = None  # vLLM's VLLM_MAX_STOP_STRINGS (4 by default there)
    respond: Callable[[str], str] | None = None
    faults: list[Fault] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    renders: int = 0
    active: int = 0
    _seen_prompts: list[list[str]] = field(default_factory=list)

    def continuation(self, prompt: str) -> str:
        if self.respond is not None:
            return self.respond(prompt)
        generated = prompt.split(ASSISTANT, 1)[1] if ASSISTANT in prompt else ""
        generated = generated.removeprefix(THINKING_OFF)
        assert self.trace.startswith(generated), (generated, self.trace)
        return self.trace[len(generated) :]

    def cached_tokens(self, prompt_tokens: list[str], block: int = 16) -> int:
        best = 0
        for seen in self._seen_prompts:
            n = 0
            for a, b in zip(seen, prompt_tokens, strict=False):
                if a != b:
                    break
                n += 1
            best = max(best, n // block * block)
        self._seen_prompts.append(prompt_tokens)
        return min(best, max(len(prompt_tokens) - 1, 0) // block * block)


class ScriptedVLLM:
    """Serves scripted models on a loopback port. Use as an async context manager."""

    def __init__(self, *models: ScriptedModel) -> None:
        self.models = {m.name: m for m in models}
        self.vocab: dict[str, int] = {}
        self.words: list[str] = []
        app = Starlette(
            routes=[
                Route("/v1/models", self._models),
                Route("/tokenize", self._tokenize, methods=["POST"]),
                Route("/detokenize", self._detokenize, methods=["POST"]),
                Route("/v1/completions", self._completions, methods=["POST"]),
            ]
        )
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        self._sock = sock
        self._server = uvicorn.Server(uvicorn.Config(app, log_level="critical", lifespan="off"))
        self._task: asyncio.Task[None] | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def __aenter__(self) -> ScriptedVLLM:
        self._task = asyncio.create_task(self._server.serve(sockets=[self._sock]))
        while not self._server.started:
            await asyncio.sleep(0.01)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._server.should_exit = True
        if self._task is not None:
            await self._task

    def _ids(self, tokens: list[str]) -> list[int]:
        for t in tokens:
            if t not in self.vocab:
                self.vocab[t] = len(self.words)
                self.words.append(t)
        return [self.vocab[t] for t in tokens]

    async def _models(self, request: Request) -> Response:
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
        text = render_chat(body["messages"], thinking) if "messages" in body else body["prompt"]
        ids = self._ids(tokenize(text))
        model = self.models[body["model"]]
        model.renders += 1
        return JSONResponse(
            {"count": len(ids), "max_model_len": model.max_model_len, "tokens": ids}
        )

    async def _detokenize(self, request: Request) -> Response:
        body = await request.json()
        return JSONResponse({"prompt": "".join(self.words[i] for i in body["tokens"])})

    async def _completions(self, request: Request) -> Response:
        body = await request.json()
        model = self.models.get(body.get("model"))
        if model is None:
            return JSONResponse({"error": {"message": "model not found"}}, status_code=404)
        model.requests.append(body)
        model.headers.append(dict(request.headers))
        stops = body.get("stop") or []
        if model.max_stop_strings is not None and len(stops) > model.max_stop_strings:
            message = (  # what vLLM 0.32 answers
                f"1 validation error:\n  {{'type': 'too_long', 'loc': 'body.stop', 'msg': 'List "
                f"should have at most {model.max_stop_strings} items after validation, not "
                f"{len(stops)}'}}"
            )
            return JSONResponse({"error": {"message": message, "type": "BadRequestError"}}, 400)
        fault = model.faults.pop(0) if model.faults else Fault()
        if fault.status is not None:
            return JSONResponse({"error": {"message": "injected"}}, fault.status, fault.headers)
        return StreamingResponse(self._stream(model, body, fault), media_type="text/event-stream")

    async def _stream(
        self, model: ScriptedModel, body: dict[str, Any], fault: Fault
    ) -> AsyncIterator[str]:
        model.active += 1
        try:
            if fault.stall:
                await asyncio.sleep(fault.stall)
            prompt_tokens = tokenize(body["prompt"])
            cached = model.cached_tokens(prompt_tokens)
            stops = body.get("stop") or []
            include = body.get("include_stop_str_in_output", False)
            text, n, finish, stop_reason = "", 0, "stop", None
            for token in tokenize(model.continuation(body["prompt"])):
                if n == body["max_tokens"]:
                    finish = "length"
                    break
                if fault.cut_after is not None and n == fault.cut_after:
                    raise ConnectionResetError("injected cut")
                n += 1
                before = len(text)
                text += token
                hit = None
                if n > body.get("min_tokens", 0):
                    for stop in stops:
                        at = text.find(stop, max(before - len(stop) + 1, 0))
                        if at != -1:
                            hit = (at, stop)
                            break
                if hit is not None:
                    at, stop_reason = hit
                    end = at + len(stop_reason) if include else at
                    yield _chunk(model.name, text[before:end] if end > before else "", None)
                    text = text[:end]
                    break
                if model.token_delay:
                    await asyncio.sleep(model.token_delay)
                yield _chunk(model.name, token, None)
            yield _chunk(model.name, "", finish, stop_reason)
            usage = {
                "prompt_tokens": len(prompt_tokens),
                "completion_tokens": n,
                "total_tokens": len(prompt_tokens) + n,
                "prompt_tokens_details": {"cached_tokens": cached},
            }
            yield (
                "data: "
                + json.dumps(
                    {
                        "id": "c",
                        "object": "text_completion",
                        "created": 0,
                        "model": model.name,
                        "choices": [],
                        "usage": usage,
                    }
                )
                + "\n\n"
            )
            yield "data: [DONE]\n\n"
        finally:
            model.active -= 1


def _chunk(model: str, text: str, finish: str | None, stop_reason: str | None = None) -> str:
    choice = {
        "index": 0,
        "text": text,
        "logprobs": None,
        "finish_reason": finish,
        "stop_reason": stop_reason,
    }
    return (
        "data: "
        + json.dumps(
            {
                "id": "c",
                "object": "text_completion",
                "created": 0,
                "model": model,
                "choices": [choice],
                "usage": None,
            }
        )
        + "\n\n"
    )
