"""What the caller may see of a generation's transcript so far, phase by phase: the
reasoning's markers and the whitespace a hand-off may still trim are held back
(:class:`~.reasoning.Releaser`), and the time of the first visible text is kept::

    visible = VisibleText(markers, PromptReasoning.MODEL_OPENS, "reasoning", started)
    visible.reasoning_opened(transcript, "reasoning")  # None until the model's first words
    visible.release(transcript, "large", "reasoning")  # [TextDelta(...)] or []
"""

from __future__ import annotations

import time

from ..upstream.config import ModelRole
from .config import Phase, ReasoningMarkers
from .reasoning import PromptReasoning, Releaser, starts_with
from .result import TextDelta


class VisibleText:
    def __init__(
        self, markers: ReasoningMarkers, mode: PromptReasoning, phase: Phase, started: float
    ) -> None:
        self.markers = markers
        self.mode = mode
        self.started = started
        self.first_token_at: float | None = None
        """Seconds from the generation's start to its first visible text."""
        self._releaser = self._new(0, phase)

    @property
    def released_to(self) -> int:
        """The transcript position up to which text was released (or skipped): what lies
        before it the caller has seen, and must stay as it is."""
        return self._releaser.pos

    def restart(self, start: int, phase: Phase) -> None:
        """A new phase begins at transcript position `start`."""
        self._releaser = self._new(start, phase)

    def reasoning_opened(self, transcript: str, phase: Phase) -> bool | None:
        """Whether the model opened the reasoning, where the model opens it itself and
        nothing is released yet (None: its first words do not tell yet); True otherwise."""
        if (
            phase != "reasoning"
            or self.mode is not PromptReasoning.MODEL_OPENS
            or self._releaser.started
        ):
            return True
        return starts_with(transcript, self.markers.start)

    def release(self, transcript: str, role: ModelRole, phase: Phase) -> list[TextDelta]:
        """The text that became certain since the last release."""
        text = self._releaser.release(transcript)
        if not text:
            return []
        if self.first_token_at is None:
            self.first_token_at = time.perf_counter() - self.started
        return [TextDelta(text, role, phase)]

    def flush(self, transcript: str, role: ModelRole, phase: Phase) -> list[TextDelta]:
        """What was held back, at the end of a phase or of the generation."""
        text = self._releaser.release(transcript, final=True)
        return [TextDelta(text, role, phase)] if text else []

    def _new(self, start: int, phase: Phase) -> Releaser:
        if phase == "answer":
            return Releaser(start, keep_end=True, keep_lead=self.mode is PromptReasoning.CLOSED)
        opener = self.markers.start if self.mode is PromptReasoning.MODEL_OPENS else None
        return Releaser(start, opener=opener, closer=self.markers.end)
