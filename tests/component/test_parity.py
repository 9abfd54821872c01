"""What a ``ChatOpenAI`` / ``ChatDeepSeek`` user writes, run on ``RelayChatModel``, and what a
LlamaIndex ``OpenAILike`` user writes, run on ``RelayLLM``: each row works with the same
meaning (checked against the requests the scripted servers received) or is refused at once
with a message that names the alternative. ``python -m tests.component.test_parity`` prints the
table with the real messages (docs/langchain.md and docs/llama-index.md show it)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypedDict

import aiohttp
import pytest
from langchain.agents.structured_output import ProviderStrategy, ToolStrategy
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.rate_limiters import InMemoryRateLimiter
from langchain_core.runnables import ConfigurableField
from llama_index.core.base.llms.types import ChatMessage, ImageBlock, TextBlock
from pydantic import BaseModel

from relay_integrations.langchain import RelayChatModel
from relay_integrations.llama_index import RelayLLM
from relay_integrations.testing.scripted_vllm import ScriptedVLLM, serving
from tests.fakes.capable_model import capable_server, relay_fields

QUESTION = "What is 2 + 2?"
ANSWER = "The answer is 4."
IMAGE_URL = "https://example.com/chart.png"
IMAGE: dict[str, Any] = {"type": "image_url", "image_url": {"url": IMAGE_URL}}


@dataclass(frozen=True)
class Refused:
    error: type[Exception]
    pattern: str


Check = Callable[[Any, ScriptedVLLM], None]


@dataclass(frozen=True)
class Habit:
    """One thing users write: constructor fields, and what they do with the model."""

    habit: str
    fields: dict[str, Any]
    action: Callable[[Any], Any]
    outcome: Check | Refused


def bodies(server: ScriptedVLLM) -> list[dict[str, Any]]:
    return server.models["large"].requests + server.models["small"].requests


def headers(server: ScriptedVLLM) -> list[dict[str, str]]:
    return server.models["large"].headers + server.models["small"].headers


def answers(result: Any, server: ScriptedVLLM) -> None:
    text = result.text if isinstance(result, AIMessage) else str(result)
    assert ANSWER in text, text


def every_body(**expected: Any) -> Check:
    def check(result: Any, server: ScriptedVLLM) -> None:
        sent = bodies(server)
        assert sent
        for name, value in expected.items():
            assert all(b.get(name) == value for b in sent), (name, [b.get(name) for b in sent])

    return check


def every_header(name: str, value: str) -> Check:
    def check(result: Any, server: ScriptedVLLM) -> None:
        assert headers(server) and all(h.get(name) == value for h in headers(server))

    return check


def both(*checks: Check) -> Check:
    def check(result: Any, server: ScriptedVLLM) -> None:
        for one in checks:
            one(result, server)

    return check


def equals(expected: Any) -> Check:
    def check(result: Any, server: ScriptedVLLM) -> None:
        assert result == expected

    return check


def stopped_before(text: str) -> Check:
    def check(message: AIMessage, server: ScriptedVLLM) -> None:
        assert message.text and text not in message.text, message.text

    return check


def no_usage(chunks: list[Any], server: ScriptedVLLM) -> None:
    assert chunks and all(chunk.usage_metadata is None for chunk in chunks)


def texts(expected: list[str]) -> Check:
    def check(messages: list[AIMessage], server: ScriptedVLLM) -> None:
        assert [m.text for m in messages] == expected

    return check


def budget_at_most(tokens: int) -> Check:
    def check(result: Any, server: ScriptedVLLM) -> None:
        assert bodies(server) and all(b["max_tokens"] <= tokens for b in bodies(server))

    return check


def endpoint_setting(name: str) -> Callable[[Any], Any]:
    """What the model configured for both endpoints (a timeout needs no stall to be seen)."""

    def action(model: Any) -> Any:
        config = model.relay_config()
        assert getattr(config.large, name) == getattr(config.small, name)
        return getattr(config.large, name)

    return action


SESSIONS: list[aiohttp.ClientSession] = []


def own_session() -> aiohttp.ClientSession:
    """A user's session factory: the relay calls it once per endpoint and event loop."""
    SESSIONS.append(aiohttp.ClientSession())
    return SESSIONS[-1]


def sessions_made(result: Any, server: ScriptedVLLM) -> None:
    assert SESSIONS, "the relay made no session with the factory"


def system_prompt_rendered(result: Any, server: ScriptedVLLM) -> None:
    prompts = [b["prompt"] for b in bodies(server)]
    assert prompts and all("Be brief." in prompt for prompt in prompts)


def positive(count: int, server: ScriptedVLLM) -> None:
    assert count > 0


def invoke(**call: Any) -> Callable[[RelayChatModel], Any]:
    return lambda model: model.invoke(QUESTION, **call)


class Answer(BaseModel):
    value: int


def get_weather(city: str) -> str:
    """Weather in a city."""
    return "sunny"


class Recorder(BaseCallbackHandler):
    def __init__(self) -> None:
        self.events: list[str] = []

    def on_chat_model_start(self, *args: Any, **kwargs: Any) -> None:
        self.events.append("start")

    def on_llm_new_token(self, *args: Any, **kwargs: Any) -> None:
        self.events.append("token")

    def on_llm_end(self, *args: Any, **kwargs: Any) -> None:
        self.events.append("end")


def with_callbacks(streaming: bool) -> Callable[[RelayChatModel], Any]:
    def action(model: RelayChatModel) -> list[str]:
        recorder = Recorder()
        run = model.stream if streaming else model.invoke
        result = run(QUESTION, config={"callbacks": [recorder]})
        if streaming:
            list(result)
        return recorder.events

    return action


def callbacks_seen(streamed: bool) -> Check:
    def check(events: list[str], server: ScriptedVLLM) -> None:
        assert events[0] == "start" and events[-1] == "end"
        assert ("token" in events) is streamed

    return check


def stream_text(model: RelayChatModel) -> str:
    return "".join(chunk.text for chunk in model.stream(QUESTION))


def events_text(model: RelayChatModel) -> str:
    import asyncio

    async def run() -> str:
        text = ""
        async for event in model.astream_events(QUESTION, version="v2"):
            if event["event"] == "on_chat_model_stream":
                text += event["data"]["chunk"].text
        return text

    return asyncio.run(run())


def tool_calls(name: str) -> Check:
    def check(message: AIMessage, server: ScriptedVLLM) -> None:
        assert [c["name"] for c in message.tool_calls] == [name], message

    return check


def parsed(result: Any, server: ScriptedVLLM) -> None:
    value = result["parsed"] if isinstance(result, dict) and "parsed" in result else result
    assert isinstance(value, Answer | dict), result


def usage_on_last_chunk(chunks: list[Any], server: ScriptedVLLM) -> None:
    assert [c.usage_metadata is not None for c in chunks][-1] is True


class Song(BaseModel):
    title: str


class Album(BaseModel):
    """An album and its songs (a model nested in another, through ``$defs``)."""

    name: str
    songs: list[Song]


def album(result: Any, server: ScriptedVLLM) -> None:
    value = Album.model_validate(result) if isinstance(result, dict) else result
    assert isinstance(value, Album) and value.songs and isinstance(value.songs[0], Song)


def parsed_instance(message: AIMessage, server: ScriptedVLLM) -> None:
    assert isinstance(message.additional_kwargs["parsed"], Answer), message.additional_kwargs


def json_answer(message: AIMessage, server: ScriptedVLLM) -> None:
    Answer.model_validate_json(message.text)
    assert message.additional_kwargs["parsed"] is None  # as ChatOpenAI: a dict schema


def chunk_models(key: str) -> Check:
    """Every streamed chunk names the model that wrote it."""

    def check(chunks: list[Any], server: ScriptedVLLM) -> None:
        names = [
            c.response_metadata[key][0] if key == "relay_models" else c.additional_kwargs[key]
            for c in chunks
        ]
        assert chunks and set(names) == {"large", "small"}, names

    return check


def copied(update: dict[str, Any], act: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda model: act(model.model_copy(update=update))


def assigned(name: str, value: Any, act: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def action(model: Any) -> Any:
        setattr(model, name, value)
        return act(model)

    return action


class AnswerDict(TypedDict):
    value: int


WEATHER = "What is the weather in Paris? Use a tool."
PARIS = 2_102_650


class Population(BaseModel):
    """The population of a city."""

    city: str
    population: int


def get_population(city: str) -> int:
    """The population of a city."""
    return PARIS


def agent(response_format: Callable[[], Any]) -> Callable[[RelayChatModel], Any]:
    def action(model: RelayChatModel) -> Any:
        from langchain.agents import create_agent

        built: Any = create_agent(model, tools=[get_population], response_format=response_format())
        return built.invoke({"messages": [("user", "Use get_population for Paris.")]})

    return action


def agent_answered(state: dict[str, Any], server: ScriptedVLLM) -> None:
    """The tool was called, and the structured answer carries its result."""
    calls = [c["name"] for m in state["messages"] if isinstance(m, AIMessage) for c in m.tool_calls]
    assert calls[0] == "get_population"
    assert state["structured_response"] == Population(city="Paris", population=PARIS)


def strict_call_grammar(message: AIMessage, server: ScriptedVLLM) -> None:
    """The answer request held each <tool_call> block to the tool's schema."""
    constrained = [b["structured_outputs"] for b in bodies(server) if "structured_outputs" in b]
    assert constrained and all("structural_tag" in c for c in constrained)


LANGCHAIN: list[Habit] = [
    # constructor fields
    Habit("temperature=0", {"temperature": 0}, invoke(), every_body(temperature=0)),
    Habit("top_p=0.9, seed=1", {"top_p": 0.9, "seed": 1}, invoke(), every_body(top_p=0.9, seed=1)),
    Habit(
        "presence_penalty / frequency_penalty",
        {"presence_penalty": 1.5, "frequency_penalty": 0.5},
        invoke(),
        every_body(presence_penalty=1.5, frequency_penalty=0.5),
    ),
    Habit("max_tokens=64", {"max_tokens": 64}, invoke(), budget_at_most(64)),
    Habit("max_completion_tokens=64", {"max_completion_tokens": 64}, invoke(), budget_at_most(64)),
    Habit("timeout=30", {"timeout": 30}, endpoint_setting("read_timeout"), equals(30)),
    Habit(
        "request_timeout=30", {"request_timeout": 30}, endpoint_setting("read_timeout"), equals(30)
    ),
    Habit("max_retries=1", {"max_retries": 1}, endpoint_setting("max_retries"), equals(1)),
    Habit("verify=False (TLS)", {"verify": False}, endpoint_setting("verify"), equals(False)),
    Habit(
        "openai_proxy=",
        {"openai_proxy": "http://proxy:3128"},
        endpoint_setting("proxy"),
        equals("http://proxy:3128"),
    ),
    Habit("trust_env=False", {"trust_env": False}, endpoint_setting("trust_env"), equals(False)),
    Habit(
        "session_factory= (an aiohttp session of one's own)",
        {"session_factory": own_session},
        invoke(),
        both(answers, sessions_made),
    ),
    Habit(
        "openai_proxy='socks5://...'",
        {"openai_proxy": "socks5://proxy:1080"},
        invoke(),
        Refused(ValueError, "SOCKS proxy"),
    ),
    Habit("stop=[...]", {"stop": ["4"]}, invoke(), stopped_before("4")),
    Habit("stop_sequences='4'", {"stop_sequences": "4"}, invoke(), stopped_before("4")),
    Habit("api_key=", {"api_key": "sk-1"}, invoke(), every_header("authorization", "Bearer sk-1")),
    Habit(
        "openai_api_key=",
        {"openai_api_key": "sk-2"},
        invoke(),
        every_header("authorization", "Bearer sk-2"),
    ),
    Habit(
        "default_headers=",
        {"default_headers": {"x-team": "a"}},
        invoke(),
        every_header("x-team", "a"),
    ),
    Habit(
        "model_kwargs= (vLLM fields)",
        {"model_kwargs": {"ignore_eos": False}},
        invoke(),
        every_body(ignore_eos=False),
    ),
    Habit(
        "extra_body=",
        {"extra_body": {"skip_special_tokens": True}},
        invoke(),
        every_body(skip_special_tokens=True),
    ),
    Habit("streaming=True", {"streaming": True}, with_callbacks(False), callbacks_seen(True)),
    Habit(
        "stream_usage=True",
        {"stream_usage": True},
        lambda m: list(m.stream(QUESTION)),
        usage_on_last_chunk,
    ),
    Habit(
        "rate_limiter=",
        {"rate_limiter": InMemoryRateLimiter(requests_per_second=100)},
        invoke(),
        answers,
    ),
    Habit("output_version='v1'", {"output_version": "v1"}, invoke(), answers),
    Habit("disable_streaming=True", {"disable_streaming": True}, stream_text, equals(ANSWER)),
    Habit(
        "model='gpt-4o'",
        {"model": "gpt-4o"},
        invoke(),
        Refused(ValueError, "set large_model= and small_model="),
    ),
    Habit(
        "base_url=",
        {"base_url": "http://x/v1"},
        invoke(),
        Refused(ValueError, "set large_url= and small_url="),
    ),
    Habit(
        "openai_api_base=",
        {"openai_api_base": "http://x/v1"},
        invoke(),
        Refused(ValueError, "large_url="),
    ),
    Habit("n=2", {"n": 2}, invoke(), Refused(ValueError, r"batch\(\)")),
    Habit("logprobs=True", {"logprobs": True}, invoke(), Refused(ValueError, "log-probabilities")),
    Habit(
        "top_logprobs=5", {"top_logprobs": 5}, invoke(), Refused(ValueError, "log-probabilities")
    ),
    Habit("logit_bias=", {"logit_bias": {"1": 2}}, invoke(), Refused(ValueError, "tokenizers")),
    Habit(
        "reasoning_effort='low'",
        {"reasoning_effort": "low"},
        invoke(),
        Refused(ValueError, "max_reasoning_tokens"),
    ),
    Habit(
        "reasoning={...}",
        {"reasoning": {"effort": "low"}},
        invoke(),
        Refused(ValueError, "max_reasoning_tokens"),
    ),
    Habit(
        "organization=",
        {"organization": "o"},
        invoke(),
        Refused(ValueError, "OpenAI platform option"),
    ),
    Habit(
        "http_client=",
        {"http_client": object()},
        invoke(),
        Refused(ValueError, "session_factory=lambda: aiohttp.ClientSession"),
    ),
    Habit(
        "default_query=",
        {"default_query": {"a": "b"}},
        invoke(),
        Refused(ValueError, "query parameters"),
    ),
    Habit(
        "tiktoken_model_name=",
        {"tiktoken_model_name": "gpt-4"},
        invoke(),
        Refused(ValueError, "tokenize"),
    ),
    Habit(
        "service_tier=",
        {"service_tier": "flex"},
        invoke(),
        Refused(ValueError, "OpenAI platform option"),
    ),
    Habit(
        "use_responses_api=True",
        {"use_responses_api": True},
        invoke(),
        Refused(ValueError, "Responses API"),
    ),
    Habit(
        "temprature=0 (typo)",
        {"temprature": 0},
        invoke(),
        Refused(ValueError, "did you mean 'temperature'"),
    ),
    # call arguments
    Habit("invoke(stop=[...])", {}, invoke(stop=["4"]), stopped_before("4")),
    Habit("invoke(temperature=0)", {}, invoke(temperature=0), every_body(temperature=0)),
    Habit("invoke(max_tokens=64)", {}, invoke(max_tokens=64), budget_at_most(64)),
    Habit(
        "invoke(max_completion_tokens=64)", {}, invoke(max_completion_tokens=64), budget_at_most(64)
    ),
    Habit(
        "invoke(extra_body=...)",
        {},
        invoke(extra_body={"ignore_eos": False}),
        every_body(ignore_eos=False),
    ),
    Habit("invoke(seed=3)", {}, invoke(seed=3), every_body(seed=3)),
    Habit(
        "invoke(response_format=json_object)",
        {},
        invoke(response_format={"type": "json_object"}),
        every_body(),
    ),
    Habit(
        "stream(stream_usage=False)",
        {},
        lambda m: list(m.stream(QUESTION, stream_usage=False)),
        no_usage,
    ),
    Habit(
        "invoke(reasoning_effort='high')",
        {},
        invoke(reasoning_effort="high"),
        Refused(TypeError, "max_reasoning_tokens"),
    ),
    Habit(
        "invoke(logprobs=True)", {}, invoke(logprobs=True), Refused(TypeError, "log-probabilities")
    ),
    Habit("invoke(n=2)", {}, invoke(n=2), Refused(TypeError, r"batch\(\)")),
    Habit(
        "invoke(logit_bias=...)", {}, invoke(logit_bias={"1": 2}), Refused(TypeError, "tokenizers")
    ),
    Habit(
        "invoke(extra_body={'max_tokens': 5})",
        {},
        invoke(extra_body={"max_tokens": 5}),
        Refused(ValueError, "use max_tokens="),
    ),
    Habit(
        "bind(temperature=0)",
        {},
        lambda m: m.bind(temperature=0).invoke(QUESTION),
        every_body(temperature=0),
    ),
    # tools and structured output
    Habit(
        "bind_tools([f])",
        {},
        lambda m: m.bind_tools([get_weather]).invoke(WEATHER),
        tool_calls("get_weather"),
    ),
    Habit(
        "bind_tools(tool_choice='any')",
        {},
        lambda m: m.bind_tools([get_weather], tool_choice="any").invoke(WEATHER),
        tool_calls("get_weather"),
    ),
    Habit(
        "bind_tools(tool_choice='required')",
        {},
        lambda m: m.bind_tools([get_weather], tool_choice="required").invoke(WEATHER),
        tool_calls("get_weather"),
    ),
    Habit(
        "bind_tools(tool_choice=name)",
        {},
        lambda m: m.bind_tools([get_weather], tool_choice="get_weather").invoke(WEATHER),
        tool_calls("get_weather"),
    ),
    Habit(
        "bind_tools(tool_choice={'type': 'function', ...})",
        {},
        lambda m: m.bind_tools(
            [get_weather], tool_choice={"type": "function", "function": {"name": "get_weather"}}
        ).invoke(WEATHER),
        tool_calls("get_weather"),
    ),
    Habit(
        "bind_tools(parallel_tool_calls=False)",
        {},
        lambda m: m.bind_tools([get_weather], parallel_tool_calls=False).invoke(WEATHER),
        tool_calls("get_weather"),
    ),
    Habit(
        "bind_tools([f], strict=True)",
        {},
        lambda m: m.bind_tools([get_weather], strict=True).invoke(WEATHER),
        both(tool_calls("get_weather"), strict_call_grammar),
    ),
    Habit(
        "create_agent(tools, response_format=Schema)",
        {},
        agent(lambda: Population),
        agent_answered,
    ),
    Habit(
        "create_agent(..., response_format=ProviderStrategy(Schema))",
        {},
        agent(lambda: ProviderStrategy(Population)),
        agent_answered,
    ),
    Habit(
        "create_agent(..., response_format=ToolStrategy(Schema))",
        {},
        agent(lambda: ToolStrategy(Population)),
        agent_answered,
    ),
    Habit(
        "with_structured_output(Schema)",
        {},
        lambda m: m.with_structured_output(Answer).invoke(QUESTION),
        parsed,
    ),
    Habit(
        "with_structured_output(method='function_calling')",
        {},
        lambda m: m.with_structured_output(Answer, method="function_calling").invoke(QUESTION),
        parsed,
    ),
    Habit(
        "with_structured_output(method='json_mode')",
        {},
        lambda m: m.with_structured_output(None, method="json_mode").invoke(
            "Answer with JSON with the key 'value'."
        ),
        parsed,
    ),
    Habit(
        "with_structured_output(include_raw=True)",
        {},
        lambda m: m.with_structured_output(Answer, include_raw=True).invoke(QUESTION),
        parsed,
    ),
    Habit(
        "with_structured_output(strict=True)",
        {},
        lambda m: m.with_structured_output(Answer, strict=True).invoke(QUESTION),
        parsed,
    ),
    # the Runnable interface
    Habit("callbacks on invoke", {}, with_callbacks(False), callbacks_seen(False)),
    Habit("callbacks on stream", {}, with_callbacks(True), callbacks_seen(True)),
    Habit("stream()", {}, stream_text, equals(ANSWER)),
    Habit("astream_events(version='v2')", {}, events_text, equals(ANSWER)),
    Habit(
        "batch([...])",
        {},
        lambda m: m.batch([QUESTION, "What is 3 + 3?"]),
        texts([ANSWER, "The answer is 6."]),
    ),
    Habit("with_retry()", {}, lambda m: m.with_retry().invoke(QUESTION), answers),
    Habit("with_fallbacks([...])", {}, lambda m: m.with_fallbacks([m]).invoke(QUESTION), answers),
    Habit(
        "configurable_fields(temperature=...)",
        {},
        lambda m: m.configurable_fields(temperature=ConfigurableField(id="t")).invoke(
            QUESTION, config={"configurable": {"t": 0.1}}
        ),
        every_body(temperature=0.1),
    ),
    Habit("get_num_tokens(text)", {}, lambda m: m.get_num_tokens(QUESTION), positive),
    # a model changed after it was made
    Habit(
        "model_copy(update={'temperature': 0})",
        {},
        copied({"temperature": 0}, invoke()),
        every_body(temperature=0),
    ),
    Habit(
        "llm.temperature = 0", {}, assigned("temperature", 0, invoke()), every_body(temperature=0)
    ),
    Habit(
        "model_copy(update={'temprature': 0}) (typo)",
        {},
        copied({"temprature": 0}, invoke()),
        Refused(ValueError, "did you mean 'temperature'"),
    ),
    Habit(
        "llm.temperature = 5",
        {},
        assigned("temperature", 5, invoke()),
        Refused(ValueError, "less than or equal to 2"),
    ),
    # structured answers
    Habit(
        "invoke(response_format=PydanticClass)",
        {},
        invoke(response_format=Answer),
        parsed_instance,
    ),
    Habit("invoke(response_format=TypedDict)", {}, invoke(response_format=AnswerDict), json_answer),
    Habit(
        "with_structured_output(nested model)",
        {},
        lambda m: m.with_structured_output(Album).invoke("Describe the album 'Blue Train'."),
        album,
    ),
    Habit(
        "stream(): who wrote each chunk",
        {},
        lambda m: list(m.stream(QUESTION)),
        chunk_models("relay_models"),
    ),
    # input the two text models cannot take, refused before any request
    Habit(
        "an image block in a HumanMessage",
        {},
        lambda m: m.invoke([HumanMessage(content=[{"type": "text", "text": QUESTION}, IMAGE])]),
        Refused(ValueError, r"messages\[0\]\.content\[1\] is of type 'image_url'.*text only"),
    ),
    Habit(
        "invoke([])", {}, lambda m: m.invoke([]), Refused(ValueError, "the chat has no messages")
    ),
    Habit(
        "stream([])",
        {},
        lambda m: list(m.stream([])),
        Refused(ValueError, "the chat has no messages"),
    ),
    Habit(
        "large_url= without http://",
        {"large_url": "127.0.0.1:8000/v1"},
        invoke(),
        Refused(ValueError, "has no scheme: write 'http://127.0.0.1:8000/v1'"),
    ),
]


def chat(**call: Any) -> Callable[[RelayLLM], Any]:
    return lambda llm: (
        llm.chat([ChatMessage(role="user", content=QUESTION)], **call).message.content
    )


LLAMA_INDEX: list[Habit] = [
    Habit("temperature=0", {"temperature": 0}, chat(), every_body(temperature=0)),
    Habit("max_tokens=64", {"max_tokens": 64}, chat(), budget_at_most(64)),
    Habit("timeout=30", {"timeout": 30}, endpoint_setting("read_timeout"), equals(30)),
    Habit(
        "request_timeout=30 (Ollama)",
        {"request_timeout": 30},
        endpoint_setting("read_timeout"),
        equals(30),
    ),
    Habit("max_retries=1", {"max_retries": 1}, endpoint_setting("max_retries"), equals(1)),
    Habit("verify=False (TLS)", {"verify": False}, endpoint_setting("verify"), equals(False)),
    Habit(
        "session_factory= (an aiohttp session of one's own)",
        {"session_factory": own_session},
        chat(),
        both(answers, sessions_made),
    ),
    Habit("api_key=", {"api_key": "sk-1"}, chat(), every_header("authorization", "Bearer sk-1")),
    Habit(
        "default_headers=",
        {"default_headers": {"x-team": "a"}},
        chat(),
        every_header("x-team", "a"),
    ),
    Habit(
        "additional_kwargs= (vLLM fields)",
        {"additional_kwargs": {"ignore_eos": False}},
        chat(),
        every_body(ignore_eos=False),
    ),
    Habit(
        "context_window=8192",
        {"context_window": 8192},
        lambda llm: llm.metadata.context_window,
        equals(8192),
    ),
    Habit("is_chat_model=True", {"is_chat_model": True}, chat(), answers),
    Habit("is_function_calling_model=True", {"is_function_calling_model": True}, chat(), answers),
    Habit(
        "system_prompt= (predict)",
        {"system_prompt": "Be brief."},
        lambda llm: llm.predict(_prompt()),
        system_prompt_rendered,
    ),
    Habit(
        "model=", {"model": "x"}, chat(), Refused(ValueError, "set large_model= and small_model=")
    ),
    Habit(
        "api_base=",
        {"api_base": "http://x/v1"},
        chat(),
        Refused(ValueError, "set large_url= and small_url="),
    ),
    Habit(
        "api_version=", {"api_version": "1"}, chat(), Refused(ValueError, "OpenAI platform option")
    ),
    Habit(
        "is_chat_model=False",
        {"is_chat_model": False},
        chat(),
        Refused(ValueError, "always is_chat_model=True"),
    ),
    Habit(
        "reuse_client=False",
        {"reuse_client": False},
        chat(),
        Refused(ValueError, "reuses its clients"),
    ),
    Habit(
        "http_client=",
        {"http_client": object()},
        chat(),
        Refused(ValueError, "session_factory=lambda: aiohttp.ClientSession"),
    ),
    Habit(
        "async_http_client=",
        {"async_http_client": object()},
        chat(),
        Refused(ValueError, "session_factory=lambda: aiohttp.ClientSession"),
    ),
    Habit("tokenizer=", {"tokenizer": object()}, chat(), Refused(ValueError, "own tokenizers")),
    Habit("logprobs=True", {"logprobs": True}, chat(), Refused(ValueError, "log-probabilities")),
    Habit(
        "reasoning_effort='low'",
        {"reasoning_effort": "low"},
        chat(),
        Refused(ValueError, "max_reasoning_tokens"),
    ),
    Habit("streaming=True", {"streaming": True}, chat(), Refused(ValueError, r"stream_chat\(\)")),
    Habit("chat(temperature=0)", {}, chat(temperature=0), every_body(temperature=0)),
    Habit("chat(max_tokens=64)", {}, chat(max_tokens=64), budget_at_most(64)),
    Habit("chat(logprobs=True)", {}, chat(logprobs=True), Refused(TypeError, "log-probabilities")),
    Habit("complete(prompt)", {}, lambda llm: llm.complete(QUESTION).text, answers),
    Habit(
        "stream_chat(...)",
        {},
        lambda llm: "".join(
            r.delta or "" for r in llm.stream_chat([ChatMessage(role="user", content=QUESTION)])
        ),
        answers,
    ),
    Habit(
        "stream_complete(prompt)",
        {},
        lambda llm: "".join(r.delta or "" for r in llm.stream_complete(QUESTION)),
        answers,
    ),
    Habit(
        "structured_predict(Schema, prompt)",
        {},
        lambda llm: llm.structured_predict(Answer, _prompt()),
        parsed,
    ),
    Habit(
        "structured_predict(nested model, prompt)",
        {},
        lambda llm: llm.structured_predict(Album, _prompt()),
        album,
    ),
    Habit(
        "model_copy(update={'temperature': 0})",
        {},
        copied({"temperature": 0}, chat()),
        every_body(temperature=0),
    ),
    Habit("llm.temperature = 0", {}, assigned("temperature", 0, chat()), every_body(temperature=0)),
    Habit(
        "stream_chat(): who wrote each delta",
        {},
        lambda llm: list(llm.stream_chat([ChatMessage(role="user", content=QUESTION)])),
        chunk_models("relay_model"),
    ),
    Habit(
        "strict=True (tool calls)",
        {"strict": True},
        lambda llm: llm.chat_with_tools([_weather_tool()], WEATHER),
        strict_call_grammar,
    ),
    Habit(
        "an ImageBlock in a ChatMessage",
        {},
        lambda llm: llm.chat(
            [
                ChatMessage(
                    role="user",
                    blocks=[TextBlock(text=QUESTION), ImageBlock(url=IMAGE_URL)],
                )
            ]
        ),
        Refused(ValueError, r"RelayLLM serves text models; a message holds \['image'\] blocks"),
    ),
    Habit(
        "chat([])", {}, lambda llm: llm.chat([]), Refused(ValueError, "the chat has no messages")
    ),
    Habit(
        "stream_chat([])",
        {},
        lambda llm: list(llm.stream_chat([])),
        Refused(ValueError, "the chat has no messages"),
    ),
    Habit(
        "small_url= without http://",
        {"small_url": "localhost:8001/v1"},
        chat(),
        Refused(ValueError, "has no scheme: write 'http://localhost:8001/v1'"),
    ),
]


def _weather_tool() -> Any:
    from llama_index.core.tools import FunctionTool

    return FunctionTool.from_defaults(get_weather)


def _prompt() -> Any:
    from llama_index.core.prompts import PromptTemplate

    return PromptTemplate(QUESTION)


def run_habit(adapter: type[Any], habit: Habit, server: ScriptedVLLM) -> Any:
    for model in server.models.values():
        model.requests.clear()
        model.headers.clear()
        model.renders = 0
    return habit.action(adapter(**{**relay_fields(server.base_url), **habit.fields}))


def check_habit(adapter: type[Any], habit: Habit, server: ScriptedVLLM) -> None:
    if isinstance(habit.outcome, Refused):
        with pytest.raises(habit.outcome.error, match=habit.outcome.pattern):
            run_habit(adapter, habit, server)
        renders = sum(model.renders for model in server.models.values())
        assert not bodies(server) and not renders, "refused, yet a request went upstream"
    else:
        habit.outcome(run_habit(adapter, habit, server), server)


@pytest.mark.parametrize("habit", LANGCHAIN, ids=[h.habit for h in LANGCHAIN])
def test_chat_openai_habits_on_relay_chat_model(habit: Habit, server: ScriptedVLLM) -> None:
    check_habit(RelayChatModel, habit, server)


@pytest.mark.parametrize("habit", LLAMA_INDEX, ids=[h.habit for h in LLAMA_INDEX])
def test_openai_like_habits_on_relay_llm(habit: Habit, server: ScriptedVLLM) -> None:
    check_habit(RelayLLM, habit, server)


def table(adapter: type[Any], habits: list[Habit], server: ScriptedVLLM) -> str:
    """The Markdown table of `habits`: works, or the refusal's own message."""
    lines = ["| habit | on the relay |", "| --- | --- |"]
    for habit in habits:
        if isinstance(habit.outcome, Refused):
            try:
                run_habit(adapter, habit, server)
                outcome = "**not refused**"
            except Exception as refused:  # the row's error: its message is the table's cell
                outcome = "refused: " + _first_reason(str(refused), habit.outcome.pattern)
        else:
            run_habit(adapter, habit, server)
            outcome = "works"
        lines.append(f"| `{habit.habit}` | {outcome} |")
    return "\n".join(lines)


def _first_reason(message: str, pattern: str) -> str:
    for line in message.splitlines():
        if re.search(pattern, line):
            return line.strip().removeprefix("Value error, ").split(" [type=")[0]
    return message.splitlines()[0]


if __name__ == "__main__":
    with serving(capable_server()) as scripted:
        print("RelayChatModel\n" + table(RelayChatModel, LANGCHAIN, scripted))
        print("\nRelayLLM\n" + table(RelayLLM, LLAMA_INDEX, scripted))
