"""Stop strings found in a stream that arrives in pieces, cut where vLLM cuts."""

from __future__ import annotations

import random

import pytest

from relay_integrations.relay.cues import CueSet
from relay_integrations.upstream._stream_stops import StreamStops

CUES = CueSet.from_list(["Therefore,", "Now", "So ", "Wait"])


def cut(stops: StreamStops, pieces: list[str]) -> tuple[str, str | None]:
    """The text kept up to and with the first stop string, and that stop (None: no stop)."""
    kept = ""
    for piece in pieces:
        hit = stops.feed(piece)
        if hit is not None:
            return kept + hit[0], hit[1]
        kept += piece
    return kept, None


def vllm_cut(pieces: list[str], stops: tuple[str, ...]) -> tuple[str, str | None]:
    """vLLM's own rule (``check_stop_strings``), a piece being a token: after each one, the
    first stop string in list order found in the new text; the output ends just after it."""
    text = ""
    for piece in pieces:
        text += piece
        for stop in stops:
            at = text.find(stop, max(0, len(text) - len(piece) - len(stop) + 1))
            if at != -1:
                return text[: at + len(stop)], stop
    return text, None


def test_a_stop_split_across_pieces_is_found_when_it_completes() -> None:
    stops = StreamStops(CUES.stop_strings)
    assert stops.feed("We have x. No") is None  # " No" may still become " Now,"
    assert stops.feed("w, the rest") == ("w,", " Now,")


def test_a_cue_inside_a_word_is_not_a_stop() -> None:
    text = ["I know", " that Nowhere", " is Otherwise", " and So", "me too."]
    assert cut(StreamStops(CUES.stop_strings), text) == ("".join(text), None)


@pytest.mark.parametrize("seed", range(200))
def test_any_split_of_a_text_cuts_where_vllm_would(seed: int) -> None:
    """Random texts of cue words in token-sized pieces (1-4 characters: one piece cannot
    complete two stop strings, so vLLM's list order never decides between them)."""
    rng = random.Random(seed)
    words = ["the", "sum", "Now", "now", "know", "Therefore,", "So", "so", "Also", "Wait", "."]
    text = "".join(rng.choice([" ", "\n", ", "]) + rng.choice(words) for _ in range(30))
    pieces, at = [], 0
    while at < len(text):
        size = rng.randint(1, 4)
        pieces.append(text[at : at + size])
        at += size
    assert cut(StreamStops(CUES.stop_strings), pieces) == vllm_cut(pieces, CUES.stop_strings)


def test_empty_stops_are_refused() -> None:
    with pytest.raises(ValueError, match="non-empty"):
        StreamStops(["", " Now"])
