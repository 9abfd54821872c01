"""Stop strings found in the stream, for a server that takes fewer than the relay needs.

vLLM caps the stop strings of a request (``VLLM_MAX_STOP_STRINGS``, 4 unless the server was
started with more), and a cue set compiles to about 150. The endpoint sends the ones that
fit (the end of reasoning and the sentence ends first) and watches the stream for the rest:
at the first one it cuts the text where vLLM would have (just after the stop string, as with
``include_stop_str_in_output``) and closes the request, which vLLM aborts. The turn then
sees the same text and the same ``stop_reason`` either way, so its decisions are the same::

    watch = StreamStops([" Now,", " Therefore,"])
    watch.feed("We have x. No")        # None: nothing yet (" No" may become " Now,")
    watch.feed("w, the rest")          # ("w,", " Now,"): keep "w,", the request is over
"""

from __future__ import annotations

import re
from collections.abc import Sequence


class StreamStops:
    """Finds the first of `stops` in a text that arrives in pieces."""

    def __init__(self, stops: Sequence[str]) -> None:
        if not stops or not all(stops):
            raise ValueError("StreamStops needs non-empty stop strings")
        self.stops = tuple(stops)
        self._longest = max(len(s) for s in self.stops)
        # one search a piece, not one per stop string: ~150 cues cost a regex scan of a
        # window as long as the longest stop, whatever the length of the text so far
        self._pattern = re.compile(
            "|".join(re.escape(s) for s in sorted(self.stops, key=len, reverse=True))
        )
        self._tail = ""  # the end of the text so far that a stop string could still complete

    def feed(self, piece: str) -> tuple[str, str] | None:
        """``(the part of piece to keep, the stop string)`` once a stop string is complete,
        else None. The kept part ends just after the stop string."""
        window = self._tail + piece
        match = self._pattern.search(window)
        if match is None:
            self._tail = window[max(0, len(window) - self._longest + 1) :]
            return None
        return piece[: match.end() - len(self._tail)], match.group()
