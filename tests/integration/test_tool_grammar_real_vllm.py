"""The answer grammars for tools and structured output (chat/constraints.py) on the real vLLM
servers: the server compiles them, and what it writes under them comes back parsed (also for
schemas with definitions: nested and recursive models, enums, optional fields, through
LangChain, LlamaIndex and ``relaygen serve``).

The reasoning is forced (``relay_integrations.testing.forcing``); the answer is left to the
tiny random model under the relay's grammar, with one ``logit_bias`` choosing the branch: the
``<tool_call>`` token (the grammar allows it, as the first text of a call block) or ``{`` (the
first text of the JSON answer). The bias picks among the tokens the grammar allows, so
everything after the first token is the grammar's doing.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from enum import StrEnum
from typing import Any, Literal

import httpx
import openai
import pytest
from langchain.agents import create_agent
from langchain.agents.structured_output import ProviderStrategy
from langchain_core.messages import AIMessage, ToolMessage
from llama_index.core.prompts import PromptTemplate
from pydantic import BaseModel, Field

from relay_integrations.langchain import RelayChatModel
from relay_integrations.llama_index import RelayLLM
from relay_integrations.relay.config import Phase
from relay_integrations.server import RelayServer
from relay_integrations.testing import forcing
from relay_integrations.upstream.config import ModelRole
from tests.fakes.relay_http import relay_http

from .conftest import PATIENT, Server, qwen_relay_fields

pytestmark = pytest.mark.vllm

REASONING = "Let me look. Therefore, I know what to do. Now I answer."
THOUGHT = f"<think>\n{REASONING}\n</think>\n\n"


class Verdict(BaseModel):
    correct: bool
    grade: Literal["A", "B", "C"]


def set_light(on: bool) -> str:
    """Switch the light on or off."""
    return "done"


VERDICT_FORMAT = {"type": "json_schema", "json_schema": {"schema": Verdict.model_json_schema()}}


def first_token(server: Server, model: str, text: str) -> int:
    """The id of `text` as one token of the server's tokenizer."""
    body = {"model": model, "prompt": text, "add_special_tokens": False}
    (token,) = httpx.post(f"{server.root}/tokenize", json=body, timeout=PATIENT).json()["tokens"]
    return int(token)


class BranchForcing:
    """A request hook: every generation's reasoning forced to THOUGHT, then its answer
    biased towards the next of `firsts` (token ids), one generation after another."""

    def __init__(self, *firsts: int) -> None:
        self._firsts: Iterator[int] = iter(firsts)
        self._reasoning = forcing(THOUGHT, answer=False)
        self._bias: dict[str, int] = {}

    def __call__(self, role: ModelRole, phase: Phase, transcript: str) -> Mapping[str, Any]:
        if phase != "answer":
            if not transcript:  # a new generation
                self._bias = {str(next(self._firsts)): 100}
            return self._reasoning(role, phase, transcript)
        return {"logit_bias": self._bias}


@pytest.fixture
def tokens(qwen_small: Server) -> dict[str, int]:
    """The branch-choosing tokens of the Qwen3 tokenizer (the small model writes answers)."""
    model = qwen_small.small_model
    return {
        "call": first_token(qwen_small, model, "<tool_call>"),
        "json": first_token(qwen_small, model, "{"),
    }


def relay(large: Server, small: Server, hook: BranchForcing) -> RelayChatModel:
    """Greedy: the random model's choices (how much whitespace, whether another call block
    follows one) are the same every run, so no run ends inside a block at the token limit."""
    fields = qwen_relay_fields(large, small, request_hook=hook, temperature=0)
    return RelayChatModel(**fields)


@pytest.mark.parametrize("parallel", [True, False])
@pytest.mark.parametrize("strict", [True, None])  # None: strict, as with any response format
def test_under_tools_and_a_schema_the_calls_come_back_parsed(
    qwen_large: Server,
    qwen_small: Server,
    tokens: dict[str, int],
    strict: bool | None,
    parallel: bool,
) -> None:
    """Parallel calls: the grammar allows more blocks after the first, one only without."""
    llm = relay(qwen_large, qwen_small, BranchForcing(tokens["call"])).bind_tools(
        [set_light], response_format=VERDICT_FORMAT, strict=strict, parallel_tool_calls=parallel
    )
    message = llm.invoke("Turn the light on, then grade it.")
    assert message.invalid_tool_calls == []
    calls = message.tool_calls
    assert len(calls) >= 1 if parallel else len(calls) == 1
    for call in calls:  # the tool's name and schema: the grammar allows nothing else
        assert call["name"] == "set_light"
        assert set(call["args"]) == {"on"} and isinstance(call["args"]["on"], bool)
    assert message.content == ""
    assert message.response_metadata["finish_reason"] == "tool_calls"
    assert message.additional_kwargs["reasoning_content"] == REASONING


@pytest.mark.parametrize("strict", [True, False])
def test_under_tools_and_a_schema_the_json_answer_comes_back_parsed(
    qwen_large: Server, qwen_small: Server, tokens: dict[str, int], strict: bool
) -> None:
    """Also with ``strict=False``, whose call blocks take any object of arguments (the server
    compiles that grammar too)."""
    llm = relay(qwen_large, qwen_small, BranchForcing(tokens["json"])).bind_tools(
        [set_light], response_format=VERDICT_FORMAT, strict=strict
    )
    message = llm.invoke("Turn the light on, then grade it.")
    assert message.tool_calls == [] and message.invalid_tool_calls == []
    assert isinstance(message.content, str)
    Verdict.model_validate_json(message.content)  # the schema's JSON, nothing around it
    assert message.response_metadata["finish_reason"] == "stop"


def test_a_strict_tool_s_call_block_is_held_to_its_schema_in_free_text(
    qwen_large: Server, qwen_small: Server, tokens: dict[str, int]
) -> None:
    llm = relay(qwen_large, qwen_small, BranchForcing(tokens["call"])).bind_tools(
        [set_light], strict=True, parallel_tool_calls=False
    )
    message = llm.invoke("Turn the light on.")
    assert message.invalid_tool_calls == []
    (call,) = message.tool_calls
    assert call["name"] == "set_light"
    assert set(call["args"]) == {"on"} and isinstance(call["args"]["on"], bool)


def test_an_agent_with_the_provider_strategy_calls_the_tool_then_answers_in_the_schema(
    qwen_large: Server, qwen_small: Server, tokens: dict[str, int]
) -> None:
    """``create_agent(..., response_format=ProviderStrategy(Verdict))``: the first turn's
    answer is a call (the tool runs), the second's the schema, under the same grammar."""
    hook = BranchForcing(tokens["call"], tokens["json"])
    agent: Any = create_agent(
        relay(qwen_large, qwen_small, hook),
        tools=[set_light],
        response_format=ProviderStrategy(Verdict),
    )
    state = agent.invoke({"messages": [("user", "Turn the light on, then grade it.")]})
    messages = state["messages"]
    calls = [c for m in messages if isinstance(m, AIMessage) for c in m.tool_calls]
    assert calls and all(c["name"] == "set_light" for c in calls)  # the tool ran each call
    assert [m.content for m in messages if isinstance(m, ToolMessage)] == ["done"] * len(calls)
    assert isinstance(state["structured_response"], Verdict)
    final = messages[-1]
    assert isinstance(final, AIMessage) and not final.tool_calls
    assert Verdict(**json.loads(final.text)) == state["structured_response"]


# --- schemas with definitions: nested, recursive, enums, optional fields ----------------------
# The models bound their strings, lists and depth, so that what the random model writes under
# the grammar always ends within the token budget; the grammar alone decides its shape.


class Genre(StrEnum):
    JAZZ = "jazz"
    ROCK = "rock"


class Song(BaseModel):
    title: str = Field(max_length=6)
    seconds: int = Field(ge=0, le=999)
    genre: Genre


class Album(BaseModel):
    """An album and its songs."""

    name: str = Field(max_length=6)
    songs: list[Song] = Field(min_length=1, max_length=2)
    producer: str | None = Field(default=None, max_length=6)


class Outline(BaseModel):
    """A section with its subsections (a recursive model)."""

    title: str = Field(max_length=4)
    sections: list[Outline] = Field(max_length=1)


class Document(BaseModel):
    """A recursive outline below the root (LlamaIndex's tool calling needs root properties)."""

    title: str = Field(max_length=4)
    outline: Outline


NESTED: list[type[BaseModel]] = [Album, Outline]
FORCED_REASONING = forcing(THOUGHT, answer=False)


def answer_model(large: Server, small: Server) -> dict[str, object]:
    """The relay's fields, the reasoning forced, the answer the small model's under the
    grammar (greedy, with room for the whole object)."""
    return qwen_relay_fields(
        large, small, request_hook=FORCED_REASONING, temperature=0, max_tokens=1200
    )


def validated(schema: type[BaseModel], value: Any) -> BaseModel:
    return value if isinstance(value, schema) else schema.model_validate(value)


@pytest.mark.parametrize("schema", NESTED)
@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_langchain_structured_output_of_a_nested_model_validates(
    qwen_large: Server, qwen_small: Server, schema: type[BaseModel], method: Any
) -> None:
    llm = RelayChatModel(**answer_model(qwen_large, qwen_small))
    result = llm.with_structured_output(schema, method=method).invoke("Describe it.")
    assert isinstance(validated(schema, result), schema)


@pytest.mark.parametrize("schema", [Album, Document])
def test_llama_index_structured_predict_of_a_nested_model_validates(
    qwen_large: Server, qwen_small: Server, schema: type[BaseModel]
) -> None:
    llm = RelayLLM(**answer_model(qwen_large, qwen_small))
    result = llm.structured_predict(schema, PromptTemplate("{question}"), question="Describe it.")
    assert isinstance(result, schema)


@pytest.mark.parametrize("schema", NESTED)
def test_relaygen_serve_forced_pydantic_function_tool_validates(
    qwen_large: Server, qwen_small: Server, schema: type[BaseModel]
) -> None:
    config = RelayChatModel(**answer_model(qwen_large, qwen_small)).relay_config()
    with (
        relay_http(RelayServer(config, request_hook=FORCED_REASONING)) as served,
        openai.OpenAI(base_url=served.base_url, api_key="x", timeout=120) as client,
    ):
        completion = client.chat.completions.create(
            model=qwen_large.large_model,
            messages=[{"role": "user", "content": "Describe it."}],
            tools=[openai.pydantic_function_tool(schema)],
            tool_choice={"type": "function", "function": {"name": schema.__name__}},
        )
    [call] = completion.choices[0].message.tool_calls or []
    assert call.type == "function" and call.function.name == schema.__name__
    assert isinstance(validated(schema, json.loads(call.function.arguments)), schema)
