"""Where the reasoning is in a generated text, and what of it may be shown yet.

The prompt decides how a generation starts: an R1-style template opens the reasoning in the
prompt, a Qwen3 template lets the model write the opener itself, and a template with thinking
disabled closes it in the prompt. :class:`Releaser` turns a growing transcript into visible
text, holding back what is not certain yet (a half-written marker, trailing whitespace that a
hand-off may trim), so streamed deltas never have to be taken back.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum

from .config import ReasoningMarkers


class PromptReasoning(Enum):
    OPEN = "open"  # the prompt ends inside an opened reasoning block (DeepSeek-R1 templates)
    MODEL_OPENS = "model_opens"  # the model writes the opener itself (Qwen3)
    CLOSED = "closed"  # the prompt already closed the reasoning (thinking disabled)

    @classmethod
    def of(cls, prompt: str, markers: ReasoningMarkers) -> PromptReasoning:
        tail = prompt.rstrip()
        if tail.endswith(markers.start):
            return cls.OPEN
        if tail.endswith(markers.end):
            return cls.CLOSED
        return cls.MODEL_OPENS

    @classmethod
    def of_ids(
        cls, prompt: Sequence[int], start: Sequence[int], end: Sequence[int]
    ) -> PromptReasoning:
        """:meth:`of` for a prompt in token ids, given the markers' ids: the last marker
        among the prompt's last ids (a template's generation prompt ends with its marker and
        at most a little whitespace: :data:`MARKER_TAIL` ids; a marker in a message stands
        before the end-of-turn and role tokens, further back)::

            PromptReasoning.of_ids([9, 151667, 198], start=[151667], end=[151668])  # OPEN
        """
        tail = list(prompt[-(max(len(start), len(end)) + MARKER_TAIL) :])
        opened, closed = _last_index(tail, start), _last_index(tail, end)
        if closed > opened:
            return cls.CLOSED
        return cls.OPEN if opened >= 0 else cls.MODEL_OPENS


MARKER_TAIL = 3
"""Ids a prompt may hold after its reasoning marker (whitespace: ``\n``, ``\n\n``)."""


def _last_index(ids: list[int], part: Sequence[int]) -> int:
    """Where `part` last starts in `ids` (-1: nowhere)."""
    n = len(part)
    return next((i for i in range(len(ids) - n, -1, -1) if ids[i : i + n] == list(part)), -1)


def split_reasoning(text: str, markers: ReasoningMarkers, mode: PromptReasoning) -> tuple[str, str]:
    """(reasoning, answer) of a finished generation, without the markers. The reasoning is
    stripped; after a reasoning the answer loses its leading whitespace (the blank line a
    template puts after the end of reasoning), and it keeps its end as the model or a stop
    string left it: vLLM's text, a trailing space before a stop included. A prompt that
    closed the reasoning itself (thinking off) already holds that blank line: the whole
    text is the answer, as the model's own chat endpoint gives it."""
    if mode is PromptReasoning.CLOSED:
        return "", text
    body = text.lstrip()
    if mode is PromptReasoning.MODEL_OPENS:
        if not body.startswith(markers.start):
            return "", body
        body = body[len(markers.start) :]
    reasoning, found, answer = body.partition(markers.end)
    return reasoning.strip(), answer.lstrip() if found else ""


class Releaser:
    """Releases the visible text of one phase from a transcript that grows at its end.

    ``opener`` is skipped if the phase starts with it; ``closer`` ends the phase and is never
    released. Leading whitespace of the phase is not released unless ``keep_lead`` (an answer
    that a prompt began: nothing came before it to trim), and trailing whitespace is
    held back until more text comes (a hand-off may trim it); at the phase's end (``final``)
    it is released if ``keep_end`` (the answer, whose streamed text adds up to
    :func:`split_reasoning`'s answer) and dropped otherwise (the reasoning, stripped). A
    possible half-written closer is held back until more text (or ``final``) decides.
    """

    def __init__(
        self,
        start: int,
        opener: str | None = None,
        closer: str | None = None,
        *,
        keep_end: bool = False,
        keep_lead: bool = False,
    ) -> None:
        self.pos = start
        self.opener = opener
        self.closer = closer
        self.keep_end = keep_end
        self.started = keep_lead

    def release(self, transcript: str, final: bool = False) -> str:
        self.pos = min(self.pos, len(transcript))
        if not self.started and not self._skip_lead(transcript, final):
            return ""
        end = len(transcript)
        if self.closer is not None:
            found = transcript.find(self.closer, max(self.pos - len(self.closer), 0))
            if found != -1 and found >= self.pos:
                end = found
            elif not final:
                end -= partial_suffix(transcript, self.closer)
        chunk = transcript[self.pos : end]
        if not (final and self.keep_end):
            chunk = chunk.rstrip()  # trailing space: a hand-off may trim it
        self.pos += len(chunk)
        return chunk

    def _skip_lead(self, transcript: str, final: bool) -> bool:
        rest = transcript[self.pos :]
        lead = rest.lstrip()
        if not final and (not lead or (self.opener and self.opener.startswith(lead))):
            return False  # nothing visible yet, or it could still become the opener
        skip = len(rest) - len(lead)
        if self.opener and lead.startswith(self.opener):
            after = lead[len(self.opener) :]
            skip += len(self.opener) + len(after) - len(after.lstrip())
            if not after.strip() and not final:
                return False  # opener seen; wait for its first visible character
        self.pos += skip
        self.started = True
        return True


def starts_with(text: str, opener: str) -> bool | None:
    """Whether `text` (leading whitespace ignored) starts with `opener`; None if undecided."""
    lead = text.lstrip()
    if opener.startswith(lead):
        return None
    return lead.startswith(opener)


def partial_suffix(text: str, marker: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `marker`."""
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0
