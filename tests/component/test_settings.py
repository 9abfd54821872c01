"""The adapters' settings: every field and call argument works, or is refused with what to use
instead; values reach the upstream requests of the model they are meant for; the environment
fills what the keywords leave unset. Both adapters share RelaySettings, so each row runs on
both."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from llama_index.core.base.llms.types import ChatMessage
from pydantic import SecretStr, ValidationError

from relay_integrations.chat.settings import RelaySettings
from relay_integrations.langchain import RelayChatModel
from relay_integrations.llama_index import RelayLLM
from relay_integrations.testing.scripted_vllm import ScriptedVLLM, serving
from tests.fakes.canary import without_canary
from tests.fakes.capable_model import capable_server, relay_fields

ADAPTERS = [RelayChatModel, RelayLLM]
URLS = relay_fields("http://127.0.0.1:9/v1")


@pytest.fixture
def server() -> Iterator[ScriptedVLLM]:
    # in a thread, like a real server: LlamaIndex reads the sync `metadata` (the context
    # window, asked of the server) from inside its event loop
    with serving(capable_server()) as running:
        yield running


async def ask(model: RelaySettings, **call: Any) -> None:
    """One short chat turn through the adapter's own async API."""
    if isinstance(model, RelayChatModel):
        await model.ainvoke("What is 2 + 2?", **call)
    else:
        assert isinstance(model, RelayLLM)
        await model.achat([ChatMessage(role="user", content="What is 2 + 2?")], **call)


def bodies(server: ScriptedVLLM, role: str) -> list[dict[str, Any]]:
    return server.models[role].requests


@pytest.mark.parametrize("adapter", ADAPTERS)
@pytest.mark.parametrize(
    ("field", "message"),
    [
        ({"temprature": 0}, r"temprature: did you mean 'temperature'\?"),
        ({"model": "gpt-4o"}, r"set large_model= and small_model="),
        ({"base_url": "http://x/v1"}, r"set large_url= and small_url="),
        ({"api_base": "http://x/v1"}, r"set large_url= and small_url="),
        ({"logit_bias": {"1": 5}}, r"token ids differ between the two models' tokenizers"),
        ({"logprobs": True}, r"do not form one distribution"),
        ({"n": 2}, r"use batch\(\)"),
        ({"reasoning_effort": "low"}, r"max_reasoning_tokens=N"),
        ({"http_client": object()}, r"run on aiohttp.*session_factory="),
        ({"organization": "org"}, r"OpenAI platform option"),
        ({"extra_body": {"temperature": 0}}, r"temperature: use the temperature= field"),
        ({"model_kwargs": {"stop": ["x"]}}, r"stop: use stop="),
        ({"extra_body": {"structured_outputs": {}}}, r"use response_format="),
        ({"extra_body": {"logit_bias": {}}}, r"bias one model only"),
        ({"large": {"api_kee": "k"}}, r"large.api_kee"),
        ({"small": {"sampling": {"temperature": 5}}}, r"small.sampling.temperature"),
        ({"temperature": 2.5}, r"temperature"),
        ({"presence_penalty": 3}, r"presence_penalty"),
        ({"timeout": 5, "request_timeout": 6}, r"mean the same; give one of them"),
    ],
)
def test_a_field_that_would_do_nothing_is_refused_with_what_to_use(
    adapter: type[RelaySettings], field: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValidationError, match=message):
        adapter(**{**URLS, **field})


def test_streaming_is_refused_by_llama_index_with_its_streaming_calls() -> None:
    with pytest.raises(ValidationError, match=r"use stream_chat\(\)"):
        RelayLLM(**URLS, **{"streaming": True})


@pytest.mark.parametrize(
    ("name", "value"), [("is_chat_model", False), ("is_function_calling_model", False)]
)
def test_llama_index_states_what_it_is(name: str, value: bool) -> None:
    RelayLLM(**URLS, **{name: True})  # true of every RelayLLM: accepted
    with pytest.raises(ValidationError, match=rf"always {name}=True"):
        RelayLLM(**URLS, **{name: value})


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_other_clients_names_for_the_same_fields_work(adapter: type[RelaySettings]) -> None:
    habits: dict[str, Any] = {  # as other clients name them (no type checker knows these)
        "request_timeout": 7,
        "max_completion_tokens": 99,
        "stop_sequences": "END",
        "model_kwargs": {"ignore_eos": False},
        "additional_kwargs": {"skip_special_tokens": True},
        "openai_api_key": "key",
    }
    model = adapter(**URLS, **habits)
    assert (model.timeout, model.max_tokens, model.stop) == (7, 99, ["END"])
    assert model.extra_body == {"ignore_eos": False, "skip_special_tokens": True}
    config = model.relay_config()
    assert config.large.read_timeout == config.small.read_timeout == 7
    assert config.sampling.max_tokens == 99
    assert config.small.api_key == SecretStr("key")


@pytest.mark.parametrize("adapter", ADAPTERS)
async def test_sampling_and_body_fields_reach_each_model(
    server: ScriptedVLLM, adapter: type[RelaySettings]
) -> None:
    model = adapter(
        **relay_fields(server.base_url),
        presence_penalty=1.5,
        min_p=0.1,
        extra_body={"ignore_eos": False},
        default_headers={"x-team": "math"},
        small={"sampling": {"temperature": 0.2}, "extra_headers": {"x-model": "small"}},
    )
    await ask(model)
    large, small = bodies(server, "large"), bodies(server, "small")
    assert large and small
    for body in large + small:
        assert body["presence_penalty"] == 1.5 and body["min_p"] == 0.1
        assert body["ignore_eos"] is False
        assert "frequency_penalty" not in body  # unset: the server's default applies
    assert {b["temperature"] for b in large} == {0.6}
    assert {b["temperature"] for b in small} == {0.2}
    assert all(h["x-team"] == "math" for h in server.models["large"].headers)
    assert all(h["x-model"] == "small" for h in server.models["small"].headers)
    assert not any("x-model" in h for h in server.models["large"].headers)


@pytest.mark.parametrize("adapter", ADAPTERS)
async def test_call_arguments_reach_both_models(
    server: ScriptedVLLM, adapter: type[RelaySettings]
) -> None:
    model = adapter(**relay_fields(server.base_url))
    await ask(
        model, repetition_penalty=1.2, frequency_penalty=0.5, extra_body={"ignore_eos": False}
    )
    for body in bodies(server, "large") + bodies(server, "small"):
        assert (body["repetition_penalty"], body["frequency_penalty"]) == (1.2, 0.5)
        assert body["ignore_eos"] is False


@pytest.mark.parametrize("adapter", ADAPTERS)
@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        ({"temprature": 0}, TypeError, r"temprature: did you mean 'temperature'\?"),
        ({"logit_bias": {"1": 3}}, TypeError, r"tokenizers"),
        ({"reasoning_effort": "high"}, TypeError, r"max_reasoning_tokens"),
        ({"n": 3}, TypeError, r"batch\(\)"),
        ({"temperature": 9}, ValueError, r"temperature"),
        ({"extra_body": {"max_tokens": 5}}, ValueError, r"max_tokens: use max_tokens="),
    ],
)
async def test_call_arguments_that_would_do_nothing_are_refused(
    server: ScriptedVLLM,
    adapter: type[RelaySettings],
    call: dict[str, Any],
    error: type[Exception],
    message: str,
) -> None:
    with pytest.raises(error, match=message):
        await ask(adapter(**relay_fields(server.base_url)), **call)
    assert not bodies(server, "large")  # refused before any upstream request


ENVIRONMENT = {
    "RELAY_LARGE__BASE_URL": "http://gpu-a:8000/v1",
    "RELAY_LARGE__MODEL": "Qwen/Qwen3-32B",
    "RELAY_SMALL__BASE_URL": "http://gpu-b:8001/v1",
    "RELAY_SMALL__MODEL": "Qwen/Qwen3-1.7B",
    "RELAY_SAMPLING__TEMPERATURE": "0.3",
    "RELAY_SAMPLING__PRESENCE_PENALTY": "1.5",
    "RELAY_POLICY__ANSWER_MODEL": "large",
    "RELAY_LARGE__EXTRA_HEADERS": '{"x-tenant": "a"}',
    "RELAY_SMALL__API_KEY": "small-key",
    "RELAY_SMALL__CONNECT_TIMEOUT": "2.5",
    "RELAY_SMALL__SAMPLING__TOP_P": "0.5",
    "RELAY_CUES": '["Therefore,"]',
}


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_from_env_reads_every_documented_variable(
    adapter: type[RelaySettings], monkeypatch: pytest.MonkeyPatch
) -> None:
    without_canary(monkeypatch)  # these variables only, or RELAY_API_KEY would be the key
    for name, value in ENVIRONMENT.items():
        monkeypatch.setenv(name, value)
    model = adapter.from_env()
    config = model.relay_config()
    assert (model.large_url, model.small_model) == ("http://gpu-a:8000/v1", "Qwen/Qwen3-1.7B")
    assert model.temperature == config.sampling.temperature == 0.3
    assert model.presence_penalty == config.sampling.presence_penalty == 1.5
    assert model.policy.answer_model == config.policy.answer_model == "large"
    assert config.large.extra_headers == {"x-tenant": "a"}
    assert config.small.api_key == SecretStr("small-key") and config.large.api_key is None
    assert config.small.connect_timeout == 2.5
    assert config.small.sampling.top_p == 0.5
    assert model.cues == ["Therefore,"]
    # keywords win over the environment, field by field
    mixed = adapter.from_env(temperature=0.9, large={"extra_headers": {"x-tenant": "b"}})
    assert mixed.relay_config().sampling.temperature == 0.9
    assert mixed.relay_config().sampling.presence_penalty == 1.5
    assert mixed.relay_config().large.extra_headers == {"x-tenant": "b"}


def test_the_flat_defaults_are_the_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    from relay_integrations.relay import EndpointConfig, RelayConfig, SamplingConfig

    without_canary(monkeypatch)  # the defaults, not the environment's key and headers
    model = RelayChatModel(**URLS)
    core = RelayConfig(
        large=EndpointConfig(base_url=URLS["large_url"], model="large"),
        small=EndpointConfig(base_url=URLS["small_url"], model="small"),
        cues=URLS["cues"],
        policy=URLS["policy"],
    )
    assert model.relay_config() == core
    assert model.sampling() == SamplingConfig()
    for name in ("temperature", "top_p", "top_k", "max_tokens"):
        assert getattr(model, name) == getattr(SamplingConfig(), name)


class TokenCounter(BaseCallbackHandler):
    def __init__(self) -> None:
        self.tokens: list[str] = []

    def on_llm_new_token(self, token: Any, **kwargs: Any) -> None:
        self.tokens.append(str(token))


async def test_streaming_true_makes_invoke_stream_through_callbacks(server: ScriptedVLLM) -> None:
    fields = relay_fields(server.base_url)
    quiet, streamed = TokenCounter(), TokenCounter()
    await RelayChatModel(**fields).ainvoke("What is 2 + 2?", config={"callbacks": [quiet]})
    message = await RelayChatModel(**fields, streaming=True).ainvoke(
        "What is 2 + 2?", config={"callbacks": [streamed]}
    )
    assert quiet.tokens == []
    assert "".join(streamed.tokens) == message.text == "The answer is 4."
    assert message.usage_metadata is not None  # the chunks' usage, summed


async def test_stream_usage_false_leaves_usage_off_the_stream(server: ScriptedVLLM) -> None:
    fields = relay_fields(server.base_url)
    with_usage = [c async for c in RelayChatModel(**fields).astream("What is 2 + 2?")]
    without = [c async for c in RelayChatModel(**fields, stream_usage=False).astream("Hi")]
    per_call = [c async for c in RelayChatModel(**fields).astream("Hi", stream_usage=False)]
    assert sum(c.usage_metadata is not None for c in with_usage) == 1
    assert all(c.usage_metadata is None for c in without + per_call)


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_relay_api_key_is_both_servers_key_unless_one_has_its_own(
    adapter: type[RelaySettings], monkeypatch: pytest.MonkeyPatch
) -> None:
    from relay_integrations.relay import RelayConfig

    for name, value in ENVIRONMENT.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("RELAY_API_KEY", "shared-key")
    for config in (adapter.from_env().relay_config(), RelayConfig.from_env()):
        assert config.large.api_key == SecretStr("shared-key")
        assert config.small.api_key == SecretStr("small-key")  # RELAY_SMALL__API_KEY
    explicit = adapter.from_env(api_key="mine").relay_config()
    assert explicit.large.api_key == explicit.small.api_key == SecretStr("mine")
