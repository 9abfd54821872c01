"""Stop strings applied to a stream that arrives in pieces, exactly as vLLM applies them.

The reference is vLLM's detokenizer transcribed (:mod:`relay_integrations.testing.vllm_stops`),
each piece one engine step; the rule is also stated over the whole text (the stop string that
ends first, the first in the list on a tie; the text cut at its start or just after it), so a
mistake in the transcription would show too.
"""

from __future__ import annotations

import itertools
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relay_integrations.relay.cues import CueSet
from relay_integrations.testing.vllm_stops import StopText
from relay_integrations.upstream._stream_stops import StreamStops

CUES = CueSet.from_list(["Therefore,", "Now", "So ", "Wait"])
EXAMPLES = int(os.environ.get("RELAY_PROPERTY_EXAMPLES", "400"))
"""Examples per property in CI; set RELAY_PROPERTY_EXAMPLES=20000 for a longer search."""
BOUNDED = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def streamed(stops: StreamStops, pieces: list[str]) -> tuple[list[str], str | None]:
    """What the relay passes on for each piece (the held-back rest last, at the stream's end
    without a stop), and the stop it ended at."""
    sent: list[str] = []
    for piece in pieces:
        text, stop = stops.feed(piece)
        sent.append(text)
        if stop is not None:
            return sent, stop
    return [*sent, stops.rest()], None


def vllm_stream(
    stop_list: list[str], include: bool, pieces: list[str]
) -> tuple[list[str], str | None]:
    """What vLLM streams for the same steps: a delta a step, the last once it finished (at a
    stop), or one more delta for the end of the request."""
    text, deltas = StopText(stop_list, include_in_output=include), []
    for piece in pieces:
        stop = text.update(piece)
        deltas.append(text.delta(finished=stop is not None))
        if stop is not None:
            return deltas, stop
    return [*deltas, text.delta(finished=True)], None


def whole_text_rule(text: str, stop_list: list[str], include: bool) -> tuple[str, str | None]:
    """vLLM's rule said over the whole text: the stop string that ends first (ties: the first
    in the list), the text cut at its start (left out) or just after it (kept)."""
    ends = [(text.find(s) + len(s), i) for i, s in enumerate(stop_list) if s in text]
    if not ends:
        return text, None
    end, index = min(ends)
    stop = stop_list[index]
    return text[: end if include else end - len(stop)], stop


# texts of a few letters, so that stop strings occur, overlap and nest often
LETTERS = "ab \n"
texts = st.text(LETTERS, min_size=0, max_size=40)
stop_lists = st.lists(st.text(LETTERS, min_size=1, max_size=6), min_size=1, max_size=8)


@st.composite
def split_texts(draw: st.DrawFn) -> list[str]:
    """A text split into pieces of any size (empty ones too: a chunk of held-back tokens)."""
    text = draw(texts)
    cuts = sorted(draw(st.lists(st.integers(0, len(text)), max_size=12)))
    bounds = [0, *cuts, len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds)]


@BOUNDED
@given(pieces=split_texts(), stop_list=stop_lists, include=st.booleans())
def test_the_pieces_passed_on_are_vllms_own_stream_for_the_same_steps(
    pieces: list[str], stop_list: list[str], include: bool
) -> None:
    sent, stop = streamed(StreamStops(stop_list, include_in_output=include), pieces)
    assert (sent, stop) == vllm_stream(stop_list, include, pieces)


@BOUNDED
@given(pieces=split_texts(), stop_list=stop_lists, include=st.booleans())
def test_the_text_kept_is_the_text_cut_at_the_first_stop_however_it_is_split(
    pieces: list[str], stop_list: list[str], include: bool
) -> None:
    """The concatenation and the stop reason, and nothing passed on is ever cut later: at
    every piece, what was passed on so far is a start of the final text (a part of a stop
    string left out of the text is never shown, then taken back)."""
    kept, stop = whole_text_rule("".join(pieces), stop_list, include)
    sent, found = streamed(StreamStops(stop_list, include_in_output=include), pieces)
    so_far = ""
    for text in sent:
        so_far += text
        assert kept.startswith(so_far), (so_far, kept)
    assert (so_far, found) == (kept, stop)


@BOUNDED
@given(pieces=split_texts(), stop_list=stop_lists, data=st.data())
def test_a_stream_resumed_after_any_piece_ends_where_the_uninterrupted_one_does(
    pieces: list[str], stop_list: list[str], data: st.DataObject
) -> None:
    """The stream broke after some pieces (the relay's cues, kept in the text, had been
    passed on as they came) and a new request goes on from there: watched from what was
    written, it ends at the same stop, with the same text in all, as the stream that did not
    break; the stop began before it iff the uninterrupted one's began in the written part."""
    broken_at = data.draw(st.integers(0, len(pieces)))
    written = "".join(pieces[:broken_at])
    if whole_text_rule(written, stop_list, True)[1] is not None:
        return  # the request had ended at a stop already: nothing is resumed
    kept, stop = whole_text_rule("".join(pieces), stop_list, True)
    watch = StreamStops(stop_list, include_in_output=True, written=written)
    sent, found = streamed(watch, pieces[broken_at:])
    assert (written + "".join(sent), found) == (kept, stop)
    if stop is not None:
        assert watch.began_before == (len(kept) - len(stop) < len(written))


def test_a_stop_split_across_pieces_is_found_when_it_completes() -> None:
    stops = StreamStops(CUES.stop_strings, include_in_output=True)
    assert stops.feed("We have x. No") == ("We have x. No", None)  # " No" may become " Now,"
    assert stops.feed("w, the rest") == ("w,", " Now,")
    assert stops.feed("more") == ("", " Now,")  # the request is over


def test_a_stop_left_out_holds_back_its_possible_start_and_keeps_the_space_before_it() -> None:
    stops = StreamStops(["a1", "a2", "a3", "a4", "Louvre"], include_in_output=False)
    assert stops.feed(" It has the Lou") == (" It has th", None)  # "e Lou" may be "Louvre"
    assert stops.feed("vre and") == ("e ", "Louvre")


def test_the_stop_that_ends_first_wins_over_one_that_starts_first() -> None:
    """vLLM's check_stop_strings, when one step completes two stop strings (a merged chunk,
    speculative decoding)."""
    stops = StreamStops(["abcd", "bc"], include_in_output=True)
    assert stops.feed("xabcd") == ("xabc", "bc")


def test_a_cue_inside_a_word_is_not_a_stop() -> None:
    text = ["I know", " that Nowhere", " is Otherwise", " and So", "me too."]
    stops = StreamStops(CUES.stop_strings, include_in_output=True)
    assert streamed(stops, text) == ([*text, ""], None)


def test_empty_stops_are_refused() -> None:
    with pytest.raises(ValueError, match="non-empty"):
        StreamStops(["", " Now"], include_in_output=True)


@pytest.mark.parametrize("include", [True, False])
def test_the_reference_is_vllms_own_example(include: bool) -> None:
    """The transcription reads like vLLM's detokenizer on a case worked out by hand."""
    text = StopText(["Louvre"], include_in_output=include)
    assert text.update(" It has the Lou") is None
    assert text.delta(finished=False) == (" It has the Lou" if include else " It has th")
    assert text.update("vre and") == "Louvre"
    assert text.delta(finished=True) == ("vre" if include else "e ")
