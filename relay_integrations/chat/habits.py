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

from ..upstream.reserved_fields import LOGPROBS, ONE_GENERATION, TOKENIZERS

FIELD_ALIASES: Mapping[str, str] = {
    "request_timeout": "timeout",
    "max_completion_tokens": "max_tokens",
    "stop_sequences": "stop",
    "model_kwargs": "extra_body",
    "additional_kwargs": "extra_body",
    "openai_api_key": "api_key",
    "openai_proxy": "proxy",
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
_REASONING = (
    "the relay always reasons; bound the reasoning with "
    "policy=SwitchPolicy(max_reasoning_tokens=N), or turn it off with "
    "chat_template_kwargs={'enable_thinking': False}"
)
_OPENAI_PLATFORM = "is an OpenAI platform option that vLLM servers do not have; remove it"
_CLIENT = (
    "the relay's requests run on aiohttp, one session per endpoint and event loop (reused by "
    "every call), so an httpx client cannot carry them; pass "
    "session_factory=lambda: aiohttp.ClientSession(...) for a session of one's own (a "
    "connector, trace configs), or set verify=, cert=, proxy=, trust_env=, max_concurrency=, "
    "timeout="
)

REFUSED_FIELDS: Mapping[str, str] = {
    "model": _TWO_MODELS,
    "model_name": _TWO_MODELS,
    "base_url": _TWO_URLS,
    "api_base": _TWO_URLS,
    "openai_api_base": _TWO_URLS,
    "logit_bias": TOKENIZERS,
    "logprobs": LOGPROBS,
    "top_logprobs": LOGPROBS,
    "n": ONE_GENERATION,
    "reasoning_effort": _REASONING,
    "reasoning": _REASONING,
    "http_client": _CLIENT,
    "http_async_client": _CLIENT,
    "async_http_client": _CLIENT,
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
