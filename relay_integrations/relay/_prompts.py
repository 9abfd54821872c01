"""What each model of a generation is sent as its prompt: its rendered chat, then the
transcript so far.

On the token path each model keeps the transcript in its own token ids (a
:class:`TokenTrack`): the ids it wrote itself, as its server returned them, and the ids of
text it did not write (the other model's, a marker the relay wrote), tokenized once, alone, by
its server when the next request is sent. A request then carries ids the server has all seen
(its prefix cache holds them) and a short text: no server tokenizes a long context again, and
the model continues from the very tokens it wrote. Two models whose servers render the chat to
the same ids share one track (one tokenizer: the other model's ids are its own).

On the text path (a renderer that gives text only) the prompt is the rendered text plus the
transcript, as every server takes it::

    prompts = Prompts({"large": RenderedIds((1, 2)), "small": RenderedIds((1, 2))})
    prompts.of("large", transcript)  # TokenPrompt(ids=(1, 2, ...), text=<not yet tokenized>)
    track = prompts.track("large")    # fed the pieces of large's requests (see TokenTrack)
    prompts.cut(len(kept))            # the transcript was cut: no track covers what was cut
"""

from __future__ import annotations

from collections.abc import Mapping

from ..upstream.completion import TokenPrompt
from ..upstream.config import ModelRole
from ..upstream.rendering import RenderedIds, RenderedPrompt


class TokenTrack:
    """One tokenizer's ids of a generation's transcript: the prompt's, then those of the
    transcript's first :attr:`covered` characters.

    Ids are known to stand for a text only at a *mark*: after a streamed piece with text
    (a piece's ids may run ahead of its text: half a character, the start of a possible stop),
    after a tokenized text. A cut, and the end of a request, go back to a mark; the text
    past it is tokenized again with the next request. The last piece of a request that ended
    at a stop string is dropped too: vLLM cuts the text at the stop's end, and the token that
    completed the stop may hold more (`` we`` after the cue `` Now ``)::

        track = TokenTrack((7, 8))
        prompt = track.prompt("so far")       # TokenPrompt((7, 8), "so far")
        track.sent(prompt, [40, 41])          # its text's ids, from the first piece
        track.wrote(" we", [42])              # each piece the model writes
        track.ended(at_stop_string=False)
    """

    def __init__(self, prompt_ids: tuple[int, ...]) -> None:
        self._ids = list(prompt_ids)
        self._snapshot: tuple[int, ...] | None = prompt_ids
        self._marks: list[tuple[int, int]] = [(0, len(prompt_ids))]  # (covered, ids)
        self._first_mark = 0  # the first mark of the request being followed
        self._following = False
        self.covered = 0
        """Characters of the transcript the ids stand for."""

    def prompt(self, transcript: str) -> TokenPrompt:
        """The prompt that writes on from `transcript` (whose first :attr:`covered`
        characters are those the ids stand for)."""
        if self._snapshot is None:  # up to the last mark: not ids that run ahead of text
            self._snapshot = tuple(self._ids[: self._marks[-1][1]])
        return TokenPrompt(self._snapshot, transcript[self.covered :])

    def sent(self, prompt: TokenPrompt, tail_ids: list[int] | None, follow: bool) -> None:
        """A request sent with `prompt` (made by :meth:`prompt` from the track as it is)
        began to answer, its text tokenized to `tail_ids` (None: the server did not say);
        `follow`: the pieces it writes come to :meth:`wrote` (not where they may lag their
        ids to the end: stops left out of the text, whose start vLLM holds back)."""
        self._following = False
        current = prompt.ids is self._snapshot or prompt.ids == self._snapshot
        if tail_ids is None or not current:
            return
        if prompt.text:
            self._extend(tail_ids, len(prompt.text))
        self._following, self._first_mark = follow, len(self._marks) - 1

    def wrote(self, text: str, ids: list[int] | None) -> None:
        """A piece of the followed request: its text and the ids the server returned."""
        if not self._following:
            return
        if ids is None:  # a server that returns no ids: the text is tokenized next time
            self.ended(at_stop_string=False)
            return
        if ids:  # _extend, inline: this runs for every token
            self._ids += ids
            self._snapshot = None
        if text:
            self.covered += len(text)
            self._marks.append((self.covered, len(self._ids)))

    def ended(self, at_stop_string: bool) -> None:
        """The followed request ended (or broke: `at_stop_string` then too, its last piece
        unsure): back to its last mark, before its last piece at a stop string."""
        if self._following and at_stop_string and len(self._marks) - 1 > self._first_mark:
            self._marks.pop()
        self._following = False
        self._back_to(self._marks[-1])

    def cut(self, length: int) -> None:
        """The transcript was cut to `length` characters."""
        if length < self.covered:
            while self._marks[-1][0] > length:
                self._marks.pop()
            self._first_mark = min(self._first_mark, len(self._marks) - 1)
            self._back_to(self._marks[-1])

    def _extend(self, ids: list[int], characters: int) -> None:
        if ids:
            self._ids += ids
            self._snapshot = None
        if characters:
            self.covered += characters
            self._marks.append((self.covered, len(self._ids)))

    def _back_to(self, mark: tuple[int, int]) -> None:
        self.covered, count = mark
        if len(self._ids) > count:
            del self._ids[count:]
            self._snapshot = None


class Prompts:
    """Each model's prompt for a transcript: token ids where the chat was rendered to ids
    (:class:`TokenTrack`, one per tokenizer), else the rendered text and the transcript."""

    def __init__(self, rendered: Mapping[ModelRole, RenderedPrompt | RenderedIds]) -> None:
        self.rendered: dict[ModelRole, RenderedPrompt | RenderedIds] = {}
        self._tracks: dict[ModelRole, TokenTrack] = {}
        for role, prompt in rendered.items():
            self.add(role, prompt)

    def add(self, role: ModelRole, prompt: RenderedPrompt | RenderedIds) -> None:
        """`role`'s rendered prompt, given before any of its requests is built (one rendered
        later than the others': before a piece of theirs is read). A model whose ids are
        another's shares its track."""
        self.rendered[role] = prompt
        if isinstance(prompt, RenderedIds):
            same = (r for r, p in self.rendered.items() if r in self._tracks and p == prompt)
            shared = next(same, None)
            self._tracks[role] = self._tracks[shared] if shared else TokenTrack(prompt.ids)

    @property
    def path(self) -> str:
        """``"tokens"`` or ``"text"``: how the generation's prompts are sent."""
        return "tokens" if self._tracks else "text"

    def of(self, role: ModelRole, transcript: str) -> str | TokenPrompt:
        """`role`'s prompt to write on from `transcript`."""
        track = self._tracks.get(role)
        if track is not None:
            return track.prompt(transcript)
        rendered = self.rendered[role]
        assert isinstance(rendered, RenderedPrompt)
        return rendered.text + transcript

    def track(self, role: ModelRole) -> TokenTrack | None:
        """`role`'s track (None on the text path)."""
        return self._tracks.get(role)

    def cut(self, length: int) -> None:
        """The transcript was cut to `length` characters: no track stands for more."""
        for track in set(self._tracks.values()):
            track.cut(length)
