"""Switch cues as a value object that matches whole words only.

A cue matches where it stands as a word: preceded by a space or a line break, and, when it
ends in a letter, followed by a space, a line break or ``, : .``. So ``now`` does not fire
inside ``know``, ``Now`` not inside ``Nowhere``, ``Other`` not inside ``Otherwise``, ``Any``
not inside ``Anyway``, and ``so `` not inside ``Also ``. vLLM stop strings are plain
substrings, so the cue set compiles to every boundary combination; the regex used by
calibration is built from the same two boundary sets, so both agree by construction.

The hand-off point is the end of the match without trailing whitespace: after ``So `` the
small model continues from ``So`` and writes its own `` the`` token, never after a dangling
space or half a token::

    cues = CueSet.from_list(["Therefore", "So "])
    [m.cue for m in cues.finditer("Also know. So the sum. Therefore, x")]  # ['So ', 'Therefore']
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from .artifact import CueArtifact, ModelPair, load_artifact

LEFT_BOUNDARIES = (" ", "\n")
"""A cue starts after one of these characters."""

RIGHT_BOUNDARIES = (" ", ",", ":", ".", "\n")
"""A cue that ends in a word character must be followed by one of these."""


@dataclass(frozen=True)
class CueMatch:
    """One occurrence of a cue: ``text[start:handoff]`` is the cue with its right boundary."""

    cue: str
    start: int
    handoff: int


@dataclass(frozen=True)
class PendingCue:
    """A cue that the next token may complete: the hand-off is at the text's end plus
    ``completion`` once that is written, followed by one of ``confirmed_by`` (nothing need
    follow when ``confirmed_by`` is empty: the stop string fires at once)."""

    completion: str
    confirmed_by: str


@dataclass(frozen=True)
class CueSet:
    """An immutable set of switch cues, from an artifact or given inline."""

    cues: tuple[str, ...]
    source: str = "inline"
    model_pair: ModelPair | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not self.cues:
            raise ValueError("a cue set needs at least one cue")
        for cue in self.cues:
            if not cue.strip() or cue != cue.lstrip():
                raise ValueError(f"cue {cue!r} must be a word without leading whitespace")

    @classmethod
    def from_list(cls, cues: Iterable[str], source: str = "inline") -> CueSet:
        return cls(tuple(dict.fromkeys(cues)), source=source)

    @classmethod
    def from_artifact(cls, artifact: CueArtifact, source: str) -> CueSet:
        return cls(tuple(artifact.cues), source=source, model_pair=artifact.model_pair)

    @classmethod
    def load(cls, source: str | Path | Iterable[str]) -> CueSet:
        """A cue set from an artifact path, ``builtin:NAME``, or a list of cues."""
        if isinstance(source, str | Path):
            return cls.from_artifact(load_artifact(source), str(source))
        return cls.from_list(source)

    @cached_property
    def stop_strings(self) -> tuple[str, ...]:
        """The vLLM stop strings that fire exactly on the whole-word occurrences."""
        stops: dict[str, None] = {}
        for cue in self.cues:
            for body in _bodies(cue):
                for left in LEFT_BOUNDARIES:
                    stops[left + body] = None
        return tuple(stops)

    @cached_property
    def _pending(self) -> dict[str, PendingCue]:
        pending: dict[str, PendingCue] = {}
        for cue in self.cues:
            word = cue.rstrip()
            if word[-1].isalnum():  # "Now", "So ": the hand-off is here once a space follows
                spaces = "".join(b for b in RIGHT_BOUNDARIES if not b.strip())
                confirm = spaces if word == cue else cue[len(word)]
                for left in LEFT_BOUNDARIES:
                    pending.setdefault(left + word, PendingCue("", confirm))
            elif len(word) > 1 and word[-2].isalnum():  # "Therefore,": after its mark
                for left in LEFT_BOUNDARIES:  # preferred where "X" and "X," are both cues
                    pending[left + word[:-1]] = PendingCue(word[-1], "")
        return pending

    @cached_property
    def _pending_ends(self) -> tuple[str, ...]:
        return tuple(sorted(self._pending, key=len, reverse=True))

    def pending(self, text: str) -> PendingCue | None:
        """The cue that the next token may complete at the end of `text`, if any.

        `` Now`` hands off at its end once a space follows (`` Now we``, not ``Nowhere``;
        after ``Now,`` the hand-off is past the comma), `` Therefore`` hands off past the
        comma once it is written. Where both ``X`` and ``X,`` are cues, the comma is
        expected::

            cues = CueSet.from_list(["Now", "Therefore,"])
            cues.pending("x. Now")  # PendingCue(completion='', confirmed_by=' \\n')
            cues.pending("x. Therefore")  # PendingCue(completion=',', confirmed_by='')
        """
        if not text.endswith(self._pending_ends):
            return None
        return next(self._pending[end] for end in self._pending_ends if text.endswith(end))

    @cached_property
    def _pattern(self) -> re.Pattern[str]:
        bodies = sorted({b for cue in self.cues for b in _bodies(cue)}, key=len, reverse=True)
        left = "".join(re.escape(c) for c in LEFT_BOUNDARIES)
        return re.compile(f"(?<=[{left}])(?:{'|'.join(re.escape(b) for b in bodies)})")

    def finditer(self, text: str, start: int = 0) -> Iterator[CueMatch]:
        """Every whole-word cue occurrence in `text`, left to right, not overlapping."""
        for m in self._pattern.finditer(text, start):
            yield self._match(text, m.start(), m.group())

    def match_stop(self, text: str, stop_string: str) -> CueMatch | None:
        """The cue that `stop_string` (a vLLM ``stop_reason``) fired on at the end of `text`."""
        if stop_string not in self.stop_strings or not text.endswith(stop_string):
            return None
        start = len(text) - len(stop_string) + 1
        return self._match(text, start, stop_string[1:])

    def _match(self, text: str, start: int, body: str) -> CueMatch:
        cue = body if body in self.cues else body[:-1]
        handoff = start + len(body.rstrip())
        return CueMatch(cue=cue, start=start, handoff=handoff)


def _bodies(cue: str) -> list[str]:
    """The cue with each right boundary it may be followed by (itself if it ends in one)."""
    if cue[-1].isalnum():
        return [cue + right for right in RIGHT_BOUNDARIES]
    return [cue]
