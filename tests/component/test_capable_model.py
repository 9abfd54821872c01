"""The capable fake model (tests/fakes/capable_model.py) and the Qwen3 rendering it reads,
through the scripted server over HTTP: render, complete, parse the answer."""

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from llama_index.core.agent.react.formatter import ReActChatFormatter
from llama_index.core.agent.react.output_parser import ReActOutputParser
from llama_index.core.agent.react.types import (
    ActionReasoningStep,
    BaseReasoningStep,
    ObservationReasoningStep,
    ResponseReasoningStep,
)
from llama_index.core.base.llms.types import ChatMessage, MessageRole
from llama_index.core.tools import FunctionTool

from relay_integrations.chat.constraints import calls_or_json
from relay_integrations.chat.tool_calls import parse_answer
from relay_integrations.relay import (
    RelaySwitcher,
    SwitchPolicy,
)
from relay_integrations.testing.qwen3_template import render_chat, tokenize
from relay_integrations.testing.scripted_vllm import ScriptedModel, ScriptedVLLM
from tests.fakes.capable_model import capable, capable_relay_config

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
MAGIC = {
    "type": "function",
    "function": {
        "name": "magic_function",
        "description": "Apply a magic function to an input.",
        "parameters": {
            "properties": {
                "input": {"exclusiveMaximum": 1000, "exclusiveMinimum": -1000, "type": "integer"}
            },
            "required": ["input"],
            "type": "object",
        },
    },
}
NO_ARGS = {
    "type": "function",
    "function": {
        "name": "magic_function_no_args",
        "description": "Calculate a magic function.",
        "parameters": {"properties": {}, "type": "object"},
    },
}
ADDER = {
    "type": "function",
    "function": {
        "name": "my_adder_tool",
        "description": "Tool that adds two integers.",
        "parameters": {
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
            "type": "object",
        },
    },
}
CUSTOMER = {
    "type": "function",
    "function": {
        "name": "unicode_customer",
        "description": "Tool for creating a customer with Unicode name.",
        "parameters": {
            "properties": {"customer_name": {"type": "string"}, "description": {"type": "string"}},
            "required": ["customer_name", "description"],
            "type": "object",
        },
    },
}
JOKE = {
    "properties": {
        "setup": {"description": "question to set up a joke", "title": "Setup", "type": "string"},
        "punchline": {
            "anyOf": [{"type": "string"}, {"type": "null"}],
            "default": None,
            "description": "answer to resolve the joke",
        },
    },
    "required": ["setup"],
    "title": "Joke",
    "type": "object",
}
ORDER = {  # what pydantic writes for nested models, enums, optional and constrained fields
    "$defs": {
        "Size": {"enum": ["small", "large"], "type": "string"},
        "Item": {
            "properties": {
                "name": {"type": "string", "minLength": 2},
                "size": {"$ref": "#/$defs/Size"},
                "count": {"type": "integer", "minimum": 1, "maximum": 9},
            },
            "required": ["name", "size", "count"],
            "type": "object",
        },
    },
    "properties": {
        "kind": {"const": "order"},
        "items": {"items": {"$ref": "#/$defs/Item"}, "minItems": 1, "type": "array"},
        "express": {"type": "boolean"},
        "price": {"type": "number", "exclusiveMinimum": 0},
        "note": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None},
        "coupon": {"anyOf": [{"$ref": "#/$defs/Item"}, {"type": "null"}], "default": None},
    },
    "required": ["kind", "items", "express", "price"],
    "type": "object",
}
CUES = ["Therefore,", "Now"]


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def call(name: str, arguments: dict[str, Any], id_: str = "abc123") -> dict[str, Any]:
    function = {"name": name, "arguments": json.dumps(arguments)}
    return {"id": id_, "type": "function", "function": function}


def forced(*tools: dict[str, Any]) -> dict[str, Any]:
    """The request fields a client sends to force a call of one of `tools`."""
    options = [
        {
            "type": "object",
            "properties": {
                "name": {"const": t["function"]["name"]},
                "arguments": t["function"]["parameters"],
            },
            "required": ["name", "arguments"],
        }
        for t in tools
    ]
    schema = options[0] if len(options) == 1 else {"anyOf": options}
    return {"structured_outputs": {"json": schema}}


def conforms(value: Any, schema: Any, root: Any = None) -> bool:
    """Whether `value` is an instance of JSON schema `schema` (the keywords the fake fills)."""
    root = schema if root is None else root
    while isinstance(schema, dict) and "$ref" in schema:
        target = root
        for part in schema["$ref"].lstrip("#/").split("/"):
            target = target[part]
        schema = {**{k: v for k, v in schema.items() if k != "$ref"}, **target}
    if not isinstance(schema, dict):
        return schema is not False
    checks = [
        "const" not in schema or value == schema["const"],
        "enum" not in schema or value in schema["enum"],
        "anyOf" not in schema or any(conforms(value, s, root) for s in schema["anyOf"]),
        "oneOf" not in schema or sum(conforms(value, s, root) for s in schema["oneOf"]) == 1,
        all(conforms(value, s, root) for s in schema.get("allOf", [])),
        "type" not in schema or _has_type(value, schema["type"]),
    ]
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        checks += [key in value for key in schema.get("required", [])]
        checks += [conforms(v, properties[k], root) for k, v in value.items() if k in properties]
        if schema.get("additionalProperties") is False:
            checks.append(set(value) <= set(properties))
    if isinstance(value, list):
        checks.append(len(value) >= schema.get("minItems", 0))
        checks.append(len(value) <= schema.get("maxItems", len(value)))
        checks += [conforms(item, schema.get("items", {}), root) for item in value]
    if isinstance(value, int | float) and not isinstance(value, bool):
        checks += [
            value >= schema.get("minimum", value),
            value <= schema.get("maximum", value),
            value > schema.get("exclusiveMinimum", value - 1),
            value < schema.get("exclusiveMaximum", value + 1),
        ]
    if isinstance(value, str):
        checks.append(schema.get("minLength", 0) <= len(value) <= schema.get("maxLength", 1e9))
    return all(checks)


def _has_type(value: Any, kind: str | list[str]) -> bool:
    if isinstance(kind, list):
        return any(_has_type(value, k) for k in kind)
    number = isinstance(value, int | float) and not isinstance(value, bool)
    return {
        "object": isinstance(value, dict),
        "array": isinstance(value, list),
        "string": isinstance(value, str),
        "integer": number and float(value).is_integer(),
        "number": number,
        "boolean": isinstance(value, bool),
        "null": value is None,
    }[kind]


class Client:
    """A raw HTTP client of the scripted server, as the relay would use it."""

    def __init__(self, server: ScriptedVLLM, http: httpx.AsyncClient) -> None:
        self.root = server.base_url.removesuffix("/v1")
        self.http = http

    async def render(
        self, messages: list[dict[str, Any]], tools: Any = None, thinking: bool = True
    ) -> str:
        """The prompt text: ``/tokenize`` the chat, ``/detokenize`` the ids."""
        body: dict[str, Any] = {"model": "large", "messages": messages}
        if tools:
            body["tools"] = tools
        if not thinking:
            body["chat_template_kwargs"] = {"enable_thinking": False}
        ids = (await self.http.post(f"{self.root}/tokenize", json=body)).json()["tokens"]
        detokenized = await self.http.post(
            f"{self.root}/detokenize", json={"model": "large", "tokens": ids}
        )
        return str(detokenized.json()["prompt"])

    async def stream(self, prompt: str, model: str = "large", **fields: Any) -> dict[str, Any]:
        """A streamed completion's text, finish reason, stop reason and usage."""
        body = {"model": model, "prompt": prompt, "max_tokens": 2000, "stream": True, **fields}
        out: dict[str, Any] = {"text": ""}
        url = f"{self.root}/v1/completions"
        async with self.http.stream("POST", url, json=body) as response:
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line.removeprefix("data: "))
                for choice in chunk["choices"]:
                    out["text"] += choice["text"]
                    out["finish"] = choice["finish_reason"] or out.get("finish")
                    out["stop_reason"] = choice["stop_reason"]
                out["usage"] = chunk["usage"] or out.get("usage")
        return out

    async def ask(
        self, messages: list[dict[str, Any]], tools: Any = None, **fields: Any
    ) -> tuple[str, str]:
        """The reasoning and the answer to a chat, checked to be well formed."""
        text = (await self.stream(await self.render(messages, tools), **fields))["text"]
        assert text.startswith("<think>\n")
        reasoning, closed, answer = text.removeprefix("<think>\n").partition("\n</think>\n\n")
        assert closed and answer
        return reasoning, answer


@pytest.fixture
async def client() -> AsyncIterator[Client]:
    large = ScriptedModel("large", "", respond=capable)
    small = ScriptedModel("small", "", respond=capable)
    async with ScriptedVLLM(large, small) as server, httpx.AsyncClient() as http:
        yield Client(server, http)


def test_render_chat_matches_the_qwen3_template_with_tools() -> None:
    messages = [
        user("Weather in Paris?"),
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [call("get_weather", {"city": "Paris"})],
        },
        {"role": "tool", "tool_call_id": "abc123", "content": "sunny"},
    ]
    assert render_chat(messages, tools=[WEATHER]) == (
        "<|im_start|>system\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
        '{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city", '
        '"parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}\n'
        "</tools>\n\nFor each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
        "</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_render_chat_system_text_parts_reasoning_and_grouped_tool_responses() -> None:
    """Expected texts from vLLM 0.32's message handling and the real Qwen3 template."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Weather in"},
                {"type": "text", "text": "Paris and Rome?"},
            ],
        },
        {
            "role": "assistant",
            "content": "Let me look.",
            "reasoning": "Two cities.",  # kept: after the last user query
            "tool_calls": [
                call("get_weather", {"city": "Paris"}, "a"),
                call("get_weather", {"city": "Rome"}, "b"),
            ],
        },
        {"role": "tool", "tool_call_id": "a", "content": "sunny"},
        {"role": "tool", "tool_call_id": "b", "content": [{"type": "text", "text": "rainy"}]},
    ]
    rendered = render_chat(messages, tools=[WEATHER])
    assert rendered.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n\nYou may call")
    assert rendered.endswith(
        "<|im_start|>user\nWeather in\nParis and Rome?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nTwo cities.\n</think>\n\nLet me look.\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n"
        "<tool_response>\nrainy\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    earlier = [
        user("q1"),
        {"role": "assistant", "content": "<think>\nold\n</think>\n\na1"},
        user("q2"),
    ]
    assert render_chat(earlier) == (  # reasoning of an earlier turn is dropped
        "<|im_start|>user\nq1<|im_end|>\n<|im_start|>assistant\na1<|im_end|>\n"
        "<|im_start|>user\nq2<|im_end|>\n<|im_start|>assistant\n"
    )


def test_the_schema_checker_rejects_what_does_not_conform() -> None:
    good = {
        "kind": "order",
        "items": [{"name": "ab", "size": "small", "count": 1}],
        "express": True,
        "price": 1,
    }
    assert conforms(good, ORDER)
    assert not conforms({**good, "kind": "other"}, ORDER)
    assert not conforms({**good, "items": []}, ORDER)
    assert not conforms({**good, "items": [{"name": "ab", "size": "huge", "count": 1}]}, ORDER)
    assert not conforms({**good, "price": 0}, ORDER)
    assert not conforms({k: v for k, v in good.items() if k != "express"}, ORDER)


async def test_a_tool_call_answer_after_reasoning_with_the_cue_words(client: Client) -> None:
    question = user("What is the value of magic_function(3)? Use the tool.")
    reasoning, answer = await client.ask([question], [MAGIC])
    sentences = reasoning.split(". ")
    assert 2 <= len(sentences) <= 4
    assert any(s.startswith("Now ") for s in sentences)
    assert any(s.startswith("Therefore, ") for s in sentences)
    parsed = parse_answer(answer)
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [("magic_function", {"input": 3})]
    assert parsed.content == "" and not parsed.invalid_tool_calls


@pytest.mark.parametrize(
    ("question", "tools", "calls"),
    [
        (
            "What is the value of magic_function_no_args()? Use the tool.",
            [NO_ARGS],
            [("magic_function_no_args", {})],
        ),
        (
            "What is the weather in San Francisco, CA?",
            [WEATHER],
            [("get_weather", {"city": "San Francisco, CA"})],
        ),
        (
            "Use magic_function on 5 and get_weather for 'Paris'.",
            [MAGIC, WEATHER],
            [("magic_function", {"input": 5}), ("get_weather", {"city": "Paris"})],
        ),
        (
            "Create a customer named '你好啊集团' (Hello Group) - a Chinese technology company",
            [CUSTOMER],
            [
                (
                    "unicode_customer",
                    {
                        "customer_name": "你好啊集团",
                        "description": "Create a customer named '你好啊集团' (Hello Group) - a Chinese technology company",
                    },
                )
            ],
        ),
    ],
)
async def test_tool_calls_fill_arguments_from_the_question(
    client: Client,
    question: str,
    tools: list[dict[str, Any]],
    calls: list[tuple[str, dict[str, Any]]],
) -> None:
    _, answer = await client.ask([user(question)], tools)
    assert [(c.name, c.arguments) for c in parse_answer(answer).tool_calls] == calls


async def test_no_tool_call_when_the_question_does_not_call_for_one(client: Client) -> None:
    _, answer = await client.ask([user("Hello!")], [MAGIC, WEATHER])
    assert answer == "Hello! How can I help you today?"


@pytest.mark.parametrize(
    ("messages", "tools", "expected"),
    [
        (
            [user("What is the value of magic_function(3)?")],
            [MAGIC],
            {"name": "magic_function", "arguments": {"input": 3}},
        ),
        ([user("Hello!")], [MAGIC, WEATHER], {"name": "magic_function", "arguments": {"input": 1}}),
        (
            [user("What's the weather in Paris?")],
            [MAGIC, WEATHER],
            {"name": "get_weather", "arguments": {"city": "Paris"}},
        ),
        (
            [  # few-shot history, then the real question
                user("What is 1 + 2"),
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [call("my_adder_tool", {"a": 1, "b": 2})],
                },
                {"role": "tool", "tool_call_id": "abc123", "content": '{"result": 3}'},
                {"role": "assistant", "content": '{"result": 3}'},
                user("What is 3 + 4"),
            ],
            [ADDER],
            {"name": "my_adder_tool", "arguments": {"a": 3, "b": 4}},
        ),
    ],
)
async def test_forced_tool_choice_gives_the_matching_call_as_json(
    client: Client,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]],
    expected: dict[str, Any],
) -> None:
    fields = forced(*tools)
    _, answer = await client.ask(messages, tools, **fields)
    assert json.loads(answer) == expected
    assert conforms(json.loads(answer), fields["structured_outputs"]["json"])


@pytest.mark.parametrize(
    ("question", "schema", "check"),
    [
        (
            "Tell me a joke about cats.",
            JOKE,
            lambda v: set(v) == {"setup", "punchline"} and "cats" in v["setup"],
        ),
        (
            "Give me the setup to a joke about cats, no punchline.",
            JOKE,
            lambda v: v["punchline"] is None,
        ),
        (
            "Order 2 large boxes, express.",
            ORDER,
            lambda v: v["items"][0]["count"] == 2 and v["items"][0]["size"] == "large",
        ),
        (
            "Tell me a joke about cats.",
            forced({"function": {"name": "Joke", "parameters": JOKE}})["structured_outputs"][
                "json"
            ],
            lambda v: v["name"] == "Joke" and set(v["arguments"]) == {"setup", "punchline"},
        ),
    ],
)
async def test_structured_output_is_an_instance_of_the_schema(
    client: Client, question: str, schema: dict[str, Any], check: Any
) -> None:
    _, answer = await client.ask([user(question)], structured_outputs={"json": schema})
    value = json.loads(answer)
    assert conforms(value, schema), value
    assert check(value), value


async def test_json_mode_answers_with_the_keys_the_question_quotes(client: Client) -> None:
    question = (
        "Tell me a joke about cats. Return the result as a JSON with 'setup' and "
        "'punchline' keys. Return nothing other than JSON."
    )
    _, answer = await client.ask([user(question)], structured_outputs={"json_object": True})
    value = json.loads(answer)
    assert set(value) == {"setup", "punchline"} and all(
        isinstance(v, str) and v for v in value.values()
    )


TOTAL = {"type": "object", "properties": {"total": {"type": "integer"}}, "required": ["total"]}
ADDED = [
    user("What is 1 + 2"),
    {"role": "assistant", "content": "", "tool_calls": [call("my_adder_tool", {"a": 1, "b": 2})]},
    {"role": "tool", "tool_call_id": "abc123", "content": "3"},
]


async def test_calls_or_json_gives_the_due_tool_call_then_the_schema_filled_from_results(
    client: Client,
) -> None:
    """The relay's grammar for tools offered with a response format: a call while one is due,
    after the results the schema's JSON, taking values from the results first."""
    fields = {"structured_outputs": calls_or_json([ADDER], TOTAL)}
    _, first = await client.ask(ADDED[:1], [ADDER], **fields)
    parsed = parse_answer(first)
    assert parsed.content == ""
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [
        ("my_adder_tool", {"a": 1, "b": 2})
    ]
    _, final = await client.ask(ADDED, [ADDER], **fields)
    assert json.loads(final) == {"total": 3}


async def test_calls_or_json_answers_in_the_schema_when_no_tool_is_called_for(
    client: Client,
) -> None:
    fields = {"structured_outputs": calls_or_json([WEATHER, ADDER], JOKE)}
    _, answer = await client.ask([user("Tell me a joke about cats.")], [WEATHER, ADDER], **fields)
    value = json.loads(answer)
    assert conforms(value, JOKE) and "cats" in value["setup"]


async def test_a_forced_call_after_the_results_calls_the_tool_not_yet_called(
    client: Client,
) -> None:
    """LangChain's ToolStrategy: the response schema is a tool and every turn must call one;
    once the adder has answered, the call is the schema's, filled from its result."""
    schema_tool = {"type": "function", "function": {"name": "Total", "parameters": TOTAL}}
    fields = forced(ADDER, schema_tool)
    _, first = await client.ask(ADDED[:1], [ADDER, schema_tool], **fields)
    assert json.loads(first) == {"name": "my_adder_tool", "arguments": {"a": 1, "b": 2}}
    _, final = await client.ask(ADDED, [ADDER, schema_tool], **fields)
    assert json.loads(final) == {"name": "Total", "arguments": {"total": 3}}


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ('{"result": 3}', "The result is 3."),
        ("22", "The result is 22."),
        ("It's sunny.", "my_adder_tool returned: It's sunny."),
        (
            "Error: Missing required argument 'b'.",
            "my_adder_tool reported an error: Missing required argument 'b'.",
        ),
    ],
)
async def test_after_tool_responses_the_answer_states_the_results(
    client: Client, response: str, expected: str
) -> None:
    messages = [
        user("What is 1 + 2"),
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [call("my_adder_tool", {"a": 1, "b": 2})],
        },
        {"role": "tool", "tool_call_id": "abc123", "content": response},
    ]
    reasoning, answer = await client.ask(messages, [ADDER])
    assert answer == expected
    assert "Now " in reasoning and "Therefore, " in reasoning


@pytest.mark.parametrize(
    ("messages", "expected"),
    [
        ([user("What is 2 + 2?")], "The answer is 4."),
        ([user("what's 1 + 1")], "The answer is 2."),
        ([user("Hello")], "Hello! How can I help you today?"),
        (
            [user("hello"), {"role": "assistant", "content": "hello"}, user("how are you")],
            "I'm doing well",
        ),
        (
            [
                user("My name is Bob."),
                {"role": "assistant", "content": "Hi Bob!"},
                user("What is my name?"),
            ],
            "Your name is Bob.",
        ),
        (
            [user("Write me 2 haikus. Only include the haikus.")],
            'Here is a short answer to "Write me 2 haikus"',
        ),
        ([user("Tell me about the Moon.")], "Here is a short answer about the Moon."),
    ],
)
async def test_plain_answers(client: Client, messages: list[dict[str, Any]], expected: str) -> None:
    _, answer = await client.ask(messages)
    assert answer.startswith(expected)


async def test_every_continuation_gives_exactly_the_rest(client: Client) -> None:
    prompt = await client.render(
        [user("What is the value of magic_function(3)? Use the tool.")], [MAGIC]
    )
    full = (await client.stream(prompt))["text"]
    for cut in range(0, len(full), 5):
        model = "small" if cut % 2 else "large"
        assert (await client.stream(prompt + full[:cut], model))["text"] == full[cut:]


async def test_a_reasoning_closed_early_is_followed_by_the_answer(client: Client) -> None:
    prompt = await client.render([user("What is 2 + 2?")])
    rest = await client.stream(prompt + "<think>\nThe user writes\n</think>")
    assert rest["text"] == "\n\nThe answer is 4."


async def test_thinking_disabled_gives_the_answer_alone(client: Client) -> None:
    prompt = await client.render([user("What is 2 + 2?")], thinking=False)
    assert (await client.stream(prompt))["text"] == "The answer is 4."


async def test_answer_requests_honour_stop_strings(client: Client) -> None:
    prompt = await client.render([user("hi")])
    full = (await client.stream(prompt))["text"]
    reasoning = full[: full.index("</think>\n\n") + len("</think>\n\n")]
    out = await client.stream(prompt + reasoning, "small", stop=["you"])
    assert (out["text"], out["finish"], out["stop_reason"]) == (
        "Hello! How can I help ",
        "stop",
        "you",
    )


async def test_a_non_streamed_completion_has_the_same_text_and_usage(client: Client) -> None:
    prompt = await client.render([user("What is 2 + 2?")])
    streamed = await client.stream(prompt)
    body = {"model": "large", "prompt": prompt, "max_tokens": 2000}
    data = (await client.http.post(f"{client.root}/v1/completions", json=body)).json()
    assert data["object"] == "text_completion" and data["model"] == "large"
    assert data["choices"][0]["text"] == streamed["text"]
    assert data["choices"][0]["finish_reason"] == "stop"
    assert data["usage"]["completion_tokens"] == len(tokenize(streamed["text"]))
    assert data["usage"]["prompt_tokens"] == len(tokenize(prompt))
    body = {"model": "large", "prompt": prompt, "max_tokens": 3, "stream": False}
    short = (await client.http.post(f"{client.root}/v1/completions", json=body)).json()
    assert short["choices"][0]["text"] == "".join(tokenize(streamed["text"])[:3])
    assert short["choices"][0]["finish_reason"] == "length"


async def relay_generate(messages: list[dict[str, Any]], tools: Any, **policy: Any) -> Any:
    """A relay generation over the capable model, with the cues of its reasoning."""
    large = ScriptedModel("large", "", respond=capable)
    small = ScriptedModel("small", "", respond=capable)
    async with ScriptedVLLM(large, small) as server:
        config = capable_relay_config(server.base_url, policy=SwitchPolicy(**policy))
        async with RelaySwitcher(config) as relay:
            return await relay.generate(messages, tools=tools)


async def test_the_relay_switches_models_on_both_reasoning_cues() -> None:
    messages = [user("What is the weather in San Francisco, CA?")]
    result = await relay_generate(messages, [WEATHER], cooldown_tokens=0)
    assert result.text == capable(render_chat(messages, tools=[WEATHER]), {})
    assert [(s.model, s.ended_by, s.cue) for s in result.segments] == [
        ("large", "cue", "Now"),
        ("small", "sentence_end", None),
        ("large", "cue", "Therefore,"),
        ("small", "sentence_end", None),
        ("large", "end_of_reasoning", None),
        ("small", "stop", None),
    ]
    calls = parse_answer(result.answer).tool_calls
    assert [(c.name, c.arguments) for c in calls] == [
        ("get_weather", {"city": "San Francisco, CA"})
    ]


async def test_the_relay_sees_the_reasoning_end_right_after_a_small_segment() -> None:
    messages = [user("What is the weather in San Francisco, CA?")]
    result = await relay_generate(messages, [WEATHER])  # the default cool-down, 5 tokens
    assert result.text == capable(render_chat(messages, tools=[WEATHER]), {})


# --- ReAct prompts (LlamaIndex's ReActAgent) ---------------------------------------------------


def get_population(city: str) -> int:
    """The number of people living in a city."""
    return {"Paris": 2102650}.get(city, 1000)


def multiply(a: float, b: float) -> float:
    """Multiply two numbers."""
    return a * b


REACT_TOOLS = [FunctionTool.from_defaults(get_population), FunctionTool.from_defaults(multiply)]
TWO_STEPS = "Use get_population for Paris, then multiply it by 3."


def react_step(
    question: str,
    reasoning: list[BaseReasoningStep],
    formatter: ReActChatFormatter | None = None,
    history: list[ChatMessage] | None = None,
    thinking: bool = True,
) -> BaseReasoningStep:
    """The capable model's next ReAct step, from the chat ReActAgent sends (its formatter's
    messages as the adapter passes them on), parsed like ReActAgent parses it."""
    formatter = formatter or ReActChatFormatter.from_defaults()
    chat = [*(history or []), ChatMessage(role=MessageRole.USER, content=question)]
    messages = formatter.format(REACT_TOOLS, chat, current_reasoning=reasoning)
    prompt = render_chat([{"role": m.role.value, "content": m.content} for m in messages], thinking)
    output = capable(prompt, {})
    if thinking:
        assert output.startswith("<think>\n")
        reasoning_text, closed, output = output.partition("\n</think>\n\n")
        assert closed and output
        assert not any(word in reasoning_text for word in ("Thought:", "Action:", "Answer:"))
    return ReActOutputParser().parse(output)


def observe(step: BaseReasoningStep) -> ObservationReasoningStep:
    """Run the step's tool and wrap its output as ReActAgent does."""
    assert isinstance(step, ActionReasoningStep)
    tool = next(t for t in REACT_TOOLS if t.metadata.name == step.action)
    return ObservationReasoningStep(observation=str(tool.call(**step.action_input).content))


def test_react_first_step_calls_the_first_named_tool() -> None:
    step = react_step(TWO_STEPS, [])
    assert isinstance(step, ActionReasoningStep)
    assert (step.action, step.action_input) == ("get_population", {"city": "Paris"})
    assert step.thought.startswith("The current language of the user is: English.")


def test_react_second_step_feeds_the_observation_to_the_next_tool() -> None:
    first = react_step(TWO_STEPS, [])
    observed = observe(first)
    assert observed.observation == "2102650"
    step = react_step(TWO_STEPS, [first, observed])
    assert isinstance(step, ActionReasoningStep)
    assert (step.action, step.action_input) == ("multiply", {"a": 2102650, "b": 3})


def test_react_answer_after_all_observations_states_the_results() -> None:
    reasoning: list[BaseReasoningStep] = []
    for _ in range(2):
        step = react_step(TWO_STEPS, reasoning)
        reasoning += [step, observe(step)]
    observed = [s.observation for s in reasoning if isinstance(s, ObservationReasoningStep)]
    assert observed == ["2102650", "6307950"]
    final = react_step(TWO_STEPS, reasoning)
    assert isinstance(final, ResponseReasoningStep) and final.is_done
    assert final.thought.startswith("I can answer without using any more tools.")
    assert final.response == "get_population returned 2102650. The result is 6307950."


@pytest.mark.parametrize(
    ("formatter", "thinking"),
    [
        (ReActChatFormatter.from_defaults(observation_role=MessageRole.TOOL), True),
        (ReActChatFormatter.from_defaults(context="You are a statistician."), True),
        (ReActChatFormatter.from_defaults(), False),
    ],
    ids=["observations-as-tool-messages", "agent-system-prompt", "thinking-off"],
)
def test_react_two_step_task_in_other_settings(
    formatter: ReActChatFormatter, thinking: bool
) -> None:
    reasoning: list[BaseReasoningStep] = []
    step = react_step(TWO_STEPS, reasoning, formatter, thinking=thinking)
    while isinstance(step, ActionReasoningStep) and len(reasoning) < 6:
        reasoning += [step, observe(step)]
        step = react_step(TWO_STEPS, reasoning, formatter, thinking=thinking)
    assert [s.action for s in reasoning if isinstance(s, ActionReasoningStep)] == [
        "get_population",
        "multiply",
    ]
    assert isinstance(step, ResponseReasoningStep) and "6307950" in step.response


def test_react_answers_without_a_tool_when_none_is_called_for() -> None:
    step = react_step("Hello!", [])
    assert isinstance(step, ResponseReasoningStep)
    assert step.response == "Hello! How can I help you today?"


def test_react_a_later_question_starts_over_after_the_first_scratchpad() -> None:
    """After a run, ReActAgent keeps its whole scratchpad as one assistant message."""
    reasoning: list[BaseReasoningStep] = []
    step = react_step(TWO_STEPS, reasoning)
    while isinstance(step, ActionReasoningStep):
        reasoning += [step, observe(step)]
        step = react_step(TWO_STEPS, reasoning)
    scratchpad = "\n".join(s.get_content() for s in [*reasoning, step])
    history = [
        ChatMessage(role=MessageRole.USER, content=TWO_STEPS),
        ChatMessage(role=MessageRole.ASSISTANT, content=scratchpad),
    ]
    again = react_step("Now use get_population for Rome.", [], history=history)
    assert isinstance(again, ActionReasoningStep)
    assert (again.action, again.action_input) == ("get_population", {"city": "Rome"})


def test_a_react_header_merged_into_the_first_user_turn_is_read_too() -> None:
    header = ReActChatFormatter.from_defaults().format(REACT_TOOLS, [])[0].content or ""
    prompt = render_chat([user(header + "\n" + TWO_STEPS)])
    step = ReActOutputParser().parse(capable(prompt, {}).partition("</think>\n\n")[2])
    assert isinstance(step, ActionReasoningStep)
    assert (step.action, step.action_input) == ("get_population", {"city": "Paris"})


def test_a_chat_about_the_react_format_is_not_a_react_chat() -> None:
    question = "What does Action Input: mean in a ReAct prompt? Answer: briefly."
    _, _, answer = capable(render_chat([user(question)]), {}).partition("</think>\n\n")
    assert not answer.startswith("Thought:")
