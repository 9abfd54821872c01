"""Stop strings found in the stream, for a server that takes fewer than a request has.

vLLM caps the stop strings of a request (``VLLM_MAX_STOP_STRINGS``, 4 unless the server was
started with more), and a cue set compiles to about 150; a caller may give more than 4 too.
The endpoint sends the ones that fit (the end of reasoning and the sentence ends first), with
``include_stop_str_in_output`` on so that the server shows every stop it writes, and cuts the
stream itself where vLLM would have with all of them (:class:`StreamStops`): at the stop
string that ends first (a tie goes to the first in the list), just after it when the request
keeps stops in the output (the relay's cues), at its start when it leaves them out (a
caller's stops). Leaving them out, it holds back the last ``len(longest stop) - 1``
characters while the stream runs, as vLLM does, so no part of a stop string is ever passed on
and then taken back; the end of the stream releases them. The turn sees the same text and the
same ``stop_reason`` either way, so its decisions are the same. A resumed request's stream is
watched the same way from the text the interrupted one wrote (``written``): a stop string
begun there ends the request where the uninterrupted one would have ended::

    watch = StreamStops([" Now,", " Therefore,"], include_in_output=True)
    watch.feed("We have x. No")        # ("We have x. No", None): nothing yet
    watch.feed("w, the rest")          # ("w,", " Now,"): keep "w,", the request is over

    watch = StreamStops([" Therefore,"], include_in_output=True, written="best. Ther")
    watch.feed("efore, I")             # ("efore,", " Therefore,"): it began before the piece

    watch = StreamStops(["Louvre"], include_in_output=False)
    watch.feed(" It has the Lou")      # (" It has th", None): "e Lou" may begin "Louvre"
    watch.feed("vre")                  # ("e ", "Louvre"): the text ends before the stop
"""

from __future__ import annotations

import functools
import re
import sys
from collections.abc import Sequence


class StreamStops:
    """Cuts a text that arrives in pieces at the first of `stops`, as vLLM's detokenizer
    does (``check_stop_strings``, ``stop_buffer_length``)."""

    def __init__(self, stops: Sequence[str], *, include_in_output: bool, written: str = "") -> None:
        if not stops or not all(stops):
            raise ValueError("StreamStops needs non-empty stop strings")
        self.stops = tuple(stops)
        self.include_in_output = include_in_output
        self.stop: str | None = None
        """The stop string the text ended at, once found."""
        self.began_before = False
        """Whether that stop began in the text written before (``written``): a server that
        was given it cannot have ended there."""
        self._reach = max(len(s) for s in self.stops) - 1
        """Characters before a piece that a stop string ending in it may begin in."""
        self._hold = 0 if include_in_output else self._reach
        # one search a piece, not one per stop string: ~150 cues cost a regex scan of a
        # window as long as the longest stop, whatever the length of the text so far
        self._pattern = _pattern(self.stops)
        self._tail = written[-self._reach :] if self._reach else ""  # the last `_reach` so far
        self._unsent = 0  # how many of them are held back
        self._output = 0  # characters fed so far

    def feed(self, piece: str) -> tuple[str, str | None]:
        """``(the text to pass on now, the stop string)``: the stop is None until the text
        reaches one, and the text then ends where vLLM cuts (nothing follows it: every later
        piece gives ``("", stop)``)."""
        if self.stop is not None:
            return "", self.stop
        window = self._tail + piece
        start = len(self._tail) - self._unsent
        self._output += len(piece)
        if self._pattern.search(window) is None:
            end = max(start, len(window) - self._hold)
            self._unsent = len(window) - end
            self._tail = window[-self._reach :] if self._reach else ""
            return window[start:end], None
        cut, self.stop = self._first_stop(window)
        began = cut - len(self.stop) if self.include_in_output else cut
        self.began_before = began < len(window) - self._output
        self._tail, self._unsent = "", 0
        return window[start:cut], self.stop

    def rest(self) -> str:
        """What is held back, passed on when the stream ends without a stop string."""
        held = self._tail[len(self._tail) - self._unsent :]
        self._unsent = 0
        return held

    def _first_stop(self, window: str) -> tuple[int, str]:
        """Where to cut `window`, which holds a stop string, and which one: the one that ends
        first, the first in the list on a tie (vLLM's rule, the same however the text was
        split into pieces: no stop ended in the text before)."""
        cut, first, first_end = 0, "", sys.maxsize
        for stop in self.stops:
            at = window.find(stop)
            if at != -1 and at + len(stop) < first_end:
                first, first_end = stop, at + len(stop)
                cut = first_end if self.include_in_output else at
        return cut, first


@functools.lru_cache(maxsize=64)
def _pattern(stops: tuple[str, ...]) -> re.Pattern[str]:
    """Any of `stops` (compiled once for every request with the same ones: the cue sets)."""
    return re.compile("|".join(re.escape(s) for s in sorted(stops, key=len, reverse=True)))
