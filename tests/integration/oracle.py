"""The differential oracle's matrix and its reference calls: what users pass, generated, and
what the model's own chat endpoint answers to it.

A relay whose two roles are one model and whose reasoning is closed before it starts
(``enable_thinking=false``) makes one request: the answer. It is then the model's own chat
endpoint, so ``ChatOpenAI``, LlamaIndex's ``OpenAILike`` and vLLM's ``/v1/chat/completions`` on
the same server at temperature 0 (or with a seed) give the expected answer: text, finish
reason, usage, tool calls, parsed output. Where the relay differs on purpose, :data:`ON_PURPOSE`
says so, in one place.

The matrix is generated (:func:`matrix`): every value of each dimension appears, and the
combinations are drawn from a fixed seed, so a run is repeatable and its size is printed in
pytest's header (``oracle matrix: N cases``).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

NO_THINKING = {"enable_thinking": False}
WORDS = r"[a-z]{1,7}( [a-z]{1,7}){8,40}\."
"""A grammar for answers with spaces (a random model's own text has few), so that a stop
string after a space shows whether the space before it is kept."""

MAX_STOPS = 8
"""The most stop strings a case has (``relaygen serve --max-stop-strings 8`` takes them)."""

ON_PURPOSE: Mapping[str, str] = {
    "reasoning": "the relay returns the reasoning apart (additional_kwargs "
    '"reasoning_content", a ThinkingBlock, the "reasoning" field); here it is empty',
    "relay": 'the relay\'s own statistics (response_metadata / raw / the extension field "relay")',
    "model_name": "the relay names both models, large first (large+small)",
    "output_token_details": 'the relay counts reasoning tokens ({"reasoning": 0} here)',
    "sampling": "the relay's defaults are the paper's (top_p 0.95, top_k 20); ChatOpenAI and "
    "OpenAILike send none, so the server's apply: the oracle's relay sets top_p=1, top_k=None",
    "cut JSON": "an answer to a JSON schema cut by max_tokens raises: ChatOpenAI "
    "openai.LengthFinishReasonError, the relay LangChain's OutputParserException",
    "llama_index raw": "OpenAILike's raw is the ChatCompletion; the relay's is a dict (usage, "
    "the relay's result), and the finish reason is in additional_kwargs",
    "llama_index stream usage": "OpenAILike's streamed responses carry no token counts; the "
    "relay's last one does",
    "forced tool call": "vLLM's chat endpoint constrains a forced call's arguments alone (a "
    "named tool, or any with tool_choice required); the "
    "relay constrains the whole <tool_call> block as the model's template writes it, so the "
    "model writes the arguments after another prefix: same tool, both valid, not the same text",
}
"""What the relay does differently from the model's own endpoint on purpose, and why."""

LIMITS: Mapping[str, str] = {
    "usage past a stream-side stop": "a stop past a stock server's cap is found in the stream "
    "and the relay closes the request there; its completion-token count is the server's count "
    "at the chunk that held the stop, which may include tokens the server wrote past the stop "
    "in that chunk (vLLM merges tokens into one chunk when the reader lags): not fewer than "
    "vLLM's own count, and exact only when each chunk is one token",
}
"""Where the relay cannot be exact, and why (the oracle checks the bound instead)."""

ServerName = Literal["tuned", "stock"]
Shape = Literal["user", "system", "named", "blocks", "history"]
Tools = Literal["none", "auto", "named", "required", "off"]
"""Tools given, and the tool choice: none given; "auto"; a call to the named tool; a call to
any ("required"); no call ("off": ``tool_choice="none"``)."""
Format = Literal["none", "json_schema", "json_object", "words", "model"]
"""The answer's format: free; a JSON schema or object (``response_format``); the words grammar;
a pydantic model, parsed (LangChain's ``with_structured_output``, OpenAI's ``parse``)."""

SHAPES: dict[Shape, list[dict[str, Any]]] = {
    "user": [{"role": "user", "content": "What is the capital of France?"}],
    "system": [
        {"role": "system", "content": "You answer in one short sentence."},
        {"role": "user", "content": "Name a large museum in Paris."},
    ],
    "named": [{"role": "user", "name": "ada", "content": "Which river runs through Paris?"}],
    "blocks": [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Describe the Louvre "},
                {"type": "text", "text": "in a few words."},
            ],
        }
    ],
    "history": [
        {"role": "user", "content": "What is the weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 degrees"},
        {"role": "user", "content": "And should I take an umbrella?"},
    ],
}

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


class CityAnswer(BaseModel):
    """The ``"model"`` format's answer, parsed by each surface."""

    model_config = ConfigDict(extra="forbid")

    city: str
    sunny: bool


ANSWER_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "sunny": {"type": "boolean"}},
    "required": ["city", "sunny"],
    "additionalProperties": False,
}


@dataclass(frozen=True)
class Case:
    """One thing a user passes, on one server."""

    server: ServerName
    shape: Shape
    stops: int  # how many stop strings: decoys, then one the model writes (past the cap at 5+)
    max_tokens: int
    tools: Tools = "none"
    format: Format = "none"
    seed: int | None = None  # None: temperature 0; else temperature 1 with this seed
    stream: bool = False

    @property
    def id(self) -> str:
        parts = [self.server, self.shape, f"stop{self.stops}", f"max{self.max_tokens}"]
        parts += [f"tools-{self.tools}"] if self.tools != "none" else []
        parts += [self.format] if self.format != "none" else []
        parts += [f"seed{self.seed}"] if self.seed is not None else []
        parts += ["stream"] if self.stream else []
        return "-".join(parts)

    @property
    def temperature(self) -> float:
        return 0.0 if self.seed is None else 1.0

    def unstopped(self) -> Case:
        """The same case without stops, streamed or not alike: where its stop is taken from."""
        return replace(self, stops=0, stream=False)

    def extra_body(self) -> dict[str, Any]:
        """vLLM fields both sides send (through each client's own extra_body)."""
        body: dict[str, Any] = {"chat_template_kwargs": NO_THINKING}
        if self.format == "words":
            body["structured_outputs"] = {"regex": WORDS}
        return body

    def response_format(self) -> dict[str, Any] | None:
        if self.format == "json_schema":
            return {
                "type": "json_schema",
                "json_schema": {"name": "answer", "schema": ANSWER_SCHEMA, "strict": True},
            }
        if self.format == "json_object":
            return {"type": "json_object"}
        return None

    def tool_choice(self) -> Any:
        if self.tools == "named":
            return {"type": "function", "function": {"name": "get_weather"}}
        return {"auto": "auto", "required": "required", "off": "none"}.get(self.tools)

    @property
    def forced_call(self) -> bool:
        """Whether the answer must be a tool call (ON_PURPOSE["forced tool call"])."""
        return self.tools in ("named", "required")


def stop_list(case: Case, unstopped_text: str) -> list[str]:
    """`case.stops` stop strings: decoys the model never writes, then (last, so that on a
    server that takes 4 it is the one past the cap) a piece of the text the model writes
    without stops, taken just after a space where there is one."""
    if case.stops == 0:
        return []
    decoys = [f"zq{n}x" for n in range(case.stops - 1)]
    return [*decoys, _piece_of(unstopped_text) or "zqlast"]


def _piece_of(text: str) -> str | None:
    """Four characters from the second third of `text`, starting after a space if one is there."""
    start, end = len(text) // 3, 2 * len(text) // 3
    if end - start < 4:
        return None
    for index in range(start, end - 4):
        if text[index - 1] == " " and not text[index].isspace():
            return text[index : index + 4]
    return text[start : start + 4]


@dataclass
class Matrix:
    cases: list[Case] = field(default_factory=list)

    def add(self, case: Case) -> None:
        if case.max_tokens < 8 and case.format in ("json_schema", "json_object", "model"):
            return  # a JSON answer cut at a few tokens is a parse error on both sides
        if case.format == "model" and case.stream:
            return  # a parsed answer is compared whole (its stream is partial parses)
        if case.tools != "none" and (case.server != "tuned" or case.format != "none"):
            return  # tools need a server with a tool parser (the tuned one)
        if case.server == "stock" and case.stops > 4 and case.format.startswith("json"):
            return  # the reference is then a tuned server, whose JSON has no free whitespace
        if case not in self.cases:
            self.cases.append(case)

    def __iter__(self) -> Iterator[Case]:
        return iter(self.cases)

    def __len__(self) -> int:
        return len(self.cases)


def matrix(size: int = 48, seed: int = 0) -> Matrix:
    """Every value of every dimension at least once (with the others at their plain values),
    the stop counts 0-8 on both servers, then `size` combinations drawn with `seed`."""
    cases = Matrix()
    plain = Case(server="tuned", shape="user", stops=0, max_tokens=48)
    servers: tuple[ServerName, ...] = ("tuned", "stock")
    for server, stops in itertools.product(servers, range(MAX_STOPS + 1)):
        cases.add(replace(plain, server=server, stops=stops, format="words"))
    for shape in SHAPES:
        cases.add(replace(plain, shape=shape))
    for max_tokens in (1, 2, 7, 200):
        cases.add(replace(plain, max_tokens=max_tokens, stops=5))
    for tools in ("auto", "named", "required", "off"):
        cases.add(replace(plain, tools=tools))
    for answer_format in ("json_schema", "json_object", "words", "model"):
        cases.add(replace(plain, format=answer_format))
    cases.add(replace(plain, seed=7))
    draw = random.Random(seed)
    for _ in range(size):
        cases.add(
            Case(
                server=draw.choice(("tuned", "stock")),
                shape=draw.choice(list(SHAPES)),
                stops=draw.randint(0, MAX_STOPS),
                max_tokens=draw.choice((1, 5, 24, 64)),
                tools=draw.choice(("none", "none", "auto", "named", "required", "off")),
                format=draw.choice(
                    ("none", "json_schema", "json_object", "words", "words", "model")
                ),
                seed=draw.choice((None, None, 11)),
            )
        )
    for case in list(cases):
        cases.add(replace(case, stream=True))
    return cases
