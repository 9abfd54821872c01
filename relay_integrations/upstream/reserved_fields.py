"""The vLLM request fields the relay sets itself, which ``extra_body`` may not set::

check_extra_body({"ignore_eos": False}, "extra_body", sampling=("temperature",))  # fine
check_extra_body({"stream": False}, "extra_body", sampling=())
# ValueError: extra_body may not set stream: the relay sets it on every request
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

ONE_GENERATION = "the relay writes one generation per call; use batch() for several"
TOKENIZERS = (
    "token ids differ between the two models' tokenizers, so one bias cannot mean the same thing "
    "for both; put it in large={'extra_body': {...}} or small={...} to bias one model only"
)
LOGPROBS = (
    "the answer is written by two models with two tokenizers, so their log-probabilities "
    "do not form one distribution; call a vLLM server directly for log-probabilities"
)
STRUCTURED = "use response_format= or with_structured_output()"

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
    "n": ONE_GENERATION,
    "best_of": ONE_GENERATION,
    "logprobs": LOGPROBS,
    "top_logprobs": LOGPROBS,
    "prompt_logprobs": LOGPROBS,
    "logit_bias": TOKENIZERS,
    "structured_outputs": STRUCTURED,
    "guided_json": STRUCTURED,
    "guided_regex": STRUCTURED,
    "guided_grammar": STRUCTURED,
    "response_format": "use response_format= (the relay constrains the answer only)",
    "chat_template_kwargs": "use chat_template_kwargs= (the relay renders the prompt once)",
}
"""vLLM request fields that ``extra_body`` may not set: the relay owns them, or they cannot
mean what the caller expects across two models. Sampling fields are refused separately, with
the field to use."""


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
