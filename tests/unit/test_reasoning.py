"""Reasoning split and the releaser that streams visible text without taking any back."""

import pytest

from relay_integrations.relay import ReasoningMarkers
from relay_integrations.relay.reasoning import PromptReasoning, Releaser, split_reasoning

M = ReasoningMarkers()


@pytest.mark.parametrize(
    ("prompt", "mode"),
    [
        ("<|im_start|>assistant\n", PromptReasoning.MODEL_OPENS),
        ("<｜Assistant｜><think>\n", PromptReasoning.OPEN),
        ("<|im_start|>assistant\n<think>\n\n</think>\n\n", PromptReasoning.CLOSED),
    ],
)
def test_prompt_reasoning_mode(prompt: str, mode: PromptReasoning) -> None:
    assert PromptReasoning.of(prompt, M) is mode


def test_split_reasoning_each_mode() -> None:
    assert split_reasoning("<think>\nr1\n</think>\n\nA", M, PromptReasoning.MODEL_OPENS) == (
        "r1",
        "A",
    )
    assert split_reasoning("Just A", M, PromptReasoning.MODEL_OPENS) == ("", "Just A")
    assert split_reasoning("r2\n</think>\nB", M, PromptReasoning.OPEN) == ("r2", "B")
    assert split_reasoning("unfinished", M, PromptReasoning.OPEN) == ("unfinished", "")
    # thinking off: the prompt holds the blank line; the text is the answer, as the model
    # wrote it (vLLM's chat endpoint gives the same)
    assert split_reasoning(" C ", M, PromptReasoning.CLOSED) == ("", " C ")


def test_the_answer_keeps_its_end_and_loses_the_blank_line_after_the_reasoning() -> None:
    """vLLM's text ends where a stop string cut it, a space before the stop included; the
    blank line the template puts after ``</think>`` is not the answer's (vLLM's qwen3 parser
    keeps it in ``content``; the relay's answer starts at its first word)."""
    text = "<think>\nr1 \n</think>\n\nIt has the "
    assert split_reasoning(text, M, PromptReasoning.MODEL_OPENS) == ("r1", "It has the ")
    assert split_reasoning(" It has\n", M, PromptReasoning.MODEL_OPENS) == ("", "It has\n")


def _stream(releaser: Releaser, pieces: list[str]) -> tuple[str, list[str]]:
    transcript, out = "", []
    for piece in pieces:
        transcript += piece
        out.append(releaser.release(transcript))
    return transcript, out


def test_releaser_skips_opener_and_holds_back_a_split_closer() -> None:
    releaser = Releaser(0, opener="<think>", closer="</think>")
    transcript, out = _stream(
        releaser, ["<th", "ink>", "\n", "Let", " me", " see.", " </", "think>"]
    )
    assert out == ["", "", "", "Let", " me", " see.", "", ""]
    assert releaser.release(transcript + "\n\nAnswer", final=True) == ""  # after the closer


def test_releaser_holds_trailing_space_that_a_handoff_may_trim() -> None:
    releaser = Releaser(0)
    transcript, out = _stream(releaser, ["So", " "])
    assert out == ["So", ""]
    transcript = transcript.rstrip()  # the hand-off trims it
    assert releaser.release(transcript + " the") == " the"


def test_releaser_without_opener_starts_after_leading_whitespace() -> None:
    releaser = Releaser(0, closer="</think>")
    _, out = _stream(releaser, ["\n", "\n", "Okay", ","])
    assert "".join(out) == "Okay,"


def test_the_answer_releases_its_trailing_space_at_its_end() -> None:
    releaser = Releaser(0, keep_end=True)
    transcript, out = _stream(releaser, ["\n\n", "It", " has", " the "])
    assert out == ["", "It", " has", " the"]  # the space may still be trimmed: held back
    assert releaser.release(transcript, final=True) == " "
    reasoning = Releaser(0, closer="</think>")
    _stream(reasoning, ["So", " "])
    assert reasoning.release("So ", final=True) == ""  # the reasoning is stripped
