"""`relaygen generate` in text mode, on the scripted server: the marked spans and the closing
lines that say what the reader just saw."""

from __future__ import annotations

import pytest

from relay_integrations.cli import main
from relay_integrations.testing.scripted_vllm import ScriptedModel, ScriptedVLLM, serving

TRACE = (
    "<think>\nLet me see. Therefore, the sum is 4. Then we go on. Now we check the sum. "
    "It is right.\n</think>\n\nThe answer is 4."
)


def generate(trace: str, capsys: pytest.CaptureFixture[str], *options: str) -> str:
    server = ScriptedVLLM(ScriptedModel("large", trace), ScriptedModel("small", trace))
    with serving(server) as vllm:
        status = main(
            [
                "generate",
                "What is 2 + 2?",
                *("--large-url", vllm.base_url, "--large-model", "large"),
                *("--small-url", vllm.base_url, "--small-model", "small"),
                *("--cues", '["Therefore,", "Now"]'),
                *options,
            ]
        )
    assert status == 0
    return capsys.readouterr().out


def test_the_closing_lines_name_each_hand_off_and_its_cue(
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = generate(TRACE, capsys)
    assert "[L Let me see. Therefore,][S  the sum is 4.][L  Then we go on. Now][S  we check" in out
    assert "switches:          2" in out
    assert out.rstrip().endswith(
        'In short: the small model took over twice mid-reasoning, after "Therefore," (once) '
        'and "Now" (once), each time finishing the sentence; it also wrote the answer. '
        "The small model wrote 42.2% of the tokens."  # 19 of 45 tokens
    ), out


def test_without_a_cue_the_closing_lines_say_so(capsys: pytest.CaptureFixture[str]) -> None:
    out = generate("<think>\nLet me see. It is 4.\n</think>\n\nThe answer is 4.", capsys)
    assert "In short: the large model wrote no cue, so it wrote all of the reasoning; the " in out
    assert "small model wrote the answer. The small model wrote" in out


def test_a_cue_written_again_is_counted_not_repeated(capsys: pytest.CaptureFixture[str]) -> None:
    trace = (
        "<think>\nLet me see. Now we add. Then we go on. Now we check. Then we go on. "
        "Therefore, it is 4. Then we go on. Now we stop.\n</think>\n\n4."
    )
    out = generate(trace, capsys)
    assert 'took over 4 times mid-reasoning, after "Now" (3 times) and "Therefore," (once),' in out


def test_one_hand_off_reads_as_one(capsys: pytest.CaptureFixture[str]) -> None:
    out = generate("<think>\nLet me see. Now we check it.\n</think>\n\nIt is 4.", capsys)
    assert (
        'took over once mid-reasoning, after "Now" (once), finishing the sentence; it also ' in out
    )
    assert "wrote the answer." in out


def test_each_small_turn_is_told_by_how_it_ended(capsys: pytest.CaptureFixture[str]) -> None:
    trace = (
        "<think>\nLet me see. Now we add " + "one and " * 12 + "more. Then we go on. "
        "Now we check. Then we stop.\n</think>\n\n4."
    )
    out = generate(trace, capsys, "--max-small-tokens", "8")
    assert 'after "Now" (twice), reaching its token cap once and finishing the sentence once' in out
