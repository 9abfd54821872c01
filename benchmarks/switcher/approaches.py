"""2-4. One generation of each kind: the relay, the published loop, the large model alone."""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import openai
from openai.types import CompletionUsage
from openai.types.chat import ChatCompletionMessageParam

from relay_integrations.relay import (
    EndpointConfig,
    RelayConfig,
    RelaySwitcher,
    SamplingConfig,
    SwitchPolicy,
)
from relay_integrations.relay.config import Phase
from relay_integrations.relay.switcher import ROLES
from relay_integrations.upstream.config import ModelRole
from relay_integrations.upstream.endpoint import Endpoint

from .forcing import Forcer, TokenForcing
from .rates import open_stream
from .recording import WARM_UP, Generation, Recorder, RequestRecord
from .servers import Server, Tokenizer
from .settings import (
    AUTHORS_MIN_TOKENS,
    AUTHORS_SENTENCE_ENDS,
    BUDGET,
    CUES,
    SAMPLING,
    THINK_END,
)
from .traces import Trace
from .variants import DEFAULT_RELAY, THEIRS, LoopTransport, RelayVariant


class Relay:
    """One ``RelaySwitcher`` over the two servers, reused by every run (as in production);
    `variant` changes one thing (the stop-string limit, padding cues), see variants.py. Its
    endpoints record every request they send (:class:`Recorder`)."""

    def __init__(
        self, servers: Mapping[ModelRole, Server], variant: RelayVariant = DEFAULT_RELAY
    ) -> None:
        self.variant = variant
        limit = variant.max_stop_strings
        chunks = {"stream_interval": variant.stream_interval} if variant.stream_interval else {}
        config = RelayConfig(
            large=EndpointConfig(
                base_url=servers["large"].url,
                model=servers["large"].model,
                max_stop_strings=limit,
                extra_body=chunks,
            ),
            small=EndpointConfig(
                base_url=servers["small"].url,
                model=servers["small"].model,
                max_stop_strings=limit,
                extra_body=chunks,
            ),
            cues=[*CUES, *variant.padding_cues()],
            sampling=SamplingConfig(max_tokens=BUDGET, temperature=0.6, top_p=0.95, top_k=20),
            # cool-down 5 tokens, like the authors' min_tokens=5
            policy=SwitchPolicy(
                speculative_handoff=variant.speculative_handoff,
                warm_small_prompt=variant.warm_small_prompt,
            ),
        )
        self.recorder = Recorder()
        self.switcher = RelaySwitcher(
            config,
            endpoints={
                role: Endpoint(config.endpoint(role), role, observer=self.recorder)
                for role in ROLES
            },
        )

    async def generate(
        self, trace: Trace, mode: str, run: int, force: Forcer, tokens: TokenForcing
    ) -> Generation:
        self.recorder.log = []
        # with the warm-up, the small model's first request is its prompt's (without it, the
        # request hook names the phase of the first one)
        self.recorder.phase = {"large": "reasoning", "small": WARM_UP}

        def hook(role: ModelRole, phase: Phase, transcript: str) -> Mapping[str, Any]:
            self.recorder.phase[role] = phase
            return force(transcript)

        session = uuid.uuid4().hex
        messages = trace.messages(session)
        started = time.perf_counter()
        result = await self.switcher.generate(messages, request_hook=hook)
        wall = time.perf_counter() - started
        requests = [r for r in self.recorder.sent() if not r.discarded]
        return Generation(
            self.variant.name,
            mode,
            trace.name,
            run,
            wall,
            requests,
            result.text,
            trace.text,
            prepare=requests[0].sent - started,  # model info (cached) and prompt rendering
            switches=result.stats.switches,
            fallbacks=tokens.fallbacks,
            session=session,
            cuts=sum(r.cut for r in requests),
            speculative=(result.stats.speculative_handoffs, result.stats.speculative_misses),
        )

    async def aclose(self) -> None:
        await self.switcher.aclose()


@dataclass
class AuthorsLoop:
    """The published loop (utils.relaygen_chat_completions), re-implemented minimally.

    Synchronous like theirs; the same cues, forcing and sampling as the relay's runs.
    `transport` says how each request is sent: theirs (a whole chat completion continuing the
    assistant message) or the relay's (a streamed completion of `prompt`, the chat rendered
    by the server's template, followed by the text so far).
    """

    clients: Mapping[ModelRole, openai.OpenAI]
    messages: list[dict[str, Any]]
    force: Forcer
    transport: LoopTransport = THEIRS
    prompt: str = ""  # the rendered chat (the relay's prompt), for a /v1/completions transport
    requests: list[RequestRecord] = field(default_factory=list)
    generated: str = ""  # the text so far
    completion: int = 0  # tokens written so far
    switches: int = 0

    def fields(self, role: ModelRole, stop: list[str] | None) -> dict[str, Any]:
        """Their request's vLLM fields, apart from the chat template's."""
        body: dict[str, Any] = {
            "include_stop_str_in_output": True,
            "top_k": SAMPLING["top_k"],
            **self.force(self.generated),
        }
        if role == "large" and stop is not None:
            body["min_tokens"] = min(AUTHORS_MIN_TOKENS, BUDGET - self.completion)
        return body

    def request(self, role: ModelRole, stop: list[str] | None, first: bool) -> RequestRecord:
        """One request continuing the text so far, recorded."""
        client = self.clients[role]
        phase = "answer" if THINK_END in self.generated else "reasoning"
        record = RequestRecord(role, time.perf_counter(), phase=phase)
        model = client.models.list().data[0].id  # their get_model(): every request
        record.models_seconds = time.perf_counter() - record.sent
        if self.transport.chat:
            self._chat(client, model, record, stop, first)
        else:
            self._completion(client, model, record, stop)
        record.done = time.perf_counter()
        self.requests.append(record)
        return record

    def _chat(
        self,
        client: openai.OpenAI,
        model: str,
        record: RequestRecord,
        stop: list[str] | None,
        first: bool,
    ) -> None:
        """Theirs: a whole chat completion continuing the assistant message."""
        chat = [*self.messages, {"role": "assistant", "content": self.generated}]
        template = {
            "add_generation_prompt": first,
            "continue_final_message": not first,
            "chat_template_kwargs": {"enable_thinking": True},
        }
        record.chat = {"messages": chat, **template}
        response = client.chat.completions.create(
            model=model,
            messages=cast(list[ChatCompletionMessageParam], chat),
            temperature=SAMPLING["temperature"],
            top_p=SAMPLING["top_p"],
            max_tokens=BUDGET - self.completion,
            stop=stop,
            extra_body={**template, **self.fields(record.role, stop)},
        )
        choice = response.choices[0]
        record.text = choice.message.content or ""
        record.finish_reason = choice.finish_reason
        record.stop_reason = (choice.model_extra or {}).get("stop_reason")
        assert response.usage is not None
        count_usage(record, response.usage)

    def _completion(
        self, client: openai.OpenAI, model: str, record: RequestRecord, stop: list[str] | None
    ) -> None:
        """The relay's way: a streamed completion of the rendered prompt and the text so far."""
        record.prompt_text = self.prompt + self.generated
        stream = client.completions.create(
            model=model,
            prompt=record.prompt_text,
            temperature=SAMPLING["temperature"],
            top_p=SAMPLING["top_p"],
            max_tokens=BUDGET - self.completion,
            stop=stop,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={**self.fields(record.role, stop), "add_special_tokens": False},
        )
        for chunk in stream:
            if chunk.choices:
                choice = chunk.choices[0]
                record.first = record.first or time.perf_counter()
                record.text += choice.text or ""
                if choice.finish_reason is not None:
                    record.finish_reason = choice.finish_reason
                    record.stop_reason = (choice.model_extra or {}).get("stop_reason")
            if chunk.usage is not None:
                count_usage(record, chunk.usage)

    def reason(self) -> None:
        """The reasoning, segment by segment: the large model to a cue, the small one to a
        sentence end, until the end of reasoning or the budget."""
        large = True
        while self.completion < BUDGET:
            role: ModelRole = "large" if large else "small"
            stops = [THINK_END] + (list(CUES) if large else AUTHORS_SENTENCE_ENDS)
            record = self.request(role, stops, first=self.generated == "")
            if not record.text:
                break
            self.generated += record.text
            self.completion += record.completion_tokens
            if record.finish_reason == "stop":
                if large and any(record.text.endswith(cue) for cue in CUES):
                    large, self.switches = False, self.switches + 1
                elif not large and any(record.text.endswith(e) for e in AUTHORS_SENTENCE_ENDS):
                    large = True
            if THINK_END in record.text:
                break
        if THINK_END not in self.generated:
            self.generated += "\n" + THINK_END

    def answer(self) -> str:
        """The small model's answer after the reasoning ("" when the budget is spent)."""
        if self.completion < BUDGET:
            return self.request("small", None, first=False).text
        return ""


def count_usage(record: RequestRecord, usage: CompletionUsage) -> None:
    record.prompt_tokens, record.completion_tokens = usage.prompt_tokens, usage.completion_tokens
    details = usage.prompt_tokens_details
    record.cached_tokens = (details.cached_tokens or 0) if details else 0


def authors_generate(
    clients: Mapping[ModelRole, openai.OpenAI],
    trace: Trace,
    mode: str,
    run: int,
    force: Forcer,
    tokens: TokenForcing,
    transport: LoopTransport = THEIRS,
    session: str | None = None,
    prompt: str = "",
) -> Generation:
    """One generation of the published loop (:class:`AuthorsLoop`); `prompt` is the chat of
    `session` rendered, for a transport that sends ``/v1/completions``."""
    messages = trace.messages(session or uuid.uuid4().hex)
    loop = AuthorsLoop(clients, messages, force, transport, prompt)
    started = time.perf_counter()
    loop.reason()
    answer = loop.answer()
    wall = time.perf_counter() - started
    return Generation(
        transport.name,
        mode,
        trace.name,
        run,
        wall,
        loop.requests,
        loop.generated + answer,
        trace.text,
        switches=loop.switches,
        fallbacks=tokens.fallbacks,
    )


async def large_alone(
    client: openai.AsyncOpenAI,
    server: Server,
    prompt: str,
    trace: Trace,
    mode: str,
    run: int,
    force: Forcer,
) -> Generation:
    """The large model writing the whole trace in one streamed request (the paper's baseline)."""
    record = RequestRecord("large", time.perf_counter(), prompt_text=prompt, phase="all")
    stream = await open_stream(
        client, server, prompt, BUDGET, add_special_tokens=False, **force("")
    )
    async for chunk in stream:
        if chunk.choices:
            record.first = record.first or time.perf_counter()
            record.text += chunk.choices[0].text or ""
        if chunk.usage is not None:
            count_usage(record, chunk.usage)
    record.done = time.perf_counter()
    wall = record.done - record.sent
    return Generation("large_alone", mode, trace.name, run, wall, [record], record.text, trace.text)


async def authors_rendering(tok: Tokenizer, trace: Trace) -> dict[str, str]:
    """What the server renders for the published loop's requests (the assistant turn)."""
    messages = trace.messages("example")
    base = await tok.render(messages)  # ... + "<|im_start|>assistant\n" (the relay's prefix)
    cut = trace.text.index("Therefore,") + len("Therefore,")
    reasoning = trace.text[: trace.text.index(THINK_END) + len(THINK_END)]
    cases = {
        "first request (theirs: add_generation_prompt, empty assistant turn)": ("", True),
        "first request (continue_final_message, empty content)": ("", False),
        "mid-reasoning (partial <think>)": (trace.text[:cut], False),
        "answer request (reasoning closed)": (reasoning, False),
    }
    shown = {}
    for name, (content, first) in cases.items():
        ids = await tok.chat_ids(
            [*messages, {"role": "assistant", "content": content}],
            add_generation_prompt=first,
            continue_final_message=not first,
            chat_template_kwargs={"enable_thinking": True},
        )
        text = await tok.text(ids)
        common = len(base) - len("<|im_start|>assistant\n")
        tail = text[common:]
        relay = base[common:] + content
        if len(tail) > 110:
            tail = tail[:70] + " ... " + tail[-35:]
        shown[name] = repr(tail) + (
            "  (= the relay's)" if text == base + content else f"  (relay: {relay[:40]!r}...)"
        )
    return shown
