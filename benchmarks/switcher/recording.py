"""What each request and each generation did: timing, usage, text (per-request records)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from relay_integrations.upstream.completion import CompletionRequest, StreamPiece
from relay_integrations.upstream.config import ModelRole
from relay_integrations.upstream.observer import ObservedEndpoint, RequestObserver

from .rates import Rates
from .settings import QUIET

WARM_UP = "warm-up"
"""The phase of the small model's prompt warm-up (``SwitchPolicy.warm_small_prompt``)."""


@dataclass
class RequestRecord:
    """One upstream request: timing, usage, and what the server held (token ids)."""

    role: ModelRole
    sent: float
    first: float | None = None
    done: float | None = None
    prompt_text: str = ""
    text: str = ""  # everything the server returned (stop strings included)
    chat: dict[str, Any] | None = None  # the authors' request: messages and template flags
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    models_seconds: float = 0.0  # the authors' GET /v1/models before the request
    phase: str = "reasoning"
    min_text: int = 0
    text_tokens: int = 0  # tokens of the returned text in its own (canonical) tokenization
    prompt_mismatch: bool = False  # /tokenize of the prompt disagrees with usage.prompt_tokens
    request: CompletionRequest | None = None  # the relay's request, as sent (for the replay)
    cut: bool = False  # the client closed it at a stop string past the server's limit
    generated: int = 0  # vLLM's settled token counter over it (per-request overshoot pass)
    foreign: bool = False  # others' requests finished meanwhile (that pass's figure is void)
    discarded: bool = False  # opened ahead of a hand-off that did not come, closed unused

    @property
    def prefilled(self) -> int:
        return self.prompt_tokens - self.cached_tokens

    def summary(self) -> dict[str, Any]:
        return {
            "role": self.role,
            "phase": self.phase,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "prefilled": self.prefilled,
            "min_text": self.min_text,
            "text_tokens": self.text_tokens,
            "completion_tokens": self.completion_tokens,
            "ttft": None if self.first is None else self.first - self.sent,
            "seconds": None if self.done is None else self.done - self.sent,
            "models_seconds": self.models_seconds,
            "stop_reason": self.stop_reason,
            "cut": self.cut,
            "generated": self.generated,
            "foreign": self.foreign,
        }


class Recorder(RequestObserver):
    """Records every request of the endpoints it observes, in the order they were sent.

    Given to the switcher's endpoints (``Endpoint(..., observer=recorder)``); the pieces the
    switcher sees are the endpoints' own.
    """

    def __init__(self) -> None:
        self.log: list[RequestRecord] = []
        self.phase: dict[ModelRole, str] = {"large": "reasoning", "small": "reasoning"}
        """Of each model's next request: set by the request hook just before it is sent."""
        self.settled: Callable[[ModelRole], Awaitable[tuple[float, float]]] | None = None
        """When set: a server's settled (finished requests, generated tokens) counters, read
        before and after every request (an untimed pass that measures each one's overshoot)."""
        self._open: dict[int, tuple[RequestRecord, tuple[float, float]]] = {}
        # by id(request): the endpoint hands the same object to every callback of a request

    async def opened(self, endpoint: ObservedEndpoint, request: CompletionRequest) -> None:
        before = await self.settled(endpoint.role) if self.settled else (0.0, 0.0)
        record = RequestRecord(
            endpoint.role,
            time.perf_counter(),
            prompt_text=request.prompt,
            phase=self.phase[endpoint.role],
            request=request,
        )
        self.log.append(record)
        record.discarded = True  # until the stream is read to its end
        self._open[id(request)] = record, before

    def piece(
        self, endpoint: ObservedEndpoint, request: CompletionRequest, piece: StreamPiece
    ) -> None:
        record = self._open[id(request)][0]
        if record.first is None:
            record.first = time.perf_counter()
        record.text += piece.text
        if piece.finish_reason is not None:
            record.finish_reason, record.stop_reason = piece.finish_reason, piece.stop_reason
        if piece.completion_tokens is not None:
            record.prompt_tokens = piece.prompt_tokens or 0
            record.cached_tokens = piece.cached_tokens or 0
            record.completion_tokens = piece.completion_tokens

    async def closed(
        self, endpoint: ObservedEndpoint, request: CompletionRequest, completed: bool
    ) -> None:
        record, before = self._open.pop(id(request))
        if not completed:
            return  # closed before its end (a hand-off opened ahead and not taken, a failure)
        record.discarded = False
        record.done = time.perf_counter()
        limit = endpoint.stop_limit
        record.cut = record.stop_reason in (request.stop[limit:] if limit is not None else ())
        if self.settled:
            after = await self.settled(endpoint.role)
            record.generated = round(after[1] - before[1])
            # vLLM counts a finished request, not an aborted one: more is someone else's
            record.foreign = after[0] - before[0] > (0 if record.cut else 1)

    def sent(self) -> list[RequestRecord]:
        """The requests recorded since the log was last emptied, by the time they were sent."""
        return sorted(self.log, key=lambda r: r.sent)


def own_counts(requests: Sequence[RequestRecord]) -> tuple[Counter[str], Counter[str]]:
    sent: Counter[str] = Counter()
    written: Counter[str] = Counter()
    for r in requests:
        sent[r.role] += not r.cut  # vLLM's request counter does not count aborted requests
        written[r.role] += r.completion_tokens
    return sent, written


@dataclass
class Generation:
    approach: str  # relay | authors | large_alone
    mode: str  # regex | tokens
    trace: str
    run: int
    wall: float
    requests: list[RequestRecord]
    text: str
    expected: str
    prepare: float = 0.0  # relay: prompt rendering before the first request
    switches: int = 0
    fallbacks: int = 0
    ideal: float = 0.0
    ideal_parts: dict[str, float] = field(default_factory=dict)
    load: list[float] = field(default_factory=list)
    foreign_cores: float = 0.0  # CPU others used during it, in cores (CpuMeter)
    foreign_requests: int = 0  # requests the servers served for others meanwhile
    foreign_tokens: int = 0
    rates: dict[ModelRole, Rates] = field(default_factory=dict)  # of the round it ran in
    session: str = ""  # relay: the session id in its prompt (the replay replaces it)
    replays: dict[str, float] = field(default_factory=dict)  # relay: seconds, by kind
    replays_same_tokens: bool = True
    generated: int = 0  # stream modes: vLLM's settled token counters over it, both servers
    cuts: int = 0  # stream modes: requests the client closed at a stop string
    speculative: tuple[int, int] = (0, 0)  # relay: hand-offs opened ahead (used, closed unused)

    @property
    def quiet(self) -> bool:
        """Nobody else used the servers, or much CPU, during it and its round's rates."""
        rates_quiet = all(r.quiet for r in self.rates.values())
        return rates_quiet and self.foreign_cores < QUIET and self.foreign_requests == 0

    @property
    def text_ok(self) -> bool:
        return self.text == self.expected

    def completion(self, role: str) -> int:
        return sum(r.completion_tokens for r in self.requests if r.role == role)

    @property
    def prefilled(self) -> int:
        return sum(r.prefilled for r in self.requests)

    @property
    def min_text(self) -> int:
        return sum(r.min_text for r in self.requests)

    @property
    def canonical_share(self) -> float:
        """Tokens of the returned texts (their own tokenization) over the tokens generated:
        ~1 when the model wrote the canonical tokens, ~0.5 under the plain regex forcing."""
        total = sum(r.completion_tokens for r in self.requests)
        return sum(r.text_tokens for r in self.requests) / total if total else float("nan")

    @property
    def ratio(self) -> float:
        return self.wall / self.ideal if self.ideal else float("nan")

    def divergence(self) -> str:
        if self.text_ok:
            return ""
        at = next(
            (i for i, (a, b) in enumerate(zip(self.text, self.expected, strict=False)) if a != b),
            min(len(self.text), len(self.expected)),
        )
        return f"differs at char {at}: got {self.text[at : at + 40]!r}, trace {self.expected[at : at + 40]!r}"

    def summary(self) -> dict[str, Any]:
        return {
            "approach": self.approach,
            "mode": self.mode,
            "trace": self.trace,
            "run": self.run,
            "wall": self.wall,
            "ideal": self.ideal,
            "ratio": self.ratio,
            "ideal_parts": self.ideal_parts,
            "prepare": self.prepare,
            "requests": len(self.requests),
            "switches": self.switches,
            "completion": {r: self.completion(r) for r in ("large", "small")},
            "prefilled": self.prefilled,
            "min_text": self.min_text,
            "prompt_mismatches": sum(r.prompt_mismatch for r in self.requests),
            "text_ok": self.text_ok,
            "divergence": self.divergence(),
            "token_forcing_fallbacks": self.fallbacks,
            "canonical_share": self.canonical_share,
            "load": self.load,
            "foreign_cores": self.foreign_cores,
            "foreign_requests": self.foreign_requests,
            "foreign_tokens": self.foreign_tokens,
            "replays": self.replays,
            "replays_same_tokens": self.replays_same_tokens,
            "generated": self.generated,
            "cuts": self.cuts,
            "speculative_handoffs": self.speculative[0],
            "speculative_misses": self.speculative[1],
            "per_request": [
                {**r.summary(), "start": r.sent - self.requests[0].sent} for r in self.requests
            ],
        }
