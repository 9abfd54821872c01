"""Structured answers as the frameworks ask for them, on the capable scripted server:
``response_format=`` in every form ``ChatOpenAI`` takes (with ``parsed`` as ``ChatOpenAI``
gives it, checked against ``ChatOpenAI`` itself through ``relaygen serve``), and schemas with
definitions (``$defs``/``$ref``: nested, recursive, enums, optional fields) in tool calls and
structured output, through LangChain, LlamaIndex and ``relaygen serve``.

The scripted server refuses, as vLLM does, a grammar whose ``$ref`` points at nothing, and
its models fill a schema from its root: a result that validates shows the references
resolved."""

from __future__ import annotations

import json
from collections.abc import Iterator
from enum import StrEnum
from typing import Any, TypedDict

import openai
import pytest
from langchain_core.exceptions import OutputParserException
from langchain_core.messages import AIMessageChunk
from langchain_core.messages.ai import add_ai_message_chunks
from langchain_openai import ChatOpenAI
from llama_index.core.prompts import PromptTemplate
from pydantic import BaseModel, SecretStr

from relay_integrations.chat.constraints import forced_call_schema
from relay_integrations.langchain import RelayChatModel
from relay_integrations.langchain.chat_model import StructuredOutputMethod
from relay_integrations.llama_index import RelayLLM
from relay_integrations.server import RelayServer
from relay_integrations.testing.scripted_vllm import ScriptedVLLM
from tests.fakes.capable_model import capable_relay_config, relay_fields
from tests.fakes.relay_http import ServedRelay, relay_http

QUESTION = "What is 2 + 2? Give the value and the reason."
ALBUM_QUESTION = "Describe the album 'Blue Train' with its songs."


class Answer(BaseModel):
    value: int
    reason: str


class AnswerDict(TypedDict):
    value: int
    reason: str


class Genre(StrEnum):
    JAZZ = "jazz"
    ROCK = "rock"


class Song(BaseModel):
    title: str
    seconds: int
    genre: Genre


class Album(BaseModel):
    """An album and its songs."""

    name: str
    songs: list[Song]
    producer: str | None = None


class Outline(BaseModel):
    """A section of an outline, with its subsections (a recursive model)."""

    title: str
    sections: list[Outline]


class Document(BaseModel):
    """A document with a recursive outline below its root."""

    title: str
    outline: Outline


NESTED: list[type[BaseModel]] = [Album, Outline]
LLAMA_INDEX_NESTED: list[type[BaseModel]] = [Album, Document]
"""LlamaIndex 0.14's ``call_tool`` reads ``properties`` from a tool's parameters, which a
model that is recursive at its root (``Outline``) has only in its ``$defs``: its
``structured_predict`` fails with any LLM, so the recursion is tested one level down."""


@pytest.fixture(scope="module")
def served(upstream: ScriptedVLLM) -> Iterator[ServedRelay]:
    with relay_http(RelayServer(capable_relay_config(upstream.base_url))) as running:
        yield running


def chat_model(server: ScriptedVLLM) -> RelayChatModel:
    return RelayChatModel(**relay_fields(server.base_url))


def streamed(model: RelayChatModel, question: str, **call: Any) -> AIMessageChunk:
    chunks = [c for c in model.stream(question, **call) if isinstance(c, AIMessageChunk)]
    return add_ai_message_chunks(chunks[0], *chunks[1:])


# --- response_format= as ChatOpenAI takes it --------------------------------------------------


@pytest.mark.parametrize("how", ["invoke", "stream"])
def test_response_format_a_pydantic_class_gives_the_parsed_instance(
    server: ScriptedVLLM, how: str
) -> None:
    model = chat_model(server)
    if how == "invoke":
        message: Any = model.invoke(QUESTION, response_format=Answer)
    else:
        message = streamed(model, QUESTION, response_format=Answer)
    parsed = message.additional_kwargs["parsed"]
    assert isinstance(parsed, Answer)
    assert parsed == Answer.model_validate_json(message.text)


@pytest.mark.parametrize(
    "response_format",
    [
        AnswerDict,
        Answer.model_json_schema(),
        {"name": "answer", "schema": Answer.model_json_schema()},
        {"type": "json_schema", "json_schema": {"name": "a", "schema": Answer.model_json_schema()}},
    ],
    ids=["TypedDict", "JSON schema", "name and schema", "OpenAI json_schema"],
)
@pytest.mark.parametrize("how", ["invoke", "stream"])
def test_response_format_a_schema_gives_its_json_and_parsed_none(
    server: ScriptedVLLM, response_format: Any, how: str
) -> None:
    model = chat_model(server)
    if how == "invoke":
        message: Any = model.invoke(QUESTION, response_format=response_format)
    else:
        message = streamed(model, QUESTION, response_format=response_format)
    Answer.model_validate_json(message.text)
    assert "parsed" in message.additional_kwargs and message.additional_kwargs["parsed"] is None
    constraint = server.models["small"].requests[-1]["structured_outputs"]
    assert set(constraint["json"]["properties"]) == {"value", "reason"}


def test_response_format_json_object_gives_an_object(server: ScriptedVLLM) -> None:
    message = chat_model(server).invoke(
        "Answer with the keys 'value' and 'reason'.", response_format={"type": "json_object"}
    )
    assert isinstance(json.loads(message.text), dict)
    assert message.additional_kwargs["parsed"] is None


@pytest.mark.parametrize(
    "response_format",
    [
        Answer,
        {"type": "json_schema", "json_schema": {"name": "a", "schema": Answer.model_json_schema()}},
        {"type": "json_object"},
    ],
    ids=["class", "OpenAI json_schema", "json_object"],
)
def test_parsed_is_what_chat_openai_gives_for_the_same_response_format(
    server: ScriptedVLLM, served: ServedRelay, response_format: Any
) -> None:
    """ChatOpenAI through relaygen serve, on the same scripted models: the same ``parsed``."""
    reference = ChatOpenAI(base_url=served.base_url, api_key=SecretStr("x"), model="large")
    json_object = response_format == {"type": "json_object"}
    question = "Answer with the key 'value'." if json_object else QUESTION
    theirs = reference.invoke(question, response_format=response_format)
    ours = chat_model(server).invoke(question, response_format=response_format)
    assert type(ours.additional_kwargs["parsed"]) is type(theirs.additional_kwargs["parsed"])
    assert ours.additional_kwargs["parsed"] == theirs.additional_kwargs["parsed"]
    assert json.loads(ours.text) == json.loads(theirs.text)


def test_an_answer_cut_by_the_token_limit_raises_with_its_text(server: ScriptedVLLM) -> None:
    with pytest.raises(OutputParserException, match="raise max_tokens") as raised:
        chat_model(server).invoke(QUESTION, response_format=Answer, max_tokens=60)
    assert raised.value.llm_output is not None


# --- schemas with definitions ---------------------------------------------------------------


def test_a_forced_call_grammar_resolves_the_tool_s_definitions() -> None:
    tools = [
        {"type": "function", "function": {"name": m.__name__, "parameters": m.model_json_schema()}}
        for m in NESTED
    ]
    schema = forced_call_schema(tools)
    assert schema["anyOf"][0]["properties"]["arguments"] == {"$ref": "#/$defs/Album.parameters"}
    assert set(schema["$defs"]) == {
        "Album.parameters",
        "Album.parameters.Song",
        "Album.parameters.Genre",
        "Outline.parameters",
        "Outline.parameters.Outline",
    }
    song = schema["$defs"]["Album.parameters"]["properties"]["songs"]["items"]
    assert song == {"$ref": "#/$defs/Album.parameters.Song"}
    recursive = schema["$defs"]["Outline.parameters.Outline"]["properties"]["sections"]
    assert recursive["items"] == {"$ref": "#/$defs/Outline.parameters.Outline"}


def test_a_tool_without_definitions_keeps_its_parameters_in_place() -> None:
    parameters = Answer.model_json_schema()
    schema = forced_call_schema(
        [{"type": "function", "function": {"name": "a", "parameters": parameters}}]
    )
    assert schema["properties"]["arguments"] == parameters and "$defs" not in schema


def check_instance(schema: type[BaseModel], value: Any) -> None:
    """`value` validates as `schema`, nested parts filled as their own models."""
    instance = value if isinstance(value, schema) else schema.model_validate(value)
    if isinstance(instance, Album):
        assert instance.songs and all(isinstance(song, Song) for song in instance.songs)
        assert instance.songs[0].genre in Genre
    outline = instance.outline if isinstance(instance, Document) else instance
    if isinstance(outline, Outline):
        assert outline.sections and isinstance(outline.sections[0], Outline)


@pytest.mark.parametrize("schema", NESTED)
@pytest.mark.parametrize("method", ["function_calling", "json_schema"])
def test_langchain_with_structured_output_of_nested_models(
    server: ScriptedVLLM, schema: type[BaseModel], method: StructuredOutputMethod
) -> None:
    structured = chat_model(server).with_structured_output(schema, method=method)
    check_instance(schema, structured.invoke(ALBUM_QUESTION))


@pytest.mark.parametrize("schema", NESTED)
def test_langchain_bind_tools_of_a_nested_model_forced(
    server: ScriptedVLLM, schema: type[BaseModel]
) -> None:
    tool = {
        "type": "function",
        "function": {"name": schema.__name__, "parameters": schema.model_json_schema()},
    }
    message = (
        chat_model(server).bind_tools([tool], tool_choice=schema.__name__).invoke(ALBUM_QUESTION)
    )
    [call] = message.tool_calls
    check_instance(schema, call["args"])


@pytest.mark.parametrize("schema", LLAMA_INDEX_NESTED)
def test_llama_index_structured_predict_of_nested_models(
    server: ScriptedVLLM, schema: type[BaseModel]
) -> None:
    llm = RelayLLM(**relay_fields(server.base_url))
    result = llm.structured_predict(schema, PromptTemplate("{question}"), question=ALBUM_QUESTION)
    check_instance(schema, result)


@pytest.mark.parametrize("schema", NESTED)
def test_relaygen_serve_with_a_pydantic_function_tool(
    served: ServedRelay, schema: type[BaseModel]
) -> None:
    with openai.OpenAI(base_url=served.base_url, api_key="x") as client:
        completion = client.chat.completions.create(
            model="large",
            messages=[{"role": "user", "content": ALBUM_QUESTION}],
            tools=[openai.pydantic_function_tool(schema)],
            tool_choice={"type": "function", "function": {"name": schema.__name__}},
        )
    [call] = completion.choices[0].message.tool_calls or []
    assert call.type == "function"
    check_instance(schema, json.loads(call.function.arguments))


@pytest.mark.parametrize("schema", NESTED)
def test_relaygen_serve_parses_a_nested_response_format(
    served: ServedRelay, schema: type[BaseModel]
) -> None:
    with openai.OpenAI(base_url=served.base_url, api_key="x") as client:
        completion = client.chat.completions.parse(
            model="large",
            messages=[{"role": "user", "content": ALBUM_QUESTION}],
            response_format=schema,
        )
    check_instance(schema, completion.choices[0].message.parsed)
