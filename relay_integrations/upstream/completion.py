"""The values of one ``/v1/completions`` request: what is sent, and the pieces it streams::

    request = CompletionRequest(prompt="Hi", max_tokens=8, stop=(".",))
    async for piece in endpoint.stream_completion(request):
        piece.text, piece.finish_reason, piece.tokens  # usage: piece.completion_tokens, last

A prompt may be given in the model's token ids (:class:`TokenPrompt`): the server then
tokenizes nothing it has seen before, and each piece carries the ids it wrote::

    prompt = TokenPrompt(ids=(151644, 872, 198), text=" and after them")
    async for piece in endpoint.stream_completion(CompletionRequest(prompt, max_tokens=8)):
        piece.token_ids  # the ids of piece.text (the first piece: piece.tail_ids too)

A request is frozen: one opened ahead is compared with the one a turn would send. A piece is
read only by convention: one or two are made for every streamed token, and a frozen dataclass
costs about 0.8 us more to make.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .headers import check_headers


@dataclass(frozen=True)
class TokenPrompt:
    """A prompt as token ids of the request's model, then `text` that follows them: the
    endpoint tokenizes `text` alone (``/tokenize``, no special tokens added) and sends the
    ids of both, and the request's pieces carry the ids the model writes
    (``return_token_ids``).

    `ids` is a tuple so that two prompts built from one unchanged transcript compare equal at
    once (the same tuple); `text` is what no id of this model stands for yet (the other
    model's text, a marker the relay wrote), short next to the ids."""

    ids: tuple[int, ...]
    text: str = ""


@dataclass(frozen=True)
class CompletionRequest:
    """One ``/v1/completions`` request. vLLM-only fields travel in ``extra_body``."""

    prompt: str | TokenPrompt
    max_tokens: int
    stop: tuple[str, ...] = ()
    sampling: Mapping[str, Any] = field(default_factory=dict)
    """Sampling fields (``SamplingConfig.request_fields``); unset ones take the server's."""
    extra_body: Mapping[str, Any] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)
    """Headers of this request only, checked as an endpoint's ``extra_headers`` are: one the
    relay will not send is an ``InvalidHeaderError`` naming it, before anything is sent."""
    return_token_ids: bool = True
    """With a :class:`TokenPrompt`: the pieces carry the ids they write (off where no later
    request will need them: each costs the stream a little, every token)."""
    written: str = ""
    """Text this request's output goes on from (a resumed request's: what the interrupted one
    wrote), in which one of its stop strings may have begun. vLLM matches stop strings in a
    request's own output only: the endpoint finds a stop that began there in the stream, so
    the request ends where the uninterrupted one would have."""

    def __post_init__(self) -> None:
        check_headers("headers", self.headers)


@dataclass(slots=True)
class StreamPiece:
    """A piece of a streamed completion; the last one carries finish reason and usage."""

    text: str = ""
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    """None when the server does not report them (no ``--enable-prompt-tokens-details``),
    or when the relay closed the request at a stop string the server was not given."""
    completion_tokens: int | None = None
    usage_only: bool = False
    """The stream's final usage chunk (no text)."""
    tokens: int | None = None
    """Tokens the request has written up to and including this piece (vLLM's
    ``continuous_usage_stats``; None if the server does not say). A piece may carry several
    tokens: vLLM merges the steps a client has not read yet into one chunk. Usage is counted
    from the final piece only."""
    token_ids: list[int] | None = None
    """The ids of the tokens this piece wrote, when the prompt was a :class:`TokenPrompt`
    (None otherwise, or from a server that does not return them). A piece may hold ids whose
    text comes in a later piece (half a character, a possible stop's start held back), and
    the last piece of a request that ended at a stop string may hold ids past its text."""
    tail_ids: list[int] | None = None
    """On the first piece of a :class:`TokenPrompt` request: the ids its ``text`` was
    tokenized to."""
