"""Cue sets: whole-word matching, and stop strings that agree with the matcher."""

import random

import pytest

from relay_integrations.relay import CueArtifactError, CueSet, load_artifact
from relay_integrations.relay.cues import LEFT_BOUNDARIES, PendingCue


@pytest.mark.parametrize(
    ("cue", "text"),
    [
        ("now", "I know that."),
        ("Now", "It is Nowhere."),
        ("Other", "Otherwise, go."),
        ("Any", "Anyway, fine."),
        ("So ", "Some say so."),
        ("so ", "Also so, not."),
        ("so ", "Also there."),
        ("check", "We double-check it."),
        ("Thus", "Thusly, we go."),
    ],
)
def test_false_positive_words_never_match(cue: str, text: str) -> None:
    cues = CueSet.from_list([cue])
    assert list(cues.finditer(text)) == []
    assert not any(stop in text for stop in cues.stop_strings)


@pytest.mark.parametrize(
    ("cue", "text", "handoff_text"),
    [
        ("Now", "Done. Now we add.", " Now"),
        ("Now", "Done.\nNow, we add.", "\nNow,"),
        ("Now,", "Done. Now, we add.", " Now,"),
        ("So ", "It fits. So the sum is 4.", " So"),
        ("Therefore", "x. Therefore: y.", " Therefore:"),
        ("double-check", "Let me double-check this.", " double-check"),
    ],
)
def test_whole_words_match_and_hand_off_without_trailing_space(
    cue: str, text: str, handoff_text: str
) -> None:
    (match,) = CueSet.from_list([cue]).finditer(text)
    assert match.cue == cue
    assert text[match.start - 1 : match.handoff] == handoff_text
    assert not text[: match.handoff].endswith(" ")


def test_most_specific_cue_is_reported() -> None:
    cues = CueSet.from_list(["Therefore", "Therefore,"])
    assert [m.cue for m in cues.finditer("a. Therefore, b. Therefore the c.")] == [
        "Therefore,",
        "Therefore",
    ]


def test_stop_strings_fire_exactly_where_the_matcher_matches() -> None:
    """vLLM stops at the first stop string completed; the matcher must find the same place."""
    cues = CueSet.load("builtin:qwen3-32b--qwen3-1.7b")
    words = [
        "So",
        "Now",
        "now",
        "know",
        "Nowhere",
        "Therefore",
        "Other",
        "Otherwise",
        "Also",
        "also",
        "the",
        "x",
        "Thus",
        "Some",
        "so",
        "Similarly",
        "hence",
        "Hence",
        "Wait",
    ]
    seps = [" ", ", ", ". ", "\n", ": ", "  "]
    rng = random.Random(7)
    for _ in range(3000):
        text = "".join(rng.choice(words) + rng.choice(seps) for _ in range(8))
        first_stop_end = None
        for end in range(1, len(text) + 1):  # the text grows one character at a time
            hit = [s for s in cues.stop_strings if text[:end].endswith(s)]
            if hit:
                first_stop_end, stop = end, hit[0]
                break
        first_match = next(cues.finditer(text), None)
        if first_stop_end is None:
            assert first_match is None, text
            continue
        assert first_match is not None, text
        by_stop = cues.match_stop(text[:first_stop_end], stop)
        assert by_stop is not None
        assert (by_stop.start, by_stop.handoff, by_stop.cue) == (
            first_match.start,
            first_match.handoff,
            first_match.cue,
        ), text


def test_every_stop_string_starts_with_a_left_boundary() -> None:
    cues = CueSet.load("builtin:r1-distill-qwen-32b--r1-distill-qwen-1.5b")
    assert all(s[0] in LEFT_BOUNDARIES for s in cues.stop_strings)
    assert len(set(cues.stop_strings)) == len(cues.stop_strings)


def test_builtin_artifacts_record_their_source_and_pair() -> None:
    qwen = load_artifact("builtin:qwen3-32b--qwen3-1.7b")
    assert len(qwen.cues) == 28 and "jiwonsong-dev/RelayGen" in qwen.source
    assert qwen.model_pair.large.matches("/models/qwen3-32b")
    r1 = load_artifact("builtin:r1-distill-qwen-32b--r1-distill-qwen-1.5b")
    assert len(r1.cues) == 25 and "So " in r1.cues


@pytest.mark.parametrize("bad", [[], ["", "Now"], [" Now"]])
def test_bad_inline_cues_are_rejected(bad: list[str]) -> None:
    with pytest.raises(ValueError, match="cue"):
        CueSet.from_list(bad)


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        ('{"format": "relaygen-cues", "version": 1, "model_pair"', "not valid JSON"),
        ("[1, 2]", "not a cue artifact"),
        ('{"format": "relaygen-cues", "version": 7}', "unsupported version 7"),
        (
            '{"format": "relaygen-cues", "version": 1, "cues": ["Now", "Now"], "source": "x",'
            ' "model_pair": {"large": {"model": "a"}, "small": {"model": "b"}}}',
            "duplicate cues",
        ),
        (
            '{"format": "relaygen-cues", "version": 1, "cues": ["Now"], "source": "x"}',
            "model_pair: Field required",
        ),
    ],
)
def test_bad_artifacts_fail_with_path_and_reason(tmp_path, content: str, reason: str) -> None:
    path = tmp_path / "cues.json"
    path.write_text(content)
    with pytest.raises(CueArtifactError) as caught:
        load_artifact(path)
    assert str(path) in str(caught.value)
    assert reason in str(caught.value)


def test_missing_artifact_and_unknown_builtin() -> None:
    with pytest.raises(CueArtifactError, match="file not found"):
        load_artifact("/nonexistent/cues.json")
    with pytest.raises(CueArtifactError, match="choose one of"):
        load_artifact("builtin:gpt-5--gpt-nano")


def test_a_pending_cue_hands_off_where_it_said_when_the_next_characters_confirm_it() -> None:
    """What the speculative hand-off relies on: where `pending` says a cue awaits one more
    token, and the text goes on with its completion and a confirming character, the first
    whole-word match hands off exactly at the end plus the completion."""
    cues = CueSet.load("builtin:qwen3-32b--qwen3-1.7b")
    words = ["So", "Now", "now", "Nowhere", "Therefore", "Thus", "Also", "Other", "Wait", "x"]
    seps = [" ", ", ", ". ", "\n", ": ", "-"]
    rng = random.Random(11)
    confirmed = refuted = 0
    for _ in range(2000):
        text = "".join(rng.choice(words) + rng.choice(seps) for _ in range(6))
        first = next(cues.finditer(text), None)
        for end in range(1, (first.handoff if first else len(text)) + 1):
            pending = cues.pending(text[:end])
            if pending is None:
                continue
            rest = text[end:]
            after = rest[len(pending.completion) :][:1]
            confirms = not pending.confirmed_by or (after != "" and after in pending.confirmed_by)
            if rest.startswith(pending.completion) and confirms:
                assert first is not None and first.handoff == end + len(pending.completion), text
                confirmed += 1
            else:
                refuted += 1
    assert confirmed > 300 and refuted > 300


def test_pending_cues() -> None:
    cues = CueSet.from_list(["Now", "Therefore,", "So ", "Thus", "Thus,"])
    assert cues.pending("x. Now") == PendingCue("", " \n")  # "Now," hands off past the comma
    assert cues.pending("x.\nTherefore") == PendingCue(",", "")
    assert cues.pending("x. So") == PendingCue("", " ")
    assert cues.pending("x. Thus") == PendingCue(",", "")  # both "Thus" and "Thus,": the comma
    assert cues.pending("x.Now") is None  # no left boundary
    assert cues.pending("x. Therefore,") is None  # complete: its stop string has fired
    assert cues.pending("x. Nowhere") is None
