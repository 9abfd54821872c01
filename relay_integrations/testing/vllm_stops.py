"""vLLM's stop strings as its detokenizer applies them, in plain Python: the rule the scripted
server (:mod:`.scripted_vllm`) stops by, and the reference the relay's own stream-side stops
are tested against.

A transcription of vLLM 0.32's ``vllm/v1/engine/detokenizer.py``. After each engine step
(:meth:`StopText.update` with the step's new text) ``check_stop_strings`` looks for the stop
strings that end in the new text and takes the one that ends first (a tie goes to the first in
the request's list); the text is then cut at that stop's start
(``include_stop_str_in_output=False``, vLLM's default) or just after it. While the request
runs, a streamed delta holds back the last ``len(longest stop) - 1`` characters when stops are
left out (``stop_buffer_length``), so that no part of a stop string is sent before it is cut;
the last delta, once the request has finished, sends the rest::

    text = StopText(["Louvre"], include_in_output=False)
    text.update(" It has the Lou")   # None: no stop yet
    text.delta(finished=False)       # " It has th": "e Lou" may begin "Louvre"
    text.update("vre and")           # "Louvre": the text is now " It has the "
    text.delta(finished=True)        # "e ": the rest of it, trailing space kept
"""

from __future__ import annotations

import sys
from collections.abc import Sequence


def check_stop_strings(
    output_text: str, new_char_count: int, stop: Sequence[str], include_in_output: bool
) -> tuple[str, int] | None:
    """vLLM's ``check_stop_strings``: ``(stop string, length to cut the text to)`` for the
    stop string that ends first among those ending in the last `new_char_count` characters
    (-1: no cut, the text ends with the stop), or None."""
    if not new_char_count or not stop:
        return None
    best_stop, best_index, best_end = None, 0, sys.maxsize
    for stop_str in stop:
        # vLLM searches from where a stop ending in the new text could begin
        index = output_text.find(stop_str, 1 - new_char_count - len(stop_str))
        if index != -1 and index + len(stop_str) < best_end:
            best_stop, best_index, best_end = stop_str, index, index + len(stop_str)
    if best_stop is None:
        return None
    if include_in_output:
        return best_stop, -1 if best_end >= len(output_text) else best_end
    return best_stop, best_index


class StopText:
    """The text of one request as vLLM's detokenizer keeps it: stop strings applied step by
    step, and the deltas a stream sends (``get_next_output_text`` with ``delta=True``)."""

    def __init__(self, stops: Sequence[str], *, include_in_output: bool) -> None:
        if not all(stops):
            raise ValueError("stop cannot contain an empty string.")  # vLLM's 400
        self.stops = list(stops)
        self.include_in_output = include_in_output
        self.buffer_length = max(map(len, stops)) - 1 if stops and not include_in_output else 0
        """Characters a delta holds back while the request runs (``stop_buffer_length``)."""
        self.text = ""
        self._sent = 0

    def update(self, new_text: str, *, check: bool = True) -> str | None:
        """Add one step's text; the stop string it completes (the text is then cut), or None.
        `check` False: a step within ``min_tokens``, whose stops do not count."""
        self.text += new_text
        if not check:
            return None
        found = check_stop_strings(self.text, len(new_text), self.stops, self.include_in_output)
        if found is None:
            return None
        stop, truncate_to = found
        if truncate_to != -1:
            self.text = self.text[:truncate_to]
        return stop

    def delta(self, finished: bool) -> str:
        """The text a streamed chunk sends now: what is new, less what is held back unless
        the request has `finished`."""
        end = len(self.text) - (0 if finished else self.buffer_length)
        if end <= self._sent:
            return ""
        sent, self._sent = self._sent, end
        return self.text[sent:end]
