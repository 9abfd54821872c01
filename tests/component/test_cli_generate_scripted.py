"""`relaygen generate` in text mode, on the scripted server: the marked spans and the closing
lines that say what the reader just saw."""

from __future__ import annotations

import io
import json

import pytest

from relay_integrations.cli import main
from relay_integrations.cli.generate import DEFAULT_PROMPT
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


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(
    ("stdin", "asked"),
    [
        (io.StringIO("What is 3 + 5?\n"), "What is 3 + 5?"),
        (io.StringIO("  A question\non two lines.\n\n"), "A question\non two lines."),
        (_Terminal("never read"), DEFAULT_PROMPT),  # a terminal: no silent wait for typing
    ],
    ids=["piped", "piped-two-lines", "terminal"],
)
def test_without_a_question_piped_standard_input_is_the_question(
    stdin: io.StringIO,
    asked: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr("sys.stdin", stdin)
    large, small = ScriptedModel("large", TRACE), ScriptedModel("small", TRACE)
    with serving(ScriptedVLLM(large, small)) as vllm:
        status = main(
            [
                "generate",
                *("--large-url", vllm.base_url, "--large-model", "large"),
                *("--small-url", vllm.base_url, "--small-model", "small"),
                *("--cues", '["Therefore,"]', "--json"),
            ]
        )
    assert status == 0, capsys.readouterr().err
    assert json.loads(capsys.readouterr().out)["finish_reason"] == "stop"
    assert asked in large.requests[0]["prompt"]
    if asked != DEFAULT_PROMPT:
        assert DEFAULT_PROMPT not in large.requests[0]["prompt"]


def test_a_question_on_the_command_line_wins_over_standard_input(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("the piped one"))
    out = generate(TRACE, capsys)
    assert "question: What is 2 + 2?" in out


@pytest.mark.parametrize("piped", ["", "\n \t\n"])
def test_an_empty_piped_standard_input_is_an_error_that_says_so(
    piped: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(piped))
    large, small = ScriptedModel("large", TRACE), ScriptedModel("small", TRACE)
    with serving(ScriptedVLLM(large, small)) as vllm:
        status = main(
            [
                "generate",
                *("--large-url", vllm.base_url, "--large-model", "large"),
                *("--small-url", vllm.base_url, "--small-model", "small"),
            ]
        )
    assert status == 2
    error = capsys.readouterr().err
    assert error.startswith("relaygen generate: standard input is empty: pipe a question in")
    assert "or give it as an argument" in error
    assert large.requests == []  # nothing asked
