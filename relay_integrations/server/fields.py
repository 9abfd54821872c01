"""The fate of each chat completion field the relay does not honour: refused with the reason,
or dropped because it cannot change what the client gets back. Any other unknown field is
refused too, so a typo or a vLLM option the relay does not carry is never lost silently::

    refuse_field("reasoning_effort", "low", accepted)  # ApiError(400, "reasoning_effort: ...")

``docs/deployment.md`` lists every field with its fate; ``tests/component/test_server_fields.py``
checks each row.
"""

from __future__ import annotations

import difflib
from collections.abc import Collection, Mapping
from typing import Any

from ..chat.habits import REFUSED_FIELDS
from ..upstream.reserved_fields import RESERVED_BODY_FIELDS
from .errors import ApiError

IGNORED_FIELDS: Mapping[str, str] = {
    "user": "an end-user id for OpenAI's abuse monitoring; it never reaches a model",
    "safety_identifier": "an end-user id for OpenAI's abuse monitoring; it never reaches a model",
    "metadata": "tags of a completion OpenAI stores (with store); nothing is stored here",
    "prompt_cache_key": "a routing hint for OpenAI's prompt cache; vLLM caches prefixes itself",
    "prompt_cache_retention": "how long OpenAI keeps a cached prefix; it never changes the text",
    "prompt_cache_options": "OpenAI's cache breakpoints and lifetime; they never change the text",
    "prediction": "predicted outputs make OpenAI faster, never different; the answer is the same",
}
"""Fields dropped without a word: each is a hint or a label that cannot change the answer."""

_RESPONSE_FORMAT = "use response_format (type json_schema or json_object)"
_PLATFORM = "is an OpenAI platform option that vLLM servers do not have; remove it"

REFUSED: Mapping[str, str] = {
    "functions": "the deprecated form of tools; send tools=[{'type': 'function', ...}]",
    "function_call": "the deprecated form of tool_choice; send tool_choice",
    "top_logprobs": REFUSED_FIELDS["top_logprobs"],
    "reasoning_effort": REFUSED_FIELDS["reasoning_effort"],
    "audio": REFUSED_FIELDS["audio"],
    "modalities": REFUSED_FIELDS["modalities"],
    "service_tier": REFUSED_FIELDS["service_tier"],
    "store": REFUSED_FIELDS["store"],
    "verbosity": REFUSED_FIELDS["verbosity"],
    "moderation": f"moderation {_PLATFORM}",
    "web_search_options": "the relay has no web search; offer a search tool in tools",
    # vLLM's own request fields, as clients send them in extra_body
    **{
        name: RESERVED_BODY_FIELDS[name]
        for name in (
            "echo",
            "include_stop_str_in_output",
            "add_special_tokens",
            "return_token_ids",
            "min_tokens",
            "stop_token_ids",
            "prompt_logprobs",
        )
    },
    "best_of": REFUSED_FIELDS["n"],
    "use_beam_search": "beam search keeps several sequences on one model; the relay writes one "
    "sequence over two",
    "ignore_eos": "the end of the answer is where the relay's hand-offs and the client's answer "
    "end; use max_tokens",
    "structured_outputs": _RESPONSE_FORMAT,
    "guided_json": _RESPONSE_FORMAT,
    "guided_regex": _RESPONSE_FORMAT,
    "guided_choice": _RESPONSE_FORMAT,
    "guided_grammar": _RESPONSE_FORMAT,
    "guided_decoding_backend": _RESPONSE_FORMAT,
    "chat_template": "the relay renders the prompt with each server's own chat template",
    "add_generation_prompt": "the relay always writes a new assistant turn",
    "continue_final_message": "the relay always writes a new assistant turn",
    "request_id": "send the X-Request-Id header: it names the generation upstream",
}
"""Fields the relay cannot honour, with what to do instead (a 400 naming the field)."""

OFF_VALUES: Mapping[str, tuple[Any, ...]] = {
    "top_logprobs": (0,),
    "store": (False,),
    "modalities": (["text"],),
    "functions": ([],),
}
"""Values of refused fields that ask for nothing the relay lacks; they are accepted (null too)."""


def declared_fields(
    body: Any,
    fields: Collection[str],
    ignored: Collection[str],
    *,
    refused: Mapping[str, str] = REFUSED,
    off_values: Mapping[str, tuple[Any, ...]] = OFF_VALUES,
    requests: str = "chat completion requests",
) -> dict[str, Any]:
    """The fields of a request body that its model declares (`fields`), for it to validate:
    the `ignored` ones are dropped, any other is refused (:func:`refuse_field`)."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    accepted = [*fields, *ignored]
    declared = {}
    for name, value in body.items():
        if name in fields:
            declared[name] = value
        elif name not in ignored:  # refused, unless set to what asks for nothing
            refuse_field(
                name, value, accepted, refused=refused, off_values=off_values, requests=requests
            )
    return declared


def refuse_field(
    name: str,
    value: Any,
    accepted: Collection[str],
    *,
    refused: Mapping[str, str] = REFUSED,
    off_values: Mapping[str, tuple[Any, ...]] = OFF_VALUES,
    requests: str = "chat completion requests",
) -> None:
    """Refuse an undeclared field: with its reason (`refused`), or as unknown (with the
    closest name of `accepted`), naming the `requests` it is not a field of.

    A refused field set to null or to its off value (``store: false``) asks for nothing, so
    it passes.
    """
    if name in refused:
        if value is None or any(
            value == off and type(value) is type(off) for off in off_values.get(name, ())
        ):
            return
        raise ApiError(400, f"{name}: {refused[name]}", param=name, code="unsupported_parameter")
    shown = name if len(name) <= 64 else name[:64] + "..."
    close = difflib.get_close_matches(name, accepted, n=1) if len(name) <= 64 else []
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise ApiError(
        400,
        f"{shown!r} is not a field of the {requests} this relay takes{hint} "
        "(the fields and what the relay does with each: docs/deployment.md)",
        param=shown,
        code="unknown_parameter",
    )
