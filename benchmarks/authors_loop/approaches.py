"""The approaches compared, one generation each: the relay, and the authors' research loop::

    relay = Relay(servers)                      # or Relay(servers, max_stop_strings=1)
    gen = await relay.generate(trace, force)    # a Generation: wall, text, requests, ...
    gen = authors_generate(clients, trace, force)  # synchronous, like the published code

Both write under the same cues, forcing and sampling (the paper's), with the same budget.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import openai
from openai.types.chat import ChatCompletionMessageParam

from relay_integrations.relay import (
    EndpointConfig,
    ModelRole,
    RelayConfig,
    RelaySwitcher,
    SamplingConfig,
    SwitchPolicy,
)
from relay_integrations.testing import hooked

from .forcing import Forcer
from .servers import Server
from .traces import Trace

CUES = ["Therefore,", "Now"]
THINK_END = "</think>"
AUTHORS_SENTENCE_ENDS = [".", "!", "?", "\n\n"]  # their SENT_END
AUTHORS_MIN_TOKENS = 5  # their "So-loop" guard on the large model
SAMPLING = {"temperature": 0.6, "top_p": 0.95, "top_k": 20}  # the paper's
BUDGET = 2560  # tokens of reasoning + answer (prompt ~880 + budget < max_model_len 4096)


@dataclass(frozen=True)
class Generation:
    """One generation of one approach: its wall time, and whether it wrote the trace."""

    approach: str  # relay | stream | authors
    wall: float
    text_ok: bool  # text == trace
    requests: int
    switches: int
    prefilled: int | None  # prompt tokens the caches did not serve (None: not reported)


class Relay:
    """One ``RelaySwitcher`` over the two servers, reused by every run (as in production).
    `max_stop_strings=1` sends only ``</think>`` as a stop string: the relay finds the cues and
    sentence ends in the stream and closes the request there (the mode of a stock server)."""

    def __init__(
        self, servers: Mapping[ModelRole, Server], max_stop_strings: int | None = None
    ) -> None:
        self.name = "relay" if max_stop_strings is None else "stream"

        def endpoint(role: ModelRole) -> EndpointConfig:
            server = servers[role]
            return EndpointConfig(
                base_url=server.url, model=server.model, max_stop_strings=max_stop_strings
            )

        self.switcher = RelaySwitcher(
            RelayConfig(
                large=endpoint("large"),
                small=endpoint("small"),
                cues=CUES,
                sampling=SamplingConfig(max_tokens=BUDGET, temperature=0.6, top_p=0.95, top_k=20),
                policy=SwitchPolicy(),  # cool-down 5 tokens, like the authors' min_tokens=5
            )
        )

    async def generate(self, trace: Trace, force: Forcer) -> Generation:
        def hook(role: ModelRole, phase: str, transcript: str) -> Mapping[str, Any]:
            return force(transcript)

        forced = hooked(self.switcher, hook)  # its connections; self.switcher closes them
        messages = trace.messages(uuid.uuid4().hex)
        started = time.perf_counter()
        result = await forced.generate(messages)
        wall = time.perf_counter() - started
        cached = result.cached_tokens
        return Generation(
            self.name,
            wall,
            result.text == trace.text,
            requests=sum(u.requests for u in result.usage.values()),
            switches=result.stats.switches,
            prefilled=None if cached is None else result.prompt_tokens - cached,
        )

    async def aclose(self) -> None:
        await self.switcher.aclose()


@dataclass
class Reply:
    """What one of the loop's requests returned."""

    text: str
    finish_reason: str
    completion_tokens: int
    prefilled: int


@dataclass
class AuthorsLoop:
    """The published loop (utils.relaygen_chat_completions), re-implemented minimally.

    Synchronous like theirs: one whole ``/v1/chat/completions`` a segment, continuing the
    assistant message (the text so far), the cues as substring stops, a ``GET /v1/models``
    before each request; the same cues, forcing and sampling as the relay's runs.
    """

    clients: Mapping[ModelRole, openai.OpenAI]
    messages: list[dict[str, Any]]
    force: Forcer
    replies: list[Reply] = field(default_factory=list)
    generated: str = ""  # the text so far
    completion: int = 0  # tokens written so far
    switches: int = 0

    def request(self, role: ModelRole, stop: list[str] | None, first: bool) -> Reply:
        """One chat completion continuing the text so far."""
        client = self.clients[role]
        model = client.models.list().data[0].id  # their get_model(): every request
        chat = [*self.messages, {"role": "assistant", "content": self.generated}]
        body: dict[str, Any] = {
            "add_generation_prompt": first,
            "continue_final_message": not first,
            "chat_template_kwargs": {"enable_thinking": True},
            "include_stop_str_in_output": True,
            "top_k": SAMPLING["top_k"],
            **self.force(self.generated),
        }
        if role == "large" and stop is not None:
            body["min_tokens"] = min(AUTHORS_MIN_TOKENS, BUDGET - self.completion)
        response = client.chat.completions.create(
            model=model,
            messages=cast(list[ChatCompletionMessageParam], chat),
            temperature=SAMPLING["temperature"],
            top_p=SAMPLING["top_p"],
            max_tokens=BUDGET - self.completion,
            stop=stop,
            extra_body=body,
        )
        choice, usage = response.choices[0], response.usage
        assert usage is not None
        details = usage.prompt_tokens_details
        cached = (details.cached_tokens or 0) if details else 0
        reply = Reply(
            choice.message.content or "",
            choice.finish_reason,
            usage.completion_tokens,
            usage.prompt_tokens - cached,
        )
        self.replies.append(reply)
        return reply

    def reason(self) -> None:
        """The reasoning, segment by segment: the large model to a cue, the small one to a
        sentence end, until the end of reasoning or the budget."""
        large = True
        while self.completion < BUDGET:
            role: ModelRole = "large" if large else "small"
            stops = [THINK_END] + (list(CUES) if large else AUTHORS_SENTENCE_ENDS)
            reply = self.request(role, stops, first=self.generated == "")
            if not reply.text:
                break
            self.generated += reply.text
            self.completion += reply.completion_tokens
            if reply.finish_reason == "stop":
                if large and any(reply.text.endswith(cue) for cue in CUES):
                    large, self.switches = False, self.switches + 1
                elif not large and any(reply.text.endswith(e) for e in AUTHORS_SENTENCE_ENDS):
                    large = True
            if THINK_END in reply.text:
                break
        if THINK_END not in self.generated:
            self.generated += "\n" + THINK_END

    def answer(self) -> str:
        """The small model's answer after the reasoning ("" when the budget is spent)."""
        if self.completion < BUDGET:
            return self.request("small", None, first=False).text
        return ""


def authors_generate(
    clients: Mapping[ModelRole, openai.OpenAI], trace: Trace, force: Forcer
) -> Generation:
    """One generation of the published loop (:class:`AuthorsLoop`), timed."""
    loop = AuthorsLoop(clients, trace.messages(uuid.uuid4().hex), force)
    started = time.perf_counter()
    loop.reason()
    answer = loop.answer()
    wall = time.perf_counter() - started
    return Generation(
        "authors",
        wall,
        loop.generated + answer == trace.text,
        requests=len(loop.replies),
        switches=loop.switches,
        prefilled=sum(r.prefilled for r in loop.replies),
    )
