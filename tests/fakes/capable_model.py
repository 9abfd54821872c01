"""A scripted model that answers like a capable reasoning model, for the frameworks' standard
integration tests on the scripted server (the real tiny test models write random text)::

    large = ScriptedModel("large", "", respond=capable)
    small = ScriptedModel("small", "", respond=capable)

:func:`capable` reads the chat back out of the rendered Qwen3 prompt and continues a
deterministic output: ``<think>\\n`` + four short sentences of reasoning, with "Now" and
"Therefore," as sentence starters so that a relay with those cues switches models, +
``\\n</think>\\n\\n`` + the answer (no think block when thinking is disabled). The reasoning
depends on the chat alone, the answer on the chat and the request's ``structured_outputs``,
so every request of a generation, whichever model serves it, continues the same text.

The answer, first rule that applies:

- ``structured_outputs.json``: a tool-call schema (``name`` const/enum + ``arguments``, or an
  ``anyOf``/``oneOf`` of them) gets ``{"name": ..., "arguments": {...}}``: before any tool
  results, for the tool that best matches the question; after them, for the next tool of a
  sequence (below), else for the best match among the tools not yet called since the question
  (LangChain's ``ToolStrategy``: its response-schema tool), filled from the results. Any other
  schema gets an instance of it, filled from the tool results since the question (latest
  first), then from the question.
- ``structured_outputs.json_object``: an object with the keys the question quotes.
- ``structured_outputs.structural_tag`` that is an ``or`` of a ``json_schema`` and tags (the
  relay's grammar for tools offered with a response format): the tool calls that are due, as
  the next two rules say, while any are; else an instance of that schema, filled like a
  ``json`` one. Other structural tags (strict tools' ``triggered_tags``) change nothing: the
  answers below already have their shape.
- tools, the user's turn, and the question calls for a tool (names one, there is only one, or
  the text says to use a tool): ``<tool_call>`` blocks, arguments filled from the question.
  A question that names its tools in sequence ("use a, then b") gets one call per turn.
- the last turn holds tool responses: the next tool of such a sequence, its numbers taken from
  the results first; else a sentence stating the results.
- a retrieval-augmented question (LlamaIndex's QA template): the context sentence that shares
  the most words with the query.
- otherwise a plain answer: a remembered name, arithmetic, a greeting, or a restatement.

A ReAct chat (LlamaIndex's ``ReActAgent``: its system prompt, or first user turn, holds the
ReAct header with "## Output Format" and the "Thought:", "Action:", "Action Input:",
"Observation:" and "Answer:" lines) is read with the tools listed in that header (``> Tool
Name:``, ``Tool Description:``, ``Tool Args:``), its "Observation: ..." turns (user turns, or
tool responses) as tool turns and the "Action:" lines of assistant turns as calls. Unless
structured outputs apply, its answer is in the ReAct format: ``Thought: ...`` + ``Action:
<tool>`` + ``Action Input: {json}`` for the next tool the question names that has not been
observed since it was asked (one per turn, numbers taken from the last observation first), or,
when none is left (or none was called for), ``Thought: I can answer without using any more
tools. ...`` + ``Answer:`` and a sentence stating the observed results (or the plain answer).

Values come from the question: numbers in order for numeric parameters, quoted then
capitalised phrases for strings (descriptive fields get the question's subject), ``true`` for
booleans, a short joke for ``setup``/``punchline``. A capitalised word that starts a
sentence, a line or an XML element's text (LlamaIndex wraps a chat in ``<message>`` elements
when it asks for an agent's structured output) is not taken for a name.
"""

from __future__ import annotations

import ast
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from relay_integrations.relay import EndpointConfig, RelayConfig, SwitchPolicy
from relay_integrations.testing.qwen3_template import (
    ASSISTANT,
    THINKING_OFF,
    TOOLS_INTRO,
    TOOLS_OUTRO,
    to_json,
)
from relay_integrations.testing.scripted_vllm import ScriptedModel, ScriptedVLLM

_TURN = re.compile(r"<\|im_start\|>(system|user|assistant)\n(.*?)<\|im_end\|>\n", re.S)
_TOOL_CALL = re.compile(r"<tool_call>\n(.*?)\n</tool_call>", re.S)
_TOOL_RESPONSE = re.compile(r"<tool_response>\n(.*?)\n</tool_response>", re.S)
_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?![\w.]*\w)")
_QUOTED = re.compile(r"(?<!\w)['\"“‘]([^'\"“”‘’\n]+?)['\"”’](?!\w)")
_CAPITALISED = re.compile(r"(?<!\w)[A-Z][\w'-]*(?:(?: |, )[A-Z][\w'-]*)*")
_DECLINED = re.compile(r"\b(?:no|without(?: an?| the)?) ([a-z_]+)", re.I)
_USE_TOOL = re.compile(
    r"\b(?:use|using|call|calling|invoke)\b[^.?!]*\b(?:tools?|functions?)\b", re.I
)
_ABOUT = re.compile(r"\babout ([^.?!,;]+)", re.I)
_ARITHMETIC = re.compile(
    r"(-?\d+(?:\.\d+)?)\s*(\+|-|\*|/|x|×|÷|plus|minus|times|multiplied by|divided by)\s*"
    r"(-?\d+(?:\.\d+)?)",
    re.I,
)
_NAME_GIVEN = re.compile(
    r"\b(?i:my name is|name is|call me|i am|i'm|remember(?: the| this| my)? name:?)\s+"
    r"['\"]?([A-Z][\w'-]*)"
)
GREETINGS = frozenset({"hello", "hi", "hey", "hello there", "hi there", "hey there", "greetings"})
GREETING = "Hello! How can I help you today?"
_DESCRIPTIVE = frozenset(
    {"description", "query", "text", "content", "message", "question", "topic", "summary"}
    | {"reason", "answer", "prompt", "explanation", "comment", "note", "request", "details"}
)
_FORMATS = {
    "date": "2024-01-01",
    "date-time": "2024-01-01T00:00:00Z",
    "time": "00:00:00",
    "email": "user@example.com",
    "uri": "https://example.com",
}


@dataclass
class Turn:
    """One turn of the rendered chat. ``role`` "tool" is a user turn of tool responses."""

    role: str
    text: str = ""
    calls: list[dict[str, Any]] = field(default_factory=list)
    responses: list[str] = field(default_factory=list)


@dataclass
class Chat:
    """What the rendered prompt says: turns, tools (their ``function`` objects), thinking."""

    turns: list[Turn]
    tools: list[dict[str, Any]]
    thinking: bool = True
    react: bool = False  # the chat holds a ReAct prompt (see the module doc)

    @property
    def last(self) -> Turn:
        return self.turns[-1] if self.turns else Turn("user")

    @property
    def question(self) -> str:
        """The last user message (not tool responses)."""
        return next((t.text for t in reversed(self.turns) if t.role == "user"), "")

    def tool(self, name: str) -> dict[str, Any]:
        return next((t for t in self.tools if t.get("name") == name), {"name": name})


def capable(prompt: str, body: dict[str, Any]) -> str:
    """The rest of the capable model's output for the chat and generation in `prompt`."""
    chat, generated = parse_prompt(prompt)
    return _rest(full_output(chat, body), generated)


def full_output(chat: Chat, body: dict[str, Any]) -> str:
    """The whole output for `chat`: reasoning (if thinking) and the answer."""
    answer = answer_for(chat, body)
    if not chat.thinking:
        return answer
    return f"<think>\n{reasoning_for(chat)}\n</think>\n\n{answer}"


def _rest(full: str, generated: str) -> str:
    """What follows `generated` in `full`; after a reasoning closed early, the answer."""
    if full.startswith(generated):
        return full[len(generated) :]
    _, closed, answer = full.rpartition("</think>")
    if "</think>" in generated:
        written = generated.rpartition("</think>")[2]
        return answer[len(written) :] if answer.startswith(written) else ""
    return "\n</think>" + answer if closed else ""


# --- reading the prompt ---------------------------------------------------------------------


def parse_prompt(prompt: str) -> tuple[Chat, str]:
    """The chat rendered in `prompt`, and the text generated after it so far."""
    head, marker, generated = prompt.rpartition(ASSISTANT)
    if not marker:
        head, generated = prompt, ""
    thinking = not generated.startswith(THINKING_OFF)
    generated = generated if thinking else generated[len(THINKING_OFF) :]
    turns: list[Turn] = []
    tools: list[dict[str, Any]] = []
    for role, content in _TURN.findall(head):
        if role == "system" and TOOLS_INTRO in content:
            content, _, listing = content.partition(TOOLS_INTRO)
            lines = listing.partition(TOOLS_OUTRO)[0].split("\n")
            functions = [json.loads(line).get("function") or {} for line in lines if line]
            tools = [f for f in functions if f.get("name")]
            content = content.removesuffix("\n\n")
            if not content:
                continue
        turns.append(_turn(role, content))
    return _read_react(Chat(turns, tools, thinking)), generated


def _turn(role: str, content: str) -> Turn:
    """A turn from its rendered content: tool responses and tool calls read out."""
    wrapped = content.startswith("<tool_response>") and content.endswith("</tool_response>")
    if role == "user" and wrapped:
        return Turn("tool", responses=_TOOL_RESPONSE.findall(content))
    if role != "assistant":
        return Turn(role, content)
    visible = content.rpartition("</think>")[2]
    calls: list[dict[str, Any]] = []
    for block in _TOOL_CALL.findall(visible):
        try:
            calls.append(json.loads(block))
        except json.JSONDecodeError:
            continue
    return Turn(role, _TOOL_CALL.sub("", visible).strip(), calls)


# --- reasoning ------------------------------------------------------------------------------


def reasoning_for(chat: Chat) -> str:
    """Four short sentences: what was asked, "Now ...", a remark, "Therefore, ..." (chat only).

    The remark keeps "Therefore," more than a relay's cool-down (5 tokens) after the sentence
    the small model writes after "Now", so that both cues switch models.
    """
    if chat.last.role == "tool":
        return (
            "The tool has returned its result. Now I read what it says. "
            "The result answers the question. Therefore, I will report the result."
        )
    asked = f"The user writes: {_snippet(chat.question)}."
    if chat.tools and _wants_tools(chat):
        tools = _requested_tools(chat)
        names = " and ".join(tools)
        fit = "tools fit" if len(tools) > 1 else "tool fits"
        return (
            f"{asked} Now I look at the available tools. The {names} {fit} the question. "
            f"Therefore, I will call {names}."
        )
    return (
        f"{asked} Now I think about the best reply. A direct reply fits best here. "
        "Therefore, I will answer directly."
    )


def _snippet(text: str, limit: int = 60) -> str:
    """The first sentence of `text`, on one line, without closing marks, cut at a word."""
    sentence = _first_sentence(text).replace("<", "").replace(">", "")
    if len(sentence) > limit:
        sentence = sentence[:limit].rsplit(" ", 1)[0].rstrip(" -,;:")
    return sentence or "nothing"


def _first_sentence(text: str) -> str:
    flat = " ".join(text.split())
    return re.split(r"(?<=[.?!])\s+", flat)[0].rstrip(".?!")


# --- the answer -----------------------------------------------------------------------------


def answer_for(chat: Chat, body: dict[str, Any]) -> str:
    """The answer to `chat` under the request's structured outputs (see the module doc)."""
    outputs = body.get("structured_outputs") or {}
    if outputs.get("json") is not None:
        schema = outputs["json"]
        return _json_answer(chat, json.loads(schema) if isinstance(schema, str) else schema)
    if outputs.get("json_object"):
        return _compact(_json_object(chat))
    if outputs.get("choice"):
        return str(_choose(list(outputs["choice"]), chat.question))
    schema = _calls_or_json_schema(outputs.get("structural_tag"))
    if schema is not None:  # tool calls while any are due, else the JSON answer
        return _next_calls(chat) or _compact(Filler(schema, _result_hints(chat)).value(schema))
    if chat.react:
        return react_answer(chat)
    calls = _next_calls(chat)
    if calls:
        return calls
    if chat.last.role == "tool":
        return _tool_results(chat)
    grounded = _from_context(chat.question)
    return grounded if grounded is not None else plain_answer(chat)


def _calls_or_json_schema(structural_tag: Any) -> dict[str, Any] | None:
    """The JSON schema of a structural tag that allows tool-call blocks or that JSON (an
    ``or`` of a ``json_schema`` and tags); None for any other tag (``triggered_tags`` of
    strict tools: the free answer already has the blocks' shape) or none."""
    if not structural_tag:
        return None
    tag = json.loads(structural_tag) if isinstance(structural_tag, str) else structural_tag
    format_ = tag.get("format") or {}
    if format_.get("type") != "or":
        return None
    schemas = [e["json_schema"] for e in format_["elements"] if e.get("type") == "json_schema"]
    return schemas[0] if schemas else None


def _next_calls(chat: Chat) -> str | None:
    """The ``<tool_call>`` blocks due now: the tools the question calls for, before their
    results are in (one per turn for "use a, then b"), or the next of such a sequence."""
    if chat.tools and chat.last.role == "user" and _wants_tools(chat):
        names = _requested_tools(chat)
        if _step_by_step(chat):
            names = names[:1]
        return "\n".join(_hermes_call(chat, name) for name in names)
    if chat.last.role == "tool":
        pending = _pending_tools(chat)
        if pending:  # "use a, then b": b's turn, with a's results among its arguments
            return _hermes_call(chat, pending[0], before=" ".join(chat.last.responses))
    return None


def _result_hints(chat: Chat) -> Hints:
    """Hints for a final answer: the tool results since the question (latest first, one a
    line), then the question."""
    responses = [r for t in chat.turns[_asked(chat) :] if t.role == "tool" for r in t.responses]
    lines = [*reversed(responses), chat.question]
    return Hints.of("\n".join(lines), [t["name"] for t in chat.tools])


_CONTEXT = re.compile(
    r"Context information is below\.\s*-{3,}\s*(?P<context>.*?)\s*-{3,}.*?"
    r"Query:\s*(?P<query>.*?)\s*(?:Answer:|$)",
    re.S,
)


def _from_context(question: str) -> str | None:
    """A retrieval-augmented question (LlamaIndex's QA template): the context sentence that
    shares the most words with the query, as a grounded answer."""
    found = _CONTEXT.search(question)
    if found is None:
        return None
    query_words = set(re.findall(r"\w{3,}", found["query"].lower()))
    pieces = re.split(r"(?<=[.!?])\s+|\n+", found["context"])
    sentences = [p for p in pieces if len(p.split()) >= 4] or pieces  # not "name: x" lines
    best = max(sentences, key=lambda s: len(query_words & set(re.findall(r"\w{3,}", s.lower()))))
    return f"According to the documents: {best.strip()}"


def _step_by_step(chat: Chat) -> bool:
    """The question names its tools in sequence ("use a, then b"): one call per turn."""
    return bool(re.search(r"\bthen\b", chat.question, re.I))


def _pending_tools(chat: Chat) -> list[str]:
    """In a step-by-step question (any question of a ReAct chat: one action per turn), the
    named tools not yet called since it was asked."""
    if not chat.tools or not (chat.react or _step_by_step(chat)):
        return []
    asked = _asked(chat)
    called = {str(c.get("name")) for t in chat.turns[asked:] for c in t.calls}
    named = [(_mentions(chat.question, t["name"]), t["name"]) for t in chat.tools]
    return [name for at, name in sorted(named) if at >= 0 and name not in called]


def _asked(chat: Chat) -> int:
    """The index of the last user turn (the question), 0 if there is none."""
    return max((i for i, t in enumerate(chat.turns) if t.role == "user"), default=0)


def _compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _choose(options: list[Any], text: str) -> Any:
    """The option `text` mentions, else the first."""
    lowered = text.lower()
    return next((o for o in options if str(o).lower() in lowered), options[0])


def _json_answer(chat: Chat, schema: dict[str, Any]) -> str:
    """A forced tool call as ``{"name", "arguments"}``, or an instance of `schema` (filled
    from the tool results since the question, if any, then the question)."""
    options = tool_call_options(schema)
    if not options:
        return _compact(Filler(schema, _result_hints(chat)).value(schema))
    name, arguments = _forced_choice(chat, options)
    if chat.last.role == "tool" and name not in _pending_tools(chat):
        hints = _result_hints(chat)  # a final call (a structured-output tool): the results
    else:
        hints = _hints_for(chat, name, before=" ".join(chat.last.responses))
    filled = Filler(schema, hints).value(arguments)
    return _compact({"name": name, "arguments": filled})


def _forced_choice(chat: Chat, options: list[tuple[str, Any]]) -> tuple[str, Any]:
    """The tool a forced call picks: before any results, the best match for the question;
    after them, the next tool of a "use a, then b" sequence, else the best match among the
    tools not yet called since the question (LangChain's ``ToolStrategy`` offers the
    response schema as a tool and forces a call: once the results are in, it is that one)."""
    if chat.last.role == "tool":
        pending = _pending_tools(chat)
        named = [o for o in options if o[0] in pending[:1]]
        called = {str(c.get("name")) for t in chat.turns[_asked(chat) :] for c in t.calls}
        options = named or [o for o in options if o[0] not in called] or options
    return max(enumerate(options), key=lambda o: (_tool_score(chat, o[1][0]), -o[0]))[1]


def tool_call_options(schema: dict[str, Any]) -> list[tuple[str, Any]]:
    """(name, arguments schema) of each tool a tool-call schema allows; [] if it is not one."""
    top = _resolve(schema, schema)
    branches = top.get("anyOf") or top.get("oneOf") if isinstance(top, dict) else None
    if not branches:
        return _tool_call_option(top, schema)
    options = [_tool_call_option(b, schema) for b in branches]
    return [o for found in options for o in found] if all(options) else []


def _tool_call_option(schema: Any, root: dict[str, Any]) -> list[tuple[str, Any]]:
    schema = _resolve(schema, root)
    properties = schema.get("properties") if isinstance(schema, dict) else None
    if not isinstance(properties, dict) or not {"name", "arguments"} <= set(properties):
        return []
    name = _resolve(properties["name"], root)
    names = [name["const"]] if "const" in name else list(name.get("enum") or [])
    return [(n, properties["arguments"]) for n in names if isinstance(n, str)]


def _json_object(chat: Chat) -> dict[str, Any]:
    """An object with the keys the question quotes (``'setup' and 'punchline'``)."""
    hints = Hints.of(chat.question)
    keys = [k for k in dict.fromkeys(hints.quoted) if k.isidentifier()]
    if not keys:
        return {"answer": plain_answer(chat)}
    filler = Filler({}, hints)
    return {key: filler.value({"type": "string"}, key) for key in keys}


# --- tools ----------------------------------------------------------------------------------


def _mentions(text: str, name: str) -> int:
    """Where `text` names the tool (as is, or with spaces for underscores); -1 if not."""
    for form in (name, name.replace("_", " ")):
        found = re.search(rf"(?<!\w){re.escape(form)}(?!\w)", text, re.I)
        if found:
            return found.start()
    return -1


def _wants_tools(chat: Chat) -> bool:
    """Whether the question calls for a tool."""
    if len(chat.tools) == 1 or any(_mentions(chat.question, t["name"]) >= 0 for t in chat.tools):
        return True
    texts = [t.text for t in chat.turns if t.role == "system"] + [chat.question]
    return any(_USE_TOOL.search(text) for text in texts)


def _requested_tools(chat: Chat) -> list[str]:
    """The tools the question names, in order of mention; else the best-matching one."""
    named = [(_mentions(chat.question, t["name"]), t["name"]) for t in chat.tools]
    mentioned = [name for at, name in sorted(named) if at >= 0]
    if mentioned:
        return mentioned
    best = max(enumerate(chat.tools), key=lambda t: (_tool_score(chat, t[1]["name"]), -t[0]))
    return [best[1]["name"]]


def _tool_score(chat: Chat, name: str) -> int:
    """How well tool `name` fits the question: named outright, else shared words."""
    if _mentions(chat.question, name) >= 0:
        return 1000
    described = f"{name.replace('_', ' ')} {chat.tool(name).get('description') or ''}"
    words = {w for w in re.findall(r"\w{4,}", chat.question.lower())}
    return len(words & set(re.findall(r"\w{4,}", described.lower())))


def _hints_for(chat: Chat, name: str, before: str = "") -> Hints:
    """Hints from the part of the question about tool `name` (from its mention to the next),
    after those in `before` (earlier tool results)."""
    question = chat.question
    start = _mentions(question, name)
    if start >= 0:
        later = [_mentions(question[start + 1 :], t["name"]) for t in chat.tools]
        ends = [start + 1 + at for at in later if at >= 0]
        part = question[start : min(ends, default=len(question))]
        hints = Hints.of(f"{before} {part}", [t["name"] for t in chat.tools])
        if hints.numbers or hints.names:
            return hints
    return Hints.of(question, [t["name"] for t in chat.tools])


def _arguments(chat: Chat, name: str, before: str = "") -> dict[str, Any]:
    """Arguments for tool `name` filled from the question (and from `before`, earlier tool
    results, first)."""
    parameters = chat.tool(name).get("parameters") or {"type": "object", "properties": {}}
    arguments = Filler(parameters, _hints_for(chat, name, before)).value(parameters)
    return arguments if isinstance(arguments, dict) else {}


def _hermes_call(chat: Chat, name: str, before: str = "") -> str:
    """A ``<tool_call>`` block calling `name` with arguments filled from the question (and
    from `before`, earlier tool results, first)."""
    call = {"name": name, "arguments": _arguments(chat, name, before)}
    return f"<tool_call>\n{to_json(call)}\n</tool_call>"


def _tool_results(chat: Chat) -> str:
    """One sentence for each response of the last turn, stating its result."""
    calls = next((t.calls for t in reversed(chat.turns) if t.role == "assistant"), [])
    names = [str(c.get("name")) for c in calls]
    responses = chat.last.responses
    names += ["The tool"] * (len(responses) - len(names))
    return " ".join(_tool_result(r, n) for r, n in zip(responses, names, strict=False)) or "Done."


def _tool_result(response: str, tool: str) -> str:
    """A single value as "The result is 3.", else what `tool` returned or its error."""
    text = response.strip()
    value = _single_value(text)
    if value is not None:
        return f"The result is {value}."
    closed = text if text.endswith((".", "!", "?")) else text + "."
    if text.lower().startswith("error"):
        return f"{tool} reported an error: " + re.sub(r"(?i)^error:?\s*", "", closed)
    return f"{tool} returned: {closed}"


def _single_value(text: str) -> Any:
    """The value of a JSON scalar or one-key object, else None."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return None
    if isinstance(data, dict) and len(data) == 1:
        data = next(iter(data.values()))
    if isinstance(data, bool):
        return str(data).lower()
    return data if isinstance(data, int | float | str) else None


# --- ReAct chats (LlamaIndex's ReActAgent) -------------------------------------------------

_REACT_LINES = ("Thought", "Action", "Action Input", "Observation", "Answer")
_REACT_TOOL = re.compile(
    r"^> Tool Name: ([^\n]+)\nTool Description: (.*?)\nTool Args: ", re.M | re.S
)
_REACT_CONTEXT = "Here is some context to help you answer the question and plan:\n"
_REACT_CONVERSATION = re.compile(
    r"^## Current Conversation\n+(?:Below is the current conversation[^\n]*\n?)?", re.M
)
_REACT_ACTION = re.compile(r"^Action:[ \t]*([^\n() \t]+)[^\n]*\n+Action Input:[ \t]*(.*)$", re.M)
_OBSERVATION = re.compile(r"^\s*Observation:[ \t]*")
REACT_ACTION_THOUGHT = (
    "The current language of the user is: English. "
    "I need to use a tool to help me answer the question."
)
REACT_ANSWER_THOUGHT = (
    "I can answer without using any more tools. I'll use the user's language to answer"
)


def is_react_header(text: str) -> bool:
    """Whether `text` holds the ReAct prompt: the "## Output Format" section and each of the
    format's lines (Thought, Action, Action Input, Observation, Answer) at a line start."""
    return "## Output Format" in text and all(
        re.search(rf"^{word}:", text, re.M) for word in _REACT_LINES
    )


def _read_react(chat: Chat) -> Chat:
    """`chat` read as a ReAct chat if its system turn or first user turn holds the ReAct
    header: the header's tools added, the header replaced by its context (the agent's system
    prompt) and whatever follows it, observations as tool turns, actions as calls."""
    first_user = next((i for i, t in enumerate(chat.turns) if t.role == "user"), len(chat.turns))
    at = next(
        (
            i
            for i, t in enumerate(chat.turns[: first_user + 1])
            if t.role in ("system", "user") and is_react_header(t.text)
        ),
        None,
    )
    if at is None:
        return chat
    header = chat.turns[at]
    known = {t.get("name") for t in chat.tools}
    tools = chat.tools + [t for t in react_tools(header.text) if t["name"] not in known]
    turns = chat.turns[:at]
    rest = _react_rest(header.text)
    if rest:
        turns.append(Turn(header.role, rest))
    turns += [_react_turn(t) for t in chat.turns[at + 1 :]]
    return Chat(turns, tools, chat.thinking, react=True)


def react_tools(header: str) -> list[dict[str, Any]]:
    """The tools a ReAct header lists, as ``{"name", "description", "parameters"}``."""
    tools: list[dict[str, Any]] = []
    decoder = json.JSONDecoder()
    for found in _REACT_TOOL.finditer(header):
        try:
            parameters, _ = decoder.raw_decode(header, found.end())
        except json.JSONDecodeError:
            parameters = None
        if not isinstance(parameters, dict):
            parameters = {"type": "object", "properties": {}}
        name, description = found.group(1).strip(), found.group(2).strip()
        tools.append({"name": name, "description": description, "parameters": parameters})
    return tools


def _react_rest(header: str) -> str:
    """What a ReAct header turn says besides the header: its context, then any text after
    the "## Current Conversation" section's line (a question merged into the turn)."""
    context = ""
    if _REACT_CONTEXT in header:
        context = header.partition(_REACT_CONTEXT)[2].partition("## Output Format")[0].strip()
    parts = _REACT_CONVERSATION.split(header, maxsplit=1)
    after = parts[1].strip() if len(parts) > 1 else ""
    return "\n\n".join(part for part in (context, after) if part)


def _react_turn(turn: Turn) -> Turn:
    """A turn after the ReAct header: an observation as a tool turn, actions as calls."""
    if turn.role == "user" and _OBSERVATION.match(turn.text):
        return Turn("tool", responses=[_OBSERVATION.sub("", turn.text, count=1)])
    if turn.role == "tool":
        return Turn("tool", responses=[_OBSERVATION.sub("", r, count=1) for r in turn.responses])
    if turn.role == "assistant":
        calls = turn.calls + [
            {"name": name, "arguments": _react_input(given)}
            for name, given in _REACT_ACTION.findall(turn.text)
        ]
        return Turn("assistant", turn.text, calls)
    return turn


def _react_input(text: str) -> dict[str, Any]:
    """An "Action Input:" value: JSON, or the Python dict ReActAgent writes back, else {}."""
    text = text.strip()
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            value = {}
    return value if isinstance(value, dict) else {}


def react_answer(chat: Chat) -> str:
    """The ReAct-format answer: an action for the next tool, or the final answer."""
    if chat.last.role == "user" and chat.tools and _wants_tools(chat):
        return _react_action(chat, _requested_tools(chat)[0])
    if chat.last.role == "tool":
        pending = _pending_tools(chat)
        if pending:  # the next named tool, with the last observation's values first
            return _react_action(chat, pending[0], before=" ".join(chat.last.responses))
        return f"Thought: {REACT_ANSWER_THOUGHT}\nAnswer: {_react_results(chat)}"
    return f"Thought: {REACT_ANSWER_THOUGHT}\nAnswer: {plain_answer(chat)}"


def _react_action(chat: Chat, name: str, before: str = "") -> str:
    arguments = to_json(_arguments(chat, name, before))
    return f"Thought: {REACT_ACTION_THOUGHT}\nAction: {name}\nAction Input: {arguments}"


def _react_results(chat: Chat) -> str:
    """A sentence for each observation since the question: "a returned 1." for the earlier
    single values, then the last as "The result is 3." (or what the tool returned)."""
    turns = chat.turns[_asked(chat) :]
    responses = [r for t in turns if t.role == "tool" for r in t.responses]
    names = [str(c.get("name")) for t in turns for c in t.calls]
    names += ["The tool"] * (len(responses) - len(names))
    sentences = []
    for i, (response, name) in enumerate(zip(responses, names, strict=False)):
        value = _single_value(response.strip())
        last = i == len(responses) - 1
        earlier = value is not None and not last
        sentences.append(f"{name} returned {value}." if earlier else _tool_result(response, name))
    return " ".join(sentences) or "Done."


# --- plain answers --------------------------------------------------------------------------


def plain_answer(chat: Chat) -> str:
    """A remembered name, an arithmetic result, a greeting, or a restatement of the topic."""
    question = chat.question
    name = _remembered_name(chat)
    if name and re.search(r"\bname\b|\bwho am i\b|\brepeat\b", question, re.I):
        if _NAME_GIVEN.search(question) and "?" not in question:
            return f"Nice to meet you, {name}! I will remember your name."
        return f"Your name is {name}."
    result = _arithmetic(question)
    if result is not None:
        return f"The answer is {result}."
    key = " ".join(re.sub(r"[^\w\s]", " ", question.lower()).split())
    if key in GREETINGS or not key:
        return GREETING
    if key.startswith("how are you"):
        return "I'm doing well, thank you for asking! How can I help you today?"
    about = _ABOUT.search(question)
    if about:
        return f"Here is a short answer about {about.group(1).strip()}. Ask me for more detail."
    return f'Here is a short answer to "{_first_sentence(question)}". Ask me for more detail.'


def _remembered_name(chat: Chat) -> str | None:
    """The last name a user or system message gave ("my name is Bob", "call me Bob")."""
    names = [
        m.group(1)
        for t in chat.turns
        if t.role in ("user", "system")
        for m in _NAME_GIVEN.finditer(t.text)
    ]
    return names[-1] if names else None


def _arithmetic(question: str) -> str | None:
    """The value of the first ``a op b`` in `question`, formatted, or None."""
    found = _ARITHMETIC.search(question)
    if not found:
        return None
    a, op, b = float(found.group(1)), found.group(2).lower(), float(found.group(3))
    if op in ("+", "plus"):
        value = a + b
    elif op in ("-", "minus"):
        value = a - b
    elif op in ("*", "x", "×", "times", "multiplied by"):
        value = a * b
    elif b == 0:
        return None
    else:
        value = a / b
    return str(int(value)) if value.is_integer() else f"{value:.6g}"


# --- filling schemas from the question ------------------------------------------------------


@dataclass
class Hints:
    """Values found in a text, consumed in order as a schema is filled."""

    text: str
    numbers: list[int | float]
    names: list[str]  # quoted phrases, then capitalised ones not starting a sentence
    quoted: list[str]
    declined: set[str]  # fields the text says to leave out ("no punchline")

    @classmethod
    def of(cls, text: str, tool_names: list[str] | None = None) -> Hints:
        """The hints in `text`, ignoring tool names (their digits are not arguments)."""
        for name in tool_names or []:
            text = re.sub(rf"(?<!\w){re.escape(name)}(?!\w)", " ", text)
        numbers: list[int | float] = [
            int(n) if float(n).is_integer() and "." not in n else float(n)
            for n in _NUMBER.findall(text)
        ]
        quoted = _QUOTED.findall(text)
        unquoted = _QUOTED.sub(" ", text)
        capitalised = [
            m.group(0)
            for m in _CAPITALISED.finditer(unquoted)
            # not the first word of a sentence, a line, or an XML element (LlamaIndex
            # wraps a chat in ``<message>...</message>`` to ask for its structured output)
            if m.group(0) != "I" and not re.search(r"(^|[.?!:>\n])\s*$", unquoted[: m.start()])
        ]
        declined = {w.lower() for w in _DECLINED.findall(text)}
        return cls(text, numbers, quoted + capitalised, list(quoted), declined)

    @property
    def subject(self) -> str:
        """What the text is about: the phrase after "about", else its first sentence."""
        about = _ABOUT.search(self.text)
        return about.group(1).strip() if about else _first_sentence(self.text) or "the request"


class Filler:
    """Builds a JSON instance of a schema, taking values from the hints where they fit."""

    MAX_DEPTH = 4
    """Nesting past which an array gets only the items it must have (a recursive schema,
    such as an outline's sections, ends as a model's answer does)."""

    def __init__(self, root: dict[str, Any], hints: Hints) -> None:
        self.root = root  # where ``$ref``s resolve
        self.hints = hints
        self.depth = 0

    def value(self, schema: Any, name: str = "") -> Any:
        """An instance of `schema` for a field called `name`."""
        schema = _resolve(schema, self.root)
        if not isinstance(schema, dict):
            return self._string({}, name)
        if "const" in schema:
            return schema["const"]
        if "enum" in schema:
            return _choose(list(schema["enum"]), self.hints.text)
        if "allOf" in schema:
            merged = {k: v for k, v in schema.items() if k != "allOf"}
            for part in schema["allOf"]:
                merged = {**_resolve(part, self.root), **merged}
            return self.value(merged, name)
        branches = schema.get("anyOf") or schema.get("oneOf")
        if branches:
            return self.value(self._branch(branches, name), name)
        return self._typed(schema, _type_of(schema, name.lower() in self.hints.declined), name)

    def _branch(self, branches: list[Any], name: str) -> Any:
        """The first non-null branch, or the null one for a declined field."""
        resolved = [_resolve(b, self.root) for b in branches]
        nulls = [b for b in resolved if isinstance(b, dict) and b.get("type") == "null"]
        if nulls and name.lower() in self.hints.declined:
            return nulls[0]
        return next((b for b in resolved if b not in nulls), resolved[0])

    def _typed(self, schema: dict[str, Any], kind: str, name: str) -> Any:
        if kind == "object":
            return self._object(schema)
        if kind == "array":
            return self._array(schema, name)
        if kind in ("integer", "number"):
            return self._number(schema, kind == "integer")
        if kind == "boolean":
            return True
        if kind == "null":
            return None
        return self._string(schema, name)

    def _object(self, schema: dict[str, Any]) -> dict[str, Any]:
        """Every property (a declined optional one gets its default), then other required keys."""
        required = list(schema.get("required") or [])
        out: dict[str, Any] = {}
        for key, sub in (schema.get("properties") or {}).items():
            resolved = _resolve(sub, self.root)
            declined = key.lower() in self.hints.declined and key not in required
            if declined and isinstance(resolved, dict) and "default" in resolved:
                out[key] = resolved["default"]
            else:
                out[key] = self.value(sub, key)
        for key in required:
            out.setdefault(key, self._string({}, key))
        return out

    def _array(self, schema: dict[str, Any], name: str) -> list[Any]:
        """All remaining numbers for a numeric array, else one item (or ``minItems``)."""
        items = _resolve(schema.get("items", {}), self.root)
        low, high = schema.get("minItems", 0), schema.get("maxItems")
        numeric = isinstance(items, dict) and items.get("type") in ("integer", "number")
        count = max(low, len(self.hints.numbers) if numeric else 1)
        count = min(count, high) if high is not None else count
        if self.depth >= self.MAX_DEPTH:
            count = low
        self.depth += 1
        try:
            return [self.value(items, name) for _ in range(count)]
        finally:
            self.depth -= 1

    def _number(self, schema: dict[str, Any], integer: bool) -> int | float:
        """The next number of the hints within the bounds, else the default or a bounded 1."""
        low, high = _bounds(schema, integer)
        while self.hints.numbers:
            number = self.hints.numbers.pop(0)
            if (not integer or float(number).is_integer()) and low <= number <= high:
                return int(number) if integer else number
        default = schema.get("default")
        if isinstance(default, int | float) and not isinstance(default, bool):
            return default
        fallback = min(max(1.0, low), high)
        if integer:
            return math.ceil(fallback) if math.ceil(fallback) <= high else math.floor(fallback)
        return fallback

    def _string(self, schema: dict[str, Any], name: str) -> str:
        """A joke line, the subject for descriptive fields, else the next quoted or proper name."""
        key = name.lower()
        if schema.get("format") in _FORMATS:
            text = _FORMATS[schema["format"]]
        elif key in ("setup", "punchline"):
            text = _joke(self.hints.subject)[key]
        elif key in _DESCRIPTIVE or not self.hints.names:
            text = self.hints.subject
        else:
            text = self.hints.names.pop(0)
        text = text[: schema["maxLength"]] if "maxLength" in schema else text
        return text.ljust(schema.get("minLength", 0), ".")


def _resolve(schema: Any, root: dict[str, Any]) -> Any:
    """`schema` with a local ``$ref`` (a JSON pointer from `root`: ``#/$defs/X``, ``#``)
    followed; one that points at nothing raises, as a grammar compiler refuses it."""
    seen = 0
    while isinstance(schema, dict) and "$ref" in schema and seen < 32:
        target: Any = root
        for part in schema["$ref"].removeprefix("#").split("/")[1:]:
            if not isinstance(target, dict) or part not in target:
                raise ValueError(f"$ref {schema['$ref']!r} points at nothing in its schema")
            target = target[part]
        schema = {**{k: v for k, v in schema.items() if k != "$ref"}, **target}
        seen += 1
    return schema


def _type_of(schema: dict[str, Any], declined: bool) -> str:
    """The schema's type; of a list, the first non-null (null for a declined field)."""
    kind = schema.get("type")
    if isinstance(kind, list):
        if declined and "null" in kind:
            return "null"
        return next((k for k in kind if k != "null"), "null")
    if isinstance(kind, str):
        return kind
    return "object" if "properties" in schema else "array" if "items" in schema else "string"


def _bounds(schema: dict[str, Any], integer: bool) -> tuple[float, float]:
    """The inclusive range a number may take (exclusive bounds moved in by 1 or 0.001)."""
    step = 1 if integer else 0.001
    low, high = float(schema.get("minimum", -math.inf)), float(schema.get("maximum", math.inf))
    below, above = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
    # draft 4 marks ``minimum`` exclusive with ``true``; later drafts give the bound itself
    if below is True or (isinstance(below, int | float) and not isinstance(below, bool)):
        low = max(low, (low if below is True else below) + step)
    if above is True or (isinstance(above, int | float) and not isinstance(above, bool)):
        high = min(high, (high if above is True else above) - step)
    return low, high


def _joke(subject: str) -> dict[str, str]:
    """A short joke about `subject`."""
    return {
        "setup": f"Why did the {subject} sit on the computer?",
        "punchline": f"To keep an eye on the mouse, as {subject} always do.",
    }


WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
"""A tool the capable model calls when asked about the weather (a ``city`` argument)."""

CAPABLE_CUES = ["Therefore,", "Now"]
"""The cues the capable model's reasoning uses as sentence starters."""


def capable_server(token_delay: float = 0.0, memory: int | None = None) -> ScriptedVLLM:
    """A scripted vLLM serving "large" and "small", both answering like a capable model
    (``token_delay`` seconds a token; ``memory``: see :class:`.ScriptedModel`)."""
    return ScriptedVLLM(
        *(
            ScriptedModel(name, "", respond=capable, token_delay=token_delay, memory=memory)
            for name in ("large", "small")
        )
    )


def relay_fields(base_url: str, **fields: Any) -> dict[str, Any]:
    """Settings of a LangChain or LlamaIndex relay model over a capable server."""
    return {
        "large_url": base_url,
        "large_model": "large",
        "small_url": base_url,
        "small_model": "small",
        "cues": CAPABLE_CUES,
        "policy": SwitchPolicy(cooldown_tokens=0),
        **fields,
    }


def capable_relay_config(
    base_url: str,
    small_url: str | None = None,
    policy: SwitchPolicy | None = None,
    **fields: Any,
) -> RelayConfig:
    """The ``RelayConfig`` of a relay over a capable server: its cues, no cool-down unless
    `policy` says otherwise."""
    return RelayConfig(
        large=EndpointConfig(base_url=base_url, model="large"),
        small=EndpointConfig(base_url=small_url or base_url, model="small"),
        cues=CAPABLE_CUES,
        policy=policy or SwitchPolicy(cooldown_tokens=0),
        **fields,
    )
