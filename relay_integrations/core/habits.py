"""What users of ``ChatOpenAI``, ``ChatDeepSeek`` and LlamaIndex's ``OpenAILike`` write, and
what the relay does with it: a name either works with the same meaning (an alias of the
relay's own field) or is refused with a sentence that says what to use instead. Nothing is
dropped without a word::

    RelayChatModel(..., model_kwargs={"ignore_eos": False})   # works: extra_body
    RelayChatModel(..., model="gpt-4o")
    # ValueError: model: a relay serves two models; set large_model= and small_model= ...

Both adapters and ``relaygen serve`` read these tables, so each refusal is written once.
"""

from __future__ import annotations

import difflib
from collections.abc import Collection, Iterable, Mapping
from typing import Any

FIELD_ALIASES: Mapping[str, str] = {
    "request_timeout": "timeout",
    "max_completion_tokens": "max_tokens",
    "stop_sequences": "stop",
    "model_kwargs": "extra_body",
    "additional_kwargs": "extra_body",
    "openai_api_key": "api_key",
}
"""Other clients' names for fields the relay has, with the same meaning."""

_TWO_MODELS = (
    "a relay serves two models; set large_model= and small_model= (the served names on the two "
    "vLLM servers)"
)
_TWO_URLS = (
    "a relay talks to two servers; set large_url= and small_url= (each server's OpenAI base URL, "
    "ending in /v1)"
)
_TOKENIZERS = (
    "token ids differ between the two models' tokenizers, so one bias cannot mean the same thing "
    "for both; put it in large={'extra_body': {...}} or small={...} to bias one model only"
)
_LOGPROBS = (
    "the answer is written by two models with two tokenizers, so their log-probabilities "
    "do not form one distribution; call a vLLM server directly for log-probabilities"
)
_REASONING = (
    "the relay always reasons; bound the reasoning with "
    "policy=SwitchPolicy(max_reasoning_tokens=N), or turn it off with "
    "chat_template_kwargs={'enable_thinking': False}"
)
_OPENAI_PLATFORM = "is an OpenAI platform option that vLLM servers do not have; remove it"
_CLIENT = (
    "the relay keeps its own connection pools (one per endpoint, reused by every call); set "
    "max_concurrency=, timeout=, connect_timeout=, and proxies with the HTTPS_PROXY variable"
)

REFUSED_FIELDS: Mapping[str, str] = {
    "model": _TWO_MODELS,
    "model_name": _TWO_MODELS,
    "base_url": _TWO_URLS,
    "api_base": _TWO_URLS,
    "openai_api_base": _TWO_URLS,
    "logit_bias": _TOKENIZERS,
    "logprobs": _LOGPROBS,
    "top_logprobs": _LOGPROBS,
    "n": "the relay writes one generation per call; use batch() for several",
    "reasoning_effort": _REASONING,
    "reasoning": _REASONING,
    "http_client": _CLIENT,
    "http_async_client": _CLIENT,
    "async_http_client": _CLIENT,
    "openai_proxy": _CLIENT,
    "reuse_client": "the relay always reuses its clients; remove it",
    "tiktoken_model_name": (
        "token counts come from the servers' own tokenizers (POST /tokenize); remove it"
    ),
    "tokenizer": "token counts come from the servers' own tokenizers (POST /tokenize); remove it",
    "default_query": "vLLM reads no query parameters; remove it",
    "organization": f"organization {_OPENAI_PLATFORM}",
    "openai_organization": f"organization {_OPENAI_PLATFORM}",
    "api_version": f"api_version {_OPENAI_PLATFORM}",
    "service_tier": f"service_tier {_OPENAI_PLATFORM}",
    "store": f"store {_OPENAI_PLATFORM}",
    "truncation": f"truncation {_OPENAI_PLATFORM}",
    "include": f"include {_OPENAI_PLATFORM}",
    "verbosity": f"verbosity {_OPENAI_PLATFORM}",
    "use_responses_api": "vLLM's Responses API is not used by the relay; remove it",
    "use_previous_response_id": "vLLM's Responses API is not used by the relay; remove it",
    "modalities": "the relay writes text only; remove it",
    "audio": "the relay writes text only; remove it",
    "disabled_params": "the relay sends only the fields it needs; remove it",
    "include_response_headers": "the relay's upstream headers are its own; remove it",
    "max_tokens_per_segment": "use policy=SwitchPolicy(max_small_tokens=N)",
}
"""Other clients' fields the relay has no equivalent for, with what to do instead."""

RESERVED_BODY_FIELDS: Mapping[str, str] = {
    **{
        name: "the relay sets it on every request"
        for name in (
            "model",
            "prompt",
            "messages",
            "stream",
            "stream_options",
            "echo",
            "suffix",
            "include_stop_str_in_output",
            "add_special_tokens",
            "return_token_ids",
        )
    },
    "max_tokens": "use max_tokens= (one budget for reasoning plus answer)",
    "max_completion_tokens": "use max_tokens= (one budget for reasoning plus answer)",
    "min_tokens": "a minimum per request would hold back every hand-off; remove it",
    "stop": "use stop= (stop sequences of the answer)",
    "stop_token_ids": "the relay's hand-offs need the stream to end where it says; use stop=",
    "n": REFUSED_FIELDS["n"],
    "best_of": REFUSED_FIELDS["n"],
    "logprobs": _LOGPROBS,
    "top_logprobs": _LOGPROBS,
    "prompt_logprobs": _LOGPROBS,
    "logit_bias": _TOKENIZERS,
    "structured_outputs": "use response_format= or with_structured_output()",
    "guided_json": "use response_format= or with_structured_output()",
    "guided_regex": "use response_format= or with_structured_output()",
    "guided_grammar": "use response_format= or with_structured_output()",
    "response_format": "use response_format= (the relay constrains the answer only)",
    "chat_template_kwargs": "use chat_template_kwargs= (the relay renders the prompt once)",
}
"""vLLM request fields that ``extra_body`` may not set: the relay owns them, or they cannot
mean what the caller expects across two models. Sampling fields are refused separately, with
the field to use."""


def refusal(name: str, extra: Mapping[str, str] | None = None) -> str | None:
    """What to use instead of `name`, or None if it is not a known habit."""
    if extra and name in extra:
        return extra[name]
    return REFUSED_FIELDS.get(name)


def unknown_names_message(
    owner: str,
    kind: str,
    unknown: Iterable[str],
    accepted: Collection[str],
    extra_refusals: Mapping[str, str] | None = None,
) -> str:
    """One sentence per unknown name: the habit's alternative, or the closest accepted name,
    then the names that are accepted."""
    lines, unexplained = [], False
    for name in sorted(unknown):
        advice = refusal(name, extra_refusals)
        if advice is None:
            unexplained = True
            close = difflib.get_close_matches(name, accepted, n=1)
            advice = f"did you mean {close[0]!r}?" if close else "not a field of the relay"
        lines.append(f"{name}: {advice}")
    message = f"{owner} does not take {kind} {sorted(unknown)}:\n  " + "\n  ".join(lines)
    if unexplained:
        message += f"\n{owner} takes {sorted(accepted)}"
    return message


def check_extra_body(
    body: Mapping[str, Any],
    where: str,
    sampling: Collection[str],
    allowed: Collection[str] = (),
) -> None:
    """Refuse ``extra_body`` fields the relay owns, and sampling fields (which have their own
    field, so that per-model overrides and the server's defaults work). `allowed` names
    reserved fields that make sense here (``logit_bias`` for one model's own requests)."""
    problems = []
    for name in body:
        if name in allowed:
            continue
        if name in sampling:
            problems.append(f"{name}: use the {name}= field (or a model's own sampling)")
        elif name in RESERVED_BODY_FIELDS:
            problems.append(f"{name}: {RESERVED_BODY_FIELDS[name]}")
    if problems:
        raise ValueError(f"{where} may not set " + "; ".join(problems))
