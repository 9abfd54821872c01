"""The differential oracle on real vLLM: a relay whose two roles are one model and whose
reasoning is closed is the model's own chat endpoint, so ``RelayChatModel`` answers as
``ChatOpenAI``, ``RelayLLM`` as LlamaIndex's ``OpenAILike`` and ``relaygen serve`` as vLLM's
``/v1/chat/completions``, on the same server, over the generated matrix of
:mod:`tests.integration.oracle` (stop lists of 0-8 on a server that takes 1,024 and on a stock
one that takes 4, max_tokens from 1, message shapes, tools, response formats, seeds, streamed
and not). What differs on purpose is listed once, in :data:`~tests.integration.oracle.ON_PURPOSE`.

Then the same with the reasoning on, forced to a text in which the cues fire (the models
switch at each), both roles on one model: the answer the model writes after that reasoning is
the one its own endpoint writes after the same reasoning, given as the start of its turn
(``continue_final_message``).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from functools import cache
from typing import Any

import httpx
import openai
import pytest
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, convert_to_messages
from langchain_openai import ChatOpenAI
from llama_index.core.base.llms.types import ChatMessage, TextBlock, ThinkingBlock
from llama_index.core.tools import FunctionTool
from llama_index.llms.openai_like import OpenAILike

from relay_integrations.langchain import RelayChatModel
from relay_integrations.llama_index import RelayLLM
from relay_integrations.relay.config import Phase
from relay_integrations.server import RelayServer, ServerSettings
from relay_integrations.testing import forcing
from relay_integrations.testing.forcing import regex_literal
from relay_integrations.upstream.config import ModelRole
from tests.fakes.relay_http import ServedRelay, relay_http

from .conftest import Server, qwen_relay_fields
from .oracle import (
    MAX_STOPS,
    NO_THINKING,
    SHAPES,
    WEATHER_TOOL,
    WORDS,
    Case,
    CityAnswer,
    matrix,
    stop_list,
)

pytestmark = pytest.mark.vllm

MATRIX = list(matrix())
LLAMA_MATRIX = [c for c in MATRIX if c.format in ("none", "words")]
"""LlamaIndex asks for JSON through structured_predict (tested elsewhere), not a format."""


@pytest.fixture(scope="module", autouse=True)
def matrix_size(request: pytest.FixtureRequest) -> None:
    """The matrix's size, printed once in the run's output (whatever pytest captures)."""
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(
            f"oracle matrix: {len(MATRIX)} cases for RelayChatModel and relaygen serve, "
            f"{len(LLAMA_MATRIX)} for RelayLLM (streamed and whole, stops 0-{MAX_STOPS}, "
            f"tuned and stock servers)"
        )


@dataclass(frozen=True)
class Target:
    """A server and the names the relay's two roles use on it (one model under both)."""

    url: str
    large: str
    small: str


@dataclass(frozen=True)
class Targets:
    """The relay's server for each kind of case, and where its reference answer comes from."""

    tuned: Target
    stock: Target
    stock_uncapped: Target  # the stock server's model on a server that takes 1,024 stops

    def relay(self, case: Case) -> Target:
        return self.tuned if case.server == "tuned" else self.stock

    def reference(self, case: Case) -> Target:
        """The relay's own server, but for more stops than a stock server takes: ChatOpenAI
        gets a 400 there, so the same model on a server that takes them answers instead."""
        if case.server == "stock" and case.stops > STOCK_STOPS:
            return self.stock_uncapped
        return self.relay(case)


STOCK_STOPS = 4
"""The stop strings a stock vLLM takes in a request."""


@pytest.fixture(scope="module")
def targets(qwen_large: Server, qwen_small: Server, stock: Server) -> Targets:
    return Targets(
        tuned=Target(qwen_large.url, qwen_large.large_model, qwen_large.large_model),
        stock=Target(stock.url, stock.large_model, stock.small_model),
        stock_uncapped=Target(qwen_small.url, qwen_small.small_model, qwen_small.small_model),
    )


@dataclass(frozen=True)
class Answer:
    """What a surface answered, in the terms every surface has."""

    text: str
    finish_reason: str | None
    usage: tuple[int, int, int] | None  # prompt, completion, total
    tool_calls: tuple[tuple[str, str], ...]  # name, arguments as JSON
    parsed: Any = None
    error: str | None = None  # what the call raised, as ERRORS names it


ERRORS = {
    "LengthFinishReasonError": "cut JSON",  # ChatOpenAI, a JSON schema answer cut by length
    "OutputParserException": "cut JSON",  # the relay, the same (ON_PURPOSE["cut JSON"])
}


def _raised(error: Exception) -> Answer:
    name = type(error).__name__
    if name not in ERRORS:
        raise error
    return Answer("", None, None, (), error=ERRORS[name])


# -- LangChain: RelayChatModel against ChatOpenAI ------------------------------------------


def _langchain_messages(case: Case) -> list[BaseMessage]:
    return convert_to_messages(SHAPES[case.shape])


def _bound(model: Any, case: Case) -> Any:
    if case.tools != "none":
        model = model.bind_tools([WEATHER_TOOL], tool_choice=case.tool_choice())
    if (answer_format := case.response_format()) is not None:
        model = model.bind(response_format=answer_format)
    if case.format == "model":
        model = model.with_structured_output(CityAnswer, method="json_schema", include_raw=True)
    return model


def _langchain_answer(model: Any, case: Case, stops: list[str]) -> Answer:
    messages = _langchain_messages(case)
    bound = _bound(model, case)
    kwargs = {"stop": stops} if stops else {}
    parsed = None
    try:
        if case.stream:
            message: AIMessage | AIMessageChunk = _whole(bound.stream(messages, **kwargs))
        elif case.format == "model":
            structured = bound.invoke(messages, **kwargs)
            message, parsed = structured["raw"], structured["parsed"]
            if structured["parsing_error"] is not None:
                return _raised(structured["parsing_error"])
        else:
            message = bound.invoke(messages, **kwargs)
    except Exception as error:
        return _raised(error)
    usage = message.usage_metadata
    return Answer(
        text=message.text,
        finish_reason=message.response_metadata.get("finish_reason"),
        usage=None
        if usage is None
        else (usage["input_tokens"], usage["output_tokens"], usage["total_tokens"]),
        tool_calls=tuple(
            (call["name"], json.dumps(call["args"], sort_keys=True)) for call in message.tool_calls
        ),
        parsed=parsed if case.format == "model" else message.additional_kwargs.get("parsed"),
    )


def _whole(chunks: Iterable[AIMessageChunk]) -> AIMessageChunk:
    """A streamed message, its chunks added up as LangChain adds them."""
    message, *rest = chunks
    for chunk in rest:
        message = message + chunk
    return message


def chat_openai(target: Target, case: Case) -> ChatOpenAI:
    return ChatOpenAI(
        base_url=target.url,
        model=target.small,
        api_key=lambda: "unused",
        temperature=case.temperature,
        seed=case.seed,
        max_tokens=case.max_tokens,
        extra_body=case.extra_body(),
        stream_usage=True,
        max_retries=0,
    )


def relay_fields(target: Target, case: Case) -> dict[str, Any]:
    """The fields of either adapter for `case`: both roles on one model, the server's
    sampling defaults, the words grammar as the answer's request hook."""
    return {
        "large_url": target.url,
        "large_model": target.large,
        "small_url": target.url,
        "small_model": target.small,
        "cues": ["Therefore,", "Now"],
        "temperature": case.temperature,
        "top_p": 1.0,  # the server's defaults, which ChatOpenAI leaves in place (ON_PURPOSE)
        "top_k": None,
        "seed": case.seed,
        "max_tokens": case.max_tokens,
        "chat_template_kwargs": NO_THINKING,
        "request_hook": _words_hook if case.format == "words" else None,
        "max_retries": 0,
    }


def relay_chat_model(target: Target, case: Case) -> RelayChatModel:
    return RelayChatModel(**relay_fields(target, case))


def _words_hook(role: ModelRole, phase: Phase, transcript: str) -> dict[str, Any]:
    """The words grammar on the answer's request (the relay refuses structured_outputs in
    extra_body: a user constrains an answer with response_format)."""
    return {"structured_outputs": {"regex": WORDS}} if phase == "answer" else {}


@cache
def _unstopped_text(target: Target, case: Case) -> str:
    return _langchain_answer(chat_openai(target, case), case, []).text


def _compared(expected: Answer, got: Answer, case: Case) -> None:
    """`got` is `expected`; but for a forced tool call (ON_PURPOSE["forced tool call"]),
    which the relay must answer with one valid call to the tool whatever vLLM's endpoint
    made of it (a random model constrained by its grammar may write whitespace until the
    token limit there), or, where a stop string cut vLLM's call short, with none."""
    if case.forced_call:
        assert got.error is None and got.text == ""
        if not expected.tool_calls and expected.finish_reason == "stop":  # a stop cut it
            assert got.tool_calls == () and got.finish_reason == "stop"
            return
        [(name, arguments)] = got.tool_calls
        assert name == "get_weather" and isinstance(json.loads(arguments)["city"], str)
        assert got.finish_reason == "tool_calls"
        return
    if case.server == "stock" and case.stops > STOCK_STOPS and got.usage and expected.usage:
        (prompt, completion, _), (want_prompt, want_completion, _) = got.usage, expected.usage
        assert prompt == want_prompt and completion >= want_completion  # LIMITS
        got = replace(got, usage=expected.usage)
    assert got == expected


@pytest.mark.parametrize("case", MATRIX, ids=lambda case: case.id)
def test_relay_chat_model_answers_as_chat_openai(targets: Targets, case: Case) -> None:
    reference = targets.reference(case)
    stops = stop_list(case, _unstopped_text(reference, case.unstopped()))
    expected = _langchain_answer(chat_openai(reference, case), case, stops)
    with relay_chat_model(targets.relay(case), case) as relay:
        got = _langchain_answer(relay, case, stops)
    _compared(expected, got, case)


# -- relaygen serve against vLLM's /v1/chat/completions ------------------------------------


def _openai_answer(
    client: openai.OpenAI, model: str, case: Case, stops: list[str], *, relay: bool
) -> Answer:
    """An OpenAI chat completion's answer; the words grammar goes in the body to vLLM, and is
    the relay server's request hook (`relay`)."""
    fields: dict[str, Any] = {
        "model": model,
        "messages": SHAPES[case.shape],
        "max_tokens": case.max_tokens,
        "temperature": case.temperature,
        "extra_body": {"chat_template_kwargs": NO_THINKING} if relay else case.extra_body(),
    }
    fields |= {"seed": case.seed} if case.seed is not None else {}
    fields |= {"stop": stops} if stops else {}
    if case.tools != "none":
        fields |= {"tools": [WEATHER_TOOL], "tool_choice": case.tool_choice()}
    if (answer_format := case.response_format()) is not None:
        fields["response_format"] = answer_format
    if case.format == "model":
        try:
            parsed = client.chat.completions.parse(**fields, response_format=CityAnswer)
        except openai.LengthFinishReasonError as error:
            return _raised(error)
        choice, usage = parsed.choices[0], parsed.usage
        return Answer(
            text=choice.message.content or "",
            finish_reason=choice.finish_reason,
            usage=_totals(usage),
            tool_calls=(),
            parsed=choice.message.parsed,
        )
    if not case.stream:
        completion = client.chat.completions.create(**fields)
        choice, usage = completion.choices[0], completion.usage
        calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
        return Answer(
            text=choice.message.content or "",
            finish_reason=choice.finish_reason,
            usage=_totals(usage),
            tool_calls=tuple((name, _normal_json(arguments)) for name, arguments in calls),
        )
    text, finish, totals = "", None, None
    calls_so_far: dict[int, list[str]] = {}
    for chunk in client.chat.completions.create(
        **fields, stream=True, stream_options={"include_usage": True}
    ):
        if chunk.usage is not None:
            totals = _totals(chunk.usage)
        for choice in chunk.choices:
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
            for call in choice.delta.tool_calls or []:
                name, arguments = calls_so_far.setdefault(call.index, ["", ""])
                function = call.function
                calls_so_far[call.index] = [
                    name + ((function and function.name) or ""),
                    arguments + ((function and function.arguments) or ""),
                ]
    return Answer(
        text=text,
        finish_reason=finish,
        usage=totals,
        tool_calls=tuple((n, _normal_json(a)) for n, a in calls_so_far.values()),
    )


def _totals(usage: Any) -> tuple[int, int, int] | None:
    """An OpenAI usage object's prompt, completion and total tokens (None: no usage)."""
    if usage is None:
        return None
    return (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens)


def _normal_json(arguments: str) -> str:
    try:
        return json.dumps(json.loads(arguments), sort_keys=True)
    except ValueError:
        return arguments


@pytest.fixture(scope="module")
def served(targets: Targets) -> Iterator[dict[tuple[str, bool], ServedRelay]]:
    """``relaygen serve`` over each server, with and without the words grammar."""
    with contextlib.ExitStack() as stack:
        relays = {}
        for server in ("tuned", "stock"):
            for words in (False, True):
                case = Case(server=server, shape="user", stops=0, max_tokens=1)
                config = relay_chat_model(targets.relay(case), case).relay_config()
                hook = _words_hook if words else None
                settings = ServerSettings(max_stop_strings=MAX_STOPS)  # over a stock vLLM too
                relays[server, words] = stack.enter_context(
                    relay_http(RelayServer(config, settings, request_hook=hook))
                )
        yield relays


@pytest.mark.parametrize("case", MATRIX, ids=lambda case: case.id)
def test_relaygen_serve_answers_as_vllm_chat_completions(
    targets: Targets, served: dict[tuple[str, bool], ServedRelay], case: Case
) -> None:
    reference = targets.reference(case)
    stops = stop_list(case, _unstopped_text(reference, case.unstopped()))
    with openai.OpenAI(base_url=reference.url, api_key="unused", max_retries=0) as vllm:
        expected = _openai_answer(vllm, reference.small, case, stops, relay=False)
    relay = served[case.server, case.format == "words"]
    with openai.OpenAI(base_url=relay.base_url, api_key="unused", max_retries=0) as client:
        got = _openai_answer(client, targets.relay(case).large, case, stops, relay=True)
    _compared(expected, got, case)


# -- LlamaIndex: RelayLLM against OpenAILike -----------------------------------------------


def _llama_messages(chat: list[dict[str, Any]]) -> list[ChatMessage]:
    messages = []
    for message in chat:
        extra = {k: message[k] for k in ("name", "tool_calls", "tool_call_id") if k in message}
        content = message["content"]
        blocks = (
            [TextBlock(text=block["text"]) for block in content]
            if isinstance(content, list)
            else [TextBlock(text=content)]
        )
        messages.append(ChatMessage(role=message["role"], blocks=blocks, additional_kwargs=extra))
    return messages


def _llama_answer(llm: Any, case: Case, stops: list[str]) -> Answer:
    messages = _llama_messages(SHAPES[case.shape])
    kwargs: dict[str, Any] = {"stop": stops} if stops else {}
    tools = [FunctionTool.from_defaults(fn=get_weather)] if case.tools != "none" else []
    # LlamaIndex's words for the tool choice: a tool's name, tool_required, "none"
    choice: dict[str, dict[str, Any]] = {
        "named": {"tool_choice": "get_weather"},
        "required": {"tool_required": True},
        "off": {"tool_choice": "none"},
    }
    chosen = choice.get(case.tools, {})
    if case.stream:
        stream = (
            llm.stream_chat_with_tools(tools, chat_history=messages, **chosen, **kwargs)
            if tools
            else llm.stream_chat(messages, **kwargs)
        )
        *_, response = list(stream)
    elif tools:
        response = llm.chat_with_tools(tools, chat_history=messages, **chosen, **kwargs)
    else:
        response = llm.chat(messages, **kwargs)
    calls = llm.get_tool_calls_from_response(response, error_on_no_tool_call=False)
    counts = response.additional_kwargs
    return Answer(
        text=response.message.content or "",
        finish_reason=_llama_finish_reason(response),
        usage=(counts["prompt_tokens"], counts["completion_tokens"], counts["total_tokens"])
        if "total_tokens" in counts
        else None,
        tool_calls=tuple(
            (call.tool_name, json.dumps(call.tool_kwargs, sort_keys=True)) for call in calls
        ),
    )


def _llama_finish_reason(response: Any) -> str | None:
    """OpenAILike's raw is the ChatCompletion (or its last chunk); the relay's is a dict, and
    it puts the finish reason beside the token counts (ON_PURPOSE["llama_index raw"])."""
    if "finish_reason" in response.additional_kwargs:
        return str(response.additional_kwargs["finish_reason"])
    choices = getattr(response.raw, "choices", None) or []
    return str(choices[0].finish_reason) if choices else None


def get_weather(city: str) -> str:
    """The weather in a city."""
    return "sunny"


def openai_like(target: Target, case: Case) -> OpenAILike:
    return OpenAILike(
        model=target.small,
        api_base=target.url,
        api_key="unused",
        is_chat_model=True,
        is_function_calling_model=True,
        context_window=4096,
        temperature=case.temperature,
        max_tokens=case.max_tokens,
        max_retries=0,
        additional_kwargs={"extra_body": case.extra_body()}
        | ({"seed": case.seed} if case.seed is not None else {}),
    )


def relay_llm(target: Target, case: Case) -> RelayLLM:
    return RelayLLM(**relay_fields(target, case))


@pytest.mark.parametrize("case", LLAMA_MATRIX, ids=lambda case: case.id)
def test_relay_llm_answers_as_openai_like(targets: Targets, case: Case) -> None:
    reference = targets.reference(case)
    stops = stop_list(case, _unstopped_text(reference, case.unstopped()))
    expected = _llama_answer(openai_like(reference, case), case, stops)
    with relay_llm(targets.relay(case), case) as relay:
        got = _llama_answer(relay, case, stops)
    if case.stream and expected.usage is None:  # ON_PURPOSE["llama_index stream usage"]
        got = replace(got, usage=None)
    _compared(expected, got, case)


# -- the reasoning on: cues fire, both roles one model -------------------------------------

REASONING = (
    "Let me think about the question. Therefore, the answer needs one fact. "
    "Now I recall the fact and check it once more. Therefore, I can answer."
)
"""Forced reasoning in which the cues fire three times: the small model writes three sentences."""

QUESTIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    SHAPES["system"],
    SHAPES["history"],
]


AFTER_REASONING = "\n\n" + WORDS
"""The answer's grammar: the blank line a model writes after ``</think>``, then words."""


def _reasoning_then_words(role: ModelRole, phase: Phase, transcript: str) -> Mapping[str, Any]:
    """The reasoning forced; the answer is the model's own, in the words grammar (the relay
    hands the answer over at ``</think>``: the answer's writer writes the blank line)."""
    if phase == "answer":
        return {"structured_outputs": {"regex": AFTER_REASONING}}
    return forcing(f"<think>\n{REASONING}\n</think>", answer=False)(role, phase, transcript)


def _single_request(
    target: Target, messages: list[dict[str, Any]], path: str
) -> tuple[str, str | None]:
    """The model's own answer after the reasoning, and its finish reason, from the chat as
    vLLM renders it followed by the reasoning: on the text path the reasoning given as text
    (the server tokenizes it); on the token path as the very tokens the model chose for it
    (forced text may come in any spelling: ``e.g`` as ``e``, ``.g``), written in one request,
    up to the token that ends ``</think>``. Where that token holds more (``>\n\n``), the
    relay's reasoning ends inside it, at the stop string, and the rest is the answer's: the
    text up to ``</think>``'s end is then tokenized alone, as the relay sends it."""
    root = target.url.removesuffix("/v1")
    with httpx.Client(base_url=root, timeout=60) as server:

        def ids_of(body: dict[str, Any]) -> list[int]:
            return list(
                server.post("/tokenize", json={"model": target.small, **body}).json()["tokens"]
            )

        def text_of(ids: list[int]) -> str:
            body = {"model": target.small, "tokens": ids}
            return str(server.post("/detokenize", json=body).json()["prompt"])

        chat = ids_of({"messages": messages, "add_generation_prompt": True})
        reasoning = f"<think>\n{REASONING}\n</think>"
        if path == "text":
            prompt: Any = text_of(chat) + reasoning
        else:
            written = server.post(
                "/v1/completions",
                json={
                    "model": target.small,
                    "prompt": chat,
                    "temperature": 0,
                    "max_tokens": 200,
                    "return_token_ids": True,
                    "structured_outputs": {"regex": regex_literal(reasoning)},
                },
            ).json()["choices"][0]["token_ids"]
            ending = next(k for k in range(len(written)) if reasoning in text_of(written[: k + 1]))
            whole = written[:ending]  # the tokens before the one that ends the reasoning
            rest = reasoning[len(text_of(whole)) :]
            prompt = chat + whole + ids_of({"prompt": rest, "add_special_tokens": False})
    with openai.OpenAI(base_url=target.url, api_key="unused", max_retries=0) as vllm:
        answer = vllm.completions.create(
            model=target.small,
            prompt=prompt,
            temperature=0,
            max_tokens=200,
            extra_body={"structured_outputs": {"regex": AFTER_REASONING}},
        ).choices[0]
    return answer.text.lstrip(), answer.finish_reason  # the relay's answer: from its first word


@dataclass(frozen=True)
class Switched:
    """What a surface answered after the reasoning: the answer, its finish reason, the
    reasoning it shows and the switches it counted."""

    answer: str
    finish_reason: str | None
    reasoning: str
    switches: int


def _switched_relay_fields(target: Target, path: str) -> dict[str, Any]:
    """Both roles on `target`'s one model, greedy, the reasoning forced and the answer free."""
    server = Server(target.url, target.large, target.small)
    return qwen_relay_fields(
        server,
        server,
        temperature=0,
        top_k=None,
        top_p=1.0,
        max_tokens=600,
        request_hook=_reasoning_then_words,
        max_retries=0,
        prompt_path=path,
    )


def _switched(
    surface: str, target: Target, messages: list[dict[str, Any]], stream: bool, path: str
) -> Switched:
    fields = _switched_relay_fields(target, path)
    if surface == "RelayChatModel":
        with RelayChatModel(**fields) as chat_model:
            chat = convert_to_messages(messages)
            message: Any = _whole(chat_model.stream(chat)) if stream else chat_model.invoke(chat)
        metadata = message.response_metadata
        return Switched(
            message.content,
            metadata["finish_reason"],
            message.additional_kwargs["reasoning_content"],
            metadata["relay"]["switches"],
        )
    if surface == "RelayLLM":
        with RelayLLM(**fields) as llm:
            history = _llama_messages(messages)
            if stream:
                *_, response = list(llm.stream_chat(history))
            else:
                response = llm.chat(history)
        thinking = [b for b in response.message.blocks if isinstance(b, ThinkingBlock)]
        extra = response.additional_kwargs
        return Switched(
            response.message.content or "",
            extra["finish_reason"],
            "".join(b.content or "" for b in thinking),
            extra["relay"]["switches"],
        )
    hook = fields.pop("request_hook")
    config = RelayChatModel(**fields).relay_config()
    served = relay_http(RelayServer(config, request_hook=hook))
    with (
        served as running,
        openai.OpenAI(base_url=running.base_url, api_key="unused", max_retries=0) as client,
    ):
        body: dict[str, Any] = {"model": target.large, "messages": messages}
        if not stream:
            completion = client.chat.completions.create(**body)
            choice = completion.choices[0]
            extra = choice.message.model_extra or {}
            return Switched(
                choice.message.content or "",
                choice.finish_reason,
                extra["reasoning_content"],
                (completion.model_extra or {})["relay"]["switches"],
            )
        answer, reasoning, finish, switches = "", "", None, -1
        for chunk in client.chat.completions.create(**body, stream=True):
            for streamed in chunk.choices:
                answer += streamed.delta.content or ""
                reasoning += (streamed.delta.model_extra or {}).get("reasoning_content") or ""
                if streamed.finish_reason:  # the relay's figures come with the finish
                    finish = streamed.finish_reason
                    switches = (chunk.model_extra or {})["relay"]["switches"]
        return Switched(answer, finish, reasoning, switches)


@pytest.mark.parametrize("surface", ["RelayChatModel", "RelayLLM", "relaygen serve"])
@pytest.mark.parametrize("path", ["tokens", "text"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("messages", QUESTIONS, ids=["user", "system", "history"])
def test_after_switches_the_answer_is_the_one_the_model_writes_after_that_reasoning(
    targets: Targets, messages: list[dict[str, Any]], stream: bool, path: str, surface: str
) -> None:
    """The relay's answer after a reasoning in which the models switched three times is the
    answer the model writes after the same reasoning in one request (the chat as vLLM renders
    it, then the reasoning; see :func:`_single_request`), through each surface: the
    hand-offs between requests cost no token. (Not the chat endpoint with
    ``continue_final_message``: transformers strips the final message there, so its prompt
    would end without the blank line after ``</think>``.)"""
    target = targets.tuned
    expected, finish_reason = _single_request(target, messages, path)
    got = _switched(surface, target, messages, stream, path)
    assert got == Switched(expected, finish_reason, REASONING, 3)
