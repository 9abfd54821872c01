"""The requests of one generation: the one builder of every turn's request, the real one and
the one opened ahead of a hand-off alike (so that the two agree by construction), and the
number each request sent gets::

    requests = TurnRequests(generation_id, config, turns, prompts, sampling, hook, extra_body)
    request = requests.build(run, turn, "small", allowance=128)
    sent = requests.numbered(request)  # X-Request-Id: <generation id>-<n>
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from types import MappingProxyType
from typing import Any

from ..upstream.config import ModelRole, SamplingConfig
from ..upstream.endpoint import CompletionRequest
from ._prompts import Prompts
from ._turns import MethodTurns, RunState, Turn
from .config import Phase, RelayConfig, RequestHook


class TurnRequests:
    def __init__(
        self,
        generation_id: str,
        config: RelayConfig,
        turns: MethodTurns,
        prompts: Prompts,
        sampling: SamplingConfig,
        request_hook: RequestHook | None,
        extra_body: Mapping[str, Any],
    ) -> None:
        self.generation_id = generation_id
        self.config = config
        self.turns = turns
        self.prompts = prompts
        self.sampling = sampling
        self.request_hook = request_hook
        self.extra_body = extra_body
        self.sent = 0
        self._sampling: dict[ModelRole, Mapping[str, Any]] = {}  # each model's, made once
        self._hooked: tuple[tuple[ModelRole, Phase, str], Mapping[str, Any]] | None = None

    def build(
        self,
        run: RunState,
        turn: Turn,
        role: ModelRole,
        allowance: int,
        transcript: str | None = None,
    ) -> CompletionRequest:
        """The request `turn`'s writer `role` sends to write on from `transcript` (default:
        the run's so far)."""
        transcript = run.transcript if transcript is None else transcript
        body = {**self.extra_body, **self.turns.extra_body(turn, run)}
        if self.request_hook is not None:
            body.update(self._hook(self.request_hook, role, run.phase, transcript))
        return CompletionRequest(
            prompt=self.prompts.of(role, transcript),
            max_tokens=allowance,
            stop=self.turns.stops(turn, run),
            sampling=self._sampling_of(role),
            extra_body=body,
            headers={self.config.session_header: self.generation_id},
            # the answer is the last turn: no later request continues from its ids
            return_token_ids=run.phase == "reasoning",
        )

    def _hook(
        self, hook: RequestHook, role: ModelRole, phase: Phase, transcript: str
    ) -> Mapping[str, Any]:
        """The request hook's fields for (`role`, `phase`, `transcript`): asked once for a
        request opened ahead and the turn's request that it may serve, built from the same
        three (a hook that counts its calls sees one a request)."""
        key = (role, phase, transcript)
        if self._hooked is None or self._hooked[0] != key:
            self._hooked = (key, hook(role, phase, transcript))
        return self._hooked[1]

    def _sampling_of(self, role: ModelRole) -> Mapping[str, Any]:
        """`role`'s sampling fields (the shared ones, its own over them), read only."""
        fields = self._sampling.get(role)
        if fields is None:
            own = self.config.endpoint(role).sampling
            fields = self._sampling[role] = MappingProxyType(self.sampling.request_fields(own))
        return fields

    def prompt_only(self, role: ModelRole) -> CompletionRequest:
        """One token after `role`'s prompt: what warms its server's prefix cache."""
        return CompletionRequest(
            prompt=self.prompts.of(role, ""),
            max_tokens=1,
            extra_body=dict(self.extra_body),
            headers={self.config.session_header: self.generation_id},
            return_token_ids=False,
        )

    def numbered(self, request: CompletionRequest) -> CompletionRequest:
        """The request as sent: vLLM's own request id (its logs, its response ids) is unique
        per request sent."""
        self.sent += 1
        number = {"X-Request-Id": f"{self.generation_id}-{self.sent}"}
        return replace(request, headers={**request.headers, **number})
