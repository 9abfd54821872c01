"""A token track always stands for the transcript: whatever the model wrote, however its
requests ended and wherever the transcript was cut, the ids of a prompt and its text are
exactly the rendered prompt and the transcript, and the model's own ids are kept where they
are sure."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from relay_integrations.relay._prompts import Prompts, TokenTrack
from relay_integrations.relay.reasoning import PromptReasoning
from relay_integrations.upstream.completion import TokenPrompt
from relay_integrations.upstream.rendering import RenderedIds, RenderedPrompt

WORDS = ["a", "b", " ", ".", " we", " Now", "é", "\n", "</think>", ",", "xy"]
VOCAB = WORDS + sorted({c for w in WORDS for c in w} - set(WORDS))  # any text tokenizes
PROMPT = (100, 101)  # ids that stand for the rendered prompt (not in VOCAB: decoded apart)


def decode(ids: tuple[int, ...] | list[int]) -> str:
    assert tuple(ids[: len(PROMPT)]) == PROMPT, "the prompt's ids always come first"
    return "".join(VOCAB[i] for i in ids[len(PROMPT) :])


def tokenize(text: str) -> list[int]:
    """A greedy tokenizer over VOCAB (longest match), as a server's /tokenize."""
    ids, i = [], 0
    by_length = sorted(range(len(VOCAB)), key=lambda t: -len(VOCAB[t]))
    while i < len(text):
        token = next(t for t in by_length if text.startswith(VOCAB[t], i))
        ids.append(token)
        i += len(VOCAB[token])
    return ids


def stands_for(prompt: TokenPrompt, transcript: str) -> bool:
    return decode(prompt.ids) + prompt.text == transcript


# A request: the tokens the model writes, how they come in pieces, how it ends.
requests = st.lists(
    st.tuples(
        st.lists(st.integers(0, len(WORDS) - 1), min_size=1, max_size=6),  # tokens written
        st.integers(1, 3),  # tokens a piece
        st.sampled_from(["length", "stop_string", "eos", "broken"]),
        st.integers(0, 2),  # ids the last piece's text is short of (a stop cut its token)
        st.integers(0, 4),  # characters the transcript is cut by afterwards
        st.text(alphabet="ab .", max_size=4),  # text the relay or another model adds
    ),
    min_size=1,
    max_size=6,
)


@settings(max_examples=300, deadline=None)
@given(requests)
def test_a_prompt_always_stands_for_the_transcript(plan: list[Any]) -> None:
    track, transcript = TokenTrack(PROMPT), ""
    for tokens, per_piece, end, short, cut, added in plan:
        prompt = track.prompt(transcript)
        assert stands_for(prompt, transcript)
        track.sent(prompt, tokenize(prompt.text), follow=True)
        pieces = [tokens[i : i + per_piece] for i in range(0, len(tokens), per_piece)]
        for n, ids in enumerate(pieces):
            text = "".join(VOCAB[i] for i in ids)
            if n == len(pieces) - 1 and end in ("stop_string", "broken") and short:
                text = text[: max(len(text) - short, 0)]  # vLLM cut the text at the stop
            transcript += text
            if text or ids:
                track.wrote(text, ids)
        if end == "eos":
            track.wrote("", [len(VOCAB)])  # the end-of-sequence id: no text
        track.ended(at_stop_string=end in ("stop_string", "broken"))
        assert stands_for(track.prompt(transcript), transcript)
        transcript = transcript[: max(len(transcript) - cut, 0)]
        track.cut(len(transcript))
        assert stands_for(track.prompt(transcript), transcript)
        transcript += added
    assert stands_for(track.prompt(transcript), transcript)


def test_the_model_continues_from_its_own_tokens_after_a_cue() -> None:
    """`` Now`` in a piece of its own, then `` we`` cut to `` `` by the stop `` Now ``: the
    hand-off after ``Now`` keeps every id the model wrote, and tokenizes nothing."""
    track, transcript = TokenTrack(PROMPT), ""
    prompt = track.prompt(transcript)
    track.sent(prompt, [], follow=True)
    for text, ids in (("ab", [0, 1]), (" Now", [5]), (" ", [4])):
        transcript += text
        track.wrote(text, ids)
    track.ended(at_stop_string=True)
    transcript = transcript[: len("ab Now")]  # the hand-off point
    track.cut(len(transcript))
    assert track.prompt(transcript) == TokenPrompt((*PROMPT, 0, 1, 5), "")


def test_a_request_not_followed_leaves_its_text_to_be_tokenized() -> None:
    """Stops left out of the text (the answer's): the written ids may lag the text, so only
    the prompt's text is kept; the written text is tokenized with the next request."""
    track = TokenTrack(PROMPT)
    track.sent(track.prompt("a"), [0], follow=False)
    track.wrote("b.", [1, 3])
    track.ended(at_stop_string=True)
    assert track.prompt("ab.") == TokenPrompt((*PROMPT, 0), "b.")


def test_a_server_without_ids_gets_text() -> None:
    track = TokenTrack(PROMPT)
    track.sent(track.prompt(""), [], follow=True)
    track.wrote("ab", None)
    track.ended(at_stop_string=False)
    assert track.prompt("ab") == TokenPrompt(PROMPT, "ab")


def test_a_prompt_built_before_the_track_changed_is_not_followed() -> None:
    """A speculative hand-off opened at `` Now`` of a track the writer then changed: its ids
    are not the track's, and what it writes is tokenized again rather than misplaced."""
    track = TokenTrack(PROMPT)
    early = track.prompt("")
    track.sent(early, [], follow=True)
    track.wrote("a", [0])
    track.ended(at_stop_string=False)
    track.sent(early, [], follow=True)
    track.wrote("b", [1])
    assert track.prompt("ab") == TokenPrompt((*PROMPT, 0), "b")


def test_models_that_render_alike_share_one_track() -> None:
    shared = Prompts({"large": RenderedIds(PROMPT), "small": RenderedIds(PROMPT)})
    assert shared.track("large") is shared.track("small")
    assert shared.path == "tokens"
    apart = Prompts({"large": RenderedIds(PROMPT), "small": RenderedIds((100, 7))})
    assert apart.track("large") is not apart.track("small")
    text = Prompts({"large": RenderedPrompt("P:"), "small": RenderedPrompt("Q:")})
    assert (text.path, text.of("small", "x"), text.track("large")) == ("text", "Q:x", None)


QWEN_THINK, QWEN_END_THINK, NL, NL2 = 151667, 151668, 198, 271


def test_the_reasoning_mode_is_read_from_ids_as_from_text() -> None:
    start, end = [QWEN_THINK], [QWEN_END_THINK]
    assert PromptReasoning.of_ids([1, 2, 3], start, end) is PromptReasoning.MODEL_OPENS
    assert PromptReasoning.of_ids([1, QWEN_THINK, NL], start, end) is PromptReasoning.OPEN
    closed = [1, QWEN_THINK, NL2, QWEN_END_THINK, NL2]
    assert PromptReasoning.of_ids(closed, start, end) is PromptReasoning.CLOSED
    # a marker in the user's message stands before the end of turn and the role's tokens
    in_message = [1, QWEN_THINK, 151645, NL, 151644, 77091, NL]
    assert PromptReasoning.of_ids(in_message, start, end) is PromptReasoning.MODEL_OPENS
    # markers of several ids
    assert PromptReasoning.of_ids([5, 6, 7, NL], [6, 7], [8, 9]) is PromptReasoning.OPEN
