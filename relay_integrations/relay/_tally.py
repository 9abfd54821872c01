"""What one generation has used so far: tokens per model and in the reasoning, time per model,
the streams resumed and the time spent waiting for a server::

    tally = Tally()
    tally.count("large", "reasoning", turn_usage, prompt=120, cached=96, completion=14)
    tally.generated  # 14
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..upstream.config import ModelRole
from .config import Phase
from .result import ModelUsage


@dataclass
class Tally:
    usage: dict[ModelRole, ModelUsage] = field(
        default_factory=lambda: {"large": ModelUsage(), "small": ModelUsage()}
    )
    reasoning_tokens: int = 0
    seconds: dict[str, float] = field(default_factory=lambda: {"large": 0.0, "small": 0.0})
    resumes: int = 0
    """Streams that broke mid-way and went on from the text so far."""
    waited: float = 0.0
    """Seconds spent waiting for a server to come back."""

    @property
    def generated(self) -> int:
        return sum(u.completion_tokens for u in self.usage.values())

    def count(
        self,
        role: ModelRole,
        phase: Phase,
        turn: ModelUsage,
        prompt: int,
        cached: int | None,
        completion: int,
    ) -> None:
        """Add one request's usage to its turn's (`turn`), its model's and the reasoning's."""
        turn.add(prompt, cached, completion)
        self.usage[role].add(prompt, cached, completion)
        if phase == "reasoning":
            self.reasoning_tokens += completion
