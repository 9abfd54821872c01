"""One generation, two ways: a streamed chat completion through the relay server (raw SSE,
parsed here as a client would) and the same generation with the in-process core."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import httpx

from relay_integrations.chat.exchange import (
    ChatRequest,
    ChatResponse,
    ContentDelta,
    ReasoningDelta,
    stream_chat,
)
from relay_integrations.relay import RelaySwitcher

from .figures import Sample

DATA = "data: "


def messages(i: int) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"What is {i % 90 + 10} * 7?"}]


@dataclass
class _Stream:
    """What the client has read of one SSE stream so far."""

    started: float
    first: float | None = None
    relay: dict[str, Any] | None = None
    finish: str | None = None
    done: bool = False
    content: int = 0
    failure: str | None = None
    connected: bool = False  # a new TCP connection, not one kept alive from an earlier request

    async def trace(self, event: str, info: dict[str, Any]) -> None:
        """httpx's trace extension: notes whether the request opened a connection."""
        self.connected = self.connected or event.startswith("connection.connect_tcp")

    def read(self, line: str) -> None:
        if not line.startswith(DATA):
            return
        data = line[len(DATA) :]
        if data == "[DONE]":
            self.done = True
            return
        chunk = json.loads(data)
        if "error" in chunk:
            self.failure = f"error event: {json.dumps(chunk['error'])[:200]}"
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if self.first is None and (delta.get("content") or delta.get("reasoning")):
                self.first = time.perf_counter() - self.started
            self.content += len(delta.get("content") or "")
            self.finish = choice.get("finish_reason") or self.finish
        self.relay = chunk.get("relay", self.relay)

    def broke(self, exc: Exception) -> None:
        on = "a new" if self.connected else "a kept-alive"
        self.failure = f"{type(exc).__name__} {str(exc)!r} on {on} connection"

    def incomplete(self) -> str | None:
        """What a stream that ended without an error lacks, if anything."""
        missing = [
            name
            for name, ok in (
                ("finish chunk", self.finish is not None),
                ("relay field", self.relay is not None),
                ("content", self.content > 0),
                ("[DONE]", self.done),
            )
            if not ok
        ]
        return f"incomplete stream: no {', no '.join(missing)}" if missing else None

    def sample(self) -> Sample:
        """The sample of the stream, now that it ended."""
        total = time.perf_counter() - self.started
        failure = self.failure if self.failure is not None else self.incomplete()
        sample = Sample(total, self.first, error=failure)
        if self.relay is not None:
            sample.relay_seconds = self.relay.get("seconds")
            sample.relay_ttft = self.relay.get("time_to_first_token")
            sample.switches = self.relay.get("switches")
            usage = self.relay.get("usage") or {}
            sample.tokens = sum(u.get("completion_tokens", 0) for u in usage.values())
        return sample


async def via_server(client: httpx.AsyncClient, url: str, i: int) -> Sample:
    """One streamed chat completion through the relay server (raw SSE)."""
    body = {"model": "large", "messages": messages(i), "stream": True}
    stream = _Stream(time.perf_counter())
    try:
        async with client.stream(
            "POST", f"{url}/v1/chat/completions", json=body, extensions={"trace": stream.trace}
        ) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")
                return Sample(
                    time.perf_counter() - stream.started,
                    error=f"HTTP {response.status_code}: {text[:200]}",
                )
            async for line in response.aiter_lines():
                stream.read(line)
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        stream.broke(exc)
    return stream.sample()


async def via_core(switcher: RelaySwitcher, i: int) -> Sample:
    """The same generation with the in-process core (``stream_chat``, as the server runs it)."""
    started = time.perf_counter()
    first: float | None = None
    response: ChatResponse | None = None
    try:
        request = ChatRequest(messages(i), sampling=switcher.config.sampling)
        async for event in stream_chat(switcher, request):
            if isinstance(event, ReasoningDelta | ContentDelta):
                if first is None and event.text:
                    first = time.perf_counter() - started
            elif isinstance(event, ChatResponse):
                response = event
    except Exception as exc:
        return Sample(time.perf_counter() - started, error=f"{type(exc).__name__}: {exc}")
    total = time.perf_counter() - started
    if response is None or not response.content:
        return Sample(total, first, error="no response or empty content")
    stats = response.result.stats
    return Sample(
        total,
        first,
        relay_seconds=stats.total_seconds,
        relay_ttft=stats.time_to_first_token,
        switches=stats.switches,
        tokens=response.result.completion_tokens,
    )
