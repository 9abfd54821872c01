"""The Qwen3 chat template as vLLM renders it, in plain Python, and a word-level tokenizer:
what the scripted server (:mod:`.scripted_vllm`) answers ``/tokenize`` with, and what a
scripted model's ``respond`` reads its chat back out of::

    prompt = render_chat([{"role": "user", "content": "Hi"}])   # ... "<|im_start|>assistant\n"
    tokenize("Hello, world")                                      # ['Hello', ',', ' world']
"""

from __future__ import annotations

import json
import re
from typing import Any

ASSISTANT = "<|im_start|>assistant\n"
THINKING_OFF = "<think>\n\n</think>\n\n"
_TOKEN = re.compile(r" ?[A-Za-z]+| ?\d| ?[^\sA-Za-z\d]|\s")


def tokenize(text: str) -> list[str]:
    return _TOKEN.findall(text)


TOOLS_INTRO = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
TOOLS_OUTRO = (
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)


def render_chat(
    messages: list[dict[str, Any]],
    thinking: bool = True,
    tools: list[dict[str, Any]] | None = None,
) -> str:
    """The prompt vLLM renders with the Qwen3 chat template and ``add_generation_prompt``.

    Messages are first normalised as vLLM does (text parts joined, tool-call arguments parsed
    into objects, ``reasoning`` read), then rendered like the template: tools in the system
    turn, reasoning kept only after the last user query, tool results grouped in user turns.
    """
    chat = [_normalize_message(m) for m in messages]
    if not chat:
        return ASSISTANT + ("" if thinking else THINKING_OFF)
    text = _system_header(chat[0], [_normalize_tool(t) for t in tools or []])
    last_query = _last_query_index(chat)
    for i, message in enumerate(chat):
        if message["role"] == "user" or (message["role"] == "system" and i > 0):
            text += f"<|im_start|>{message['role']}\n{message['content']}<|im_end|>\n"
        elif message["role"] == "assistant":
            text += _render_assistant(message, after_query=i > last_query, last=i == len(chat) - 1)
        elif message["role"] == "tool":
            first = i == 0 or chat[i - 1]["role"] != "tool"
            final = i == len(chat) - 1 or chat[i + 1]["role"] != "tool"
            text += "<|im_start|>user" if first else ""
            text += f"\n<tool_response>\n{message['content']}\n</tool_response>"
            text += "<|im_end|>\n" if final else ""
    return text + ASSISTANT + ("" if thinking else THINKING_OFF)


def to_json(value: Any) -> str:
    """The chat template's ``tojson`` (transformers': no ASCII escaping, default separators)."""
    return json.dumps(value, ensure_ascii=False)


def _normalize_message(message: dict[str, Any]) -> dict[str, Any]:
    """A message as vLLM hands it to the template: string content, parsed tool arguments."""
    content = message.get("content")
    if isinstance(content, list):
        texts = [p.get("text", "") for p in content if p.get("type") == "text"]
        content = "\n".join(texts)
    normalized = {"role": message["role"], "content": content or ""}
    calls = [_normalize_call(c) for c in message.get("tool_calls") or []]
    if message["role"] == "assistant" and calls:
        normalized["tool_calls"] = calls
    if message["role"] == "assistant" and message.get("reasoning") is not None:
        normalized["reasoning"] = message["reasoning"]  # vLLM passes it as reasoning_content
    return normalized


def _normalize_call(call: dict[str, Any]) -> dict[str, Any]:
    """A tool call's name and arguments as an object (vLLM coerces bad JSON to ``{}``)."""
    function = call.get("function") or call
    arguments = function.get("arguments") or {}
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            arguments = {}
    return {"name": function["name"], "arguments": arguments if isinstance(arguments, dict) else {}}


def _normalize_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """A tool as vLLM re-serialises it: known fields only, missing ones as null."""
    function = tool["function"]
    normalized = {
        "name": function["name"],
        "description": function.get("description"),
        "parameters": function.get("parameters"),
    }
    if function.get("strict") is not None:
        normalized["strict"] = function["strict"]
    return {"type": "function", "function": normalized}


def _system_header(first: dict[str, Any], tools: list[dict[str, Any]]) -> str:
    """The system turn: the first system message, then the tools block if there are tools."""
    system = first["content"] if first["role"] == "system" else None
    if not tools:
        return "" if system is None else f"<|im_start|>system\n{system}<|im_end|>\n"
    lines = "".join("\n" + to_json(t) for t in tools)
    intro = "" if system is None else system + "\n\n"
    return f"<|im_start|>system\n{intro}{TOOLS_INTRO}{lines}{TOOLS_OUTRO}<|im_end|>\n"


def _last_query_index(chat: list[dict[str, Any]]) -> int:
    """The last user message that is not a wrapped tool response (the template's rule)."""
    for i in range(len(chat) - 1, -1, -1):
        content = chat[i]["content"]
        wrapped = content.startswith("<tool_response>") and content.endswith("</tool_response>")
        if chat[i]["role"] == "user" and not wrapped:
            return i
    return len(chat) - 1


def _render_assistant(message: dict[str, Any], after_query: bool, last: bool) -> str:
    """An assistant turn: reasoning only after the last query, then content and tool calls."""
    content: str = message["content"]
    reasoning = message.get("reasoning")
    if not isinstance(reasoning, str):
        reasoning = ""
        if "</think>" in content:
            parts = content.split("</think>")
            reasoning = parts[0].rstrip("\n").split("<think>")[-1].lstrip("\n")
            content = parts[-1].lstrip("\n")
    text = "<|im_start|>assistant\n"
    if after_query and (last or reasoning):
        text += "<think>\n" + reasoning.strip("\n") + "\n</think>\n\n" + content.lstrip("\n")
    else:
        text += content
    for i, call in enumerate(message.get("tool_calls", [])):
        if i > 0 or content:
            text += "\n"
        arguments = to_json(call["arguments"])
        text += f'<tool_call>\n{{"name": "{call["name"]}", "arguments": {arguments}}}\n</tool_call>'
    return text + "<|im_end|>\n"
