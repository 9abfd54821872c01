"""How the answer must look, and the one reading of OpenAI's ways of saying it.

Chat completions nest the schema (``{"type": "json_schema", "json_schema": {"name": ...,
"schema": {...}}}``), the Responses API's ``text.format`` holds it flat (``{"type":
"json_schema", "name": ..., "schema": {...}}``); both have ``{"type": "json_object"}`` and
``{"type": "text"}`` (no constraint). The adapters and ``relaygen serve`` all read them here::

    response_format_of({"type": "json_schema", "json_schema": {"name": "a", "schema": s}})
    # JsonSchemaFormat(schema=s)
    response_format_of({"type": "json_object"})  # JsonObjectFormat()
    response_format_of({"type": "text"})  # None
    response_format_of({"type": "json_schema"})
    # ValueError: response_format of type json_schema needs a schema ...
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class JsonSchemaFormat:
    """The answer is JSON valid against ``schema`` (vLLM ``structured_outputs.json``)."""

    schema: dict[str, Any]


@dataclass(frozen=True)
class JsonObjectFormat:
    """The answer is some JSON object (vLLM ``structured_outputs.json_object``)."""


ResponseFormat = JsonSchemaFormat | JsonObjectFormat

FORMAT_TYPES = ("text", "json_object", "json_schema")


def response_format_of(
    value: Mapping[str, Any], where: str = "response_format"
) -> ResponseFormat | None:
    """OpenAI's `value` (either API's shape) as the relay's; None for ``{"type": "text"}``.

    Raises ValueError, naming `where` and what to send, for an unknown type or a
    ``json_schema`` without a schema object."""
    kind = value.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return JsonObjectFormat()
    if kind != "json_schema":
        raise ValueError(f"{where} has type {kind!r}; it must be one of {', '.join(FORMAT_TYPES)}")
    nested = value.get("json_schema")
    holder = nested if isinstance(nested, Mapping) else value
    schema = holder.get("schema")
    if not isinstance(schema, dict):
        raise ValueError(
            f"{where} of type json_schema needs a schema object: "
            '{"type": "json_schema", "json_schema": {"name": ..., "schema": {...}}} for chat '
            'completions, {"type": "json_schema", "name": ..., "schema": {...}} for responses'
        )
    return JsonSchemaFormat(schema)
