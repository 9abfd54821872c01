"""What vLLM answers on its JSON routes, validated: a server (or whatever stands at its
address) that answers without a field the relay reads is a named error, never a ``KeyError``
deep inside the relay::

    tokenized = await endpoint.post_json("/tokenize", {"model": "m", "prompt": "Hi"}, Tokenized)
    tokenized.tokens   # [13048]
"""

from __future__ import annotations

from pydantic import BaseModel


class Tokenized(BaseModel):
    """``POST /tokenize``: the ids of a prompt (or of rendered chat messages)."""

    tokens: list[int]
    count: int | None = None
    max_model_len: int | None = None


class Detokenized(BaseModel):
    """``POST /detokenize``: the text of token ids."""

    prompt: str
