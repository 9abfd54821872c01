"""How many tokens a generation may still write: the caller's budget (``max_tokens``, over
both models), each model's context window beyond its prompt, and in the reasoning the
reasoning limit and the answer's reserve::

    budget = Budget(4096, windows={"large": 8192, "small": 8192},
                    prompt_tokens={"large": 300, "small": 310}, policy=SwitchPolicy())
    budget.allowance("small", "reasoning", tally, cap=128, turn_tokens=0)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..upstream.config import ModelRole
from ._tally import Tally
from .config import CONTEXT_MARGIN, Phase, SwitchPolicy
from .result import SegmentEnd


@dataclass(frozen=True)
class Budget:
    max_tokens: int
    windows: Mapping[ModelRole, int | None]
    prompt_tokens: Mapping[ModelRole, int | None]
    policy: SwitchPolicy

    def room(self, role: ModelRole, phase: Phase, tally: Tally, pending: int = 0) -> int:
        """Tokens `role` may still write: the budget, its context window, the reasoning limit
        (`pending`: tokens written and not counted yet)."""
        generated = tally.generated + pending
        room = self.max_tokens - generated
        window, prompt_tokens = self.windows.get(role), self.prompt_tokens.get(role)
        if window is not None and prompt_tokens is not None:
            room = min(room, window - prompt_tokens - generated - CONTEXT_MARGIN)
        return min(room, self.reasoning_room(phase, tally, pending))

    def affords_early_request(self, role: ModelRole, tally: Tally, pending: int = 0) -> bool:
        """Whether a request of `role` may be opened ahead of its hand-off: the context it
        carries (`role`'s prompt, when its renderer counted it, and the tokens written) is
        within ``SwitchPolicy.speculative_handoff_max_tokens``."""
        limit = self.policy.speculative_handoff_max_tokens
        if limit is None:
            return True
        context = (self.prompt_tokens.get(role) or 0) + tally.generated + pending
        return context <= limit

    def reasoning_room(self, phase: Phase, tally: Tally, pending: int = 0) -> int:
        """Tokens the reasoning may still take: its limit, and the answer's reserve."""
        if phase != "reasoning":
            return self.max_tokens
        reserve = min(self.policy.answer_reserve_tokens, self.max_tokens // 4)
        room = self.max_tokens - reserve - tally.generated - pending
        if self.policy.max_reasoning_tokens is not None:
            left = self.policy.max_reasoning_tokens - tally.reasoning_tokens - pending
            room = min(room, left)
        return room

    def allowance(
        self,
        role: ModelRole,
        phase: Phase,
        tally: Tally,
        cap: int | None,
        turn_tokens: int,
        pending: int = 0,
    ) -> int:
        """Tokens the next request of a turn may write: the room left, and the turn's cap
        (`pending`: tokens written and not counted yet, for a request opened ahead of its
        turn: its allowance is what the turn's first request gets once they are counted)."""
        allowance = self.room(role, phase, tally, pending)
        if cap is not None:
            allowance = min(allowance, cap - turn_tokens)
        return allowance

    def out_of_room(
        self, phase: Phase, tally: Tally, cap: int | None, turn_tokens: int
    ) -> SegmentEnd:
        """Why a turn has no allowance left: its cap, or :meth:`spent`."""
        capped = cap is not None and turn_tokens >= cap
        return "segment_cap" if capped else self.spent(phase, tally)

    def spent(self, phase: Phase, tally: Tally) -> SegmentEnd:
        """Why there is no room left: the reasoning limit, or the budget/context."""
        if self.reasoning_room(phase, tally) <= 0 and self.max_tokens > tally.generated:
            return "reasoning_budget"
        return "length"
