"""Calibration on real vLLM: the tiny Qwen3 "large" writes forced traces with planted cues,
the tiny "small" scores them with prompt_logprobs, and the switcher runs on the artifact.

The models are random, so margins are tiny and no particular cue is "right"; what these tests
prove is the plumbing: the traces, the positions of the margins, the counts, the artifact,
and that the switcher accepts and uses what the calibration wrote.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from relay_integrations.calibration import (
    Calibrator,
    DatasetError,
    ProblemSet,
    Trace,
    TraceFile,
    TraceScorer,
)
from relay_integrations.relay import (
    CueArtifactError,
    EndpointConfig,
    RelayConfig,
    RelaySwitcher,
    SamplingConfig,
    SwitchPolicy,
    load_artifact,
)
from relay_integrations.relay.artifact import SelectionRule, save_artifact
from relay_integrations.testing import forcing, regex_literal
from relay_integrations.upstream.rendering import ChatInput, ServerChatTemplate

from .conftest import Server

pytestmark = pytest.mark.vllm

PLANTED = [
    "Let me add the numbers. Therefore, the sum is 12. Now we check it again. So the answer holds.",
    "First we factor it. Wait, the sign is wrong. Therefore, we flip it. Now the root is 3.",
    "We test small cases. Now the pattern is clear. Therefore, the count is 7. Hmm, that fits.",
    "Start with the area. So the side is 4. Therefore, the perimeter is 16. Now we are done.",
]
PROBLEMS = [f"Problem {i}: what is {i} + {i}?" for i in range(len(PLANTED))]
RULE = SelectionRule(k=0.0, min_occurrences=2)


class Completion(BaseModel):
    """A non-streamed ``/v1/completions`` answer, its choices as vLLM sends them."""

    choices: list[dict[str, Any]]


def write_problems(path: Path, problems: list[str] = PROBLEMS) -> ProblemSet:
    path.write_text("".join(json.dumps({"problem": p}) + "\n" for p in problems))
    return ProblemSet.load(path)


def force_planted(index: int, sample: int) -> dict[str, object]:
    return {"structured_outputs": {"regex": regex_literal(f"<think>\n{PLANTED[index]}\n</think>")}}


def calibrator(large: Server, small: Server, **options: object) -> Calibrator:
    return Calibrator(
        large=EndpointConfig(base_url=large.url, model=large.large_model),
        small=EndpointConfig(base_url=small.url, model=small.small_model),
        rule=RULE,
        sampling=SamplingConfig(max_tokens=120),
        show_progress=False,
        **options,  # type: ignore[arg-type]
    )


async def test_calibration_end_to_end_and_the_switcher_runs_on_its_artifact(
    qwen_large: Server, qwen_small: Server, tmp_path: Path
) -> None:
    problems = write_problems(tmp_path / "problems.jsonl")
    async with calibrator(qwen_large, qwen_small) as run:
        traces = await run.write_traces(
            problems, TraceFile(tmp_path / "traces.jsonl"), samples=1, request_fields=force_planted
        )
        assert [t.reasoning for t in traces] == PLANTED
        assert all(t.finish_reason == "stop" and t.completion_tokens for t in traces)
        outcome = await run.calibrate(traces, problems, sampling=run.sampling, samples=1)

    record = outcome.artifact.calibration
    assert record is not None
    stats = {c.cue: c for c in record.candidates}
    # every planted occurrence is found, with the switcher's whole-word matcher
    assert stats["Therefore,"].occurrences == 4
    assert stats["Therefore"].occurrences == 4  # the bare cue fires before the comma too
    assert stats["Now"].occurrences == 4
    assert stats["So "].occurrences == 2
    assert stats["Wait,"].occurrences == 1 and stats["Hmm,"].occurrences == 1
    assert stats["now"].occurrences == 0  # "Now" only, case-sensitive
    assert stats["Hmm,"].standard_error is None and not stats["Hmm,"].selected
    # " Therefore, we flip it." has 5 tokens after the comma ends: " we", " flip", " it", "."
    assert all(c.tokens > 0 for c in (stats["Therefore,"], stats["Now"], stats["So "]))
    assert record.calibration_set.traces == 4 and record.calibration_set.size == 4
    assert record.calibration_set.trace_source == "generated"
    assert record.sampling is not None and record.sampling.max_tokens == 120
    assert record.tokens_scored >= sum(len(p.split()) for p in PLANTED)
    assert outcome.artifact.cues == [
        c.cue for c in sorted(record.candidates, key=lambda c: -(c.mean_margin or 0)) if c.selected
    ]
    assert all(
        c.mean_margin is not None and c.threshold is not None and c.mean_margin >= c.threshold
        for c in record.candidates
        if c.selected
    )
    # the pair is identified by what the servers report, tokenizers by a fingerprint
    pair = outcome.artifact.model_pair
    assert pair.large.served_name == qwen_large.large_model
    assert pair.small.served_name == qwen_small.small_model
    assert pair.large.tokenizer == pair.small.tokenizer  # the tiny Qwen3 models share one
    assert pair.small.tokenizer is not None and pair.small.tokenizer.startswith("probe-sha256:")

    path = save_artifact(outcome.artifact, tmp_path / "cues.json")
    assert load_artifact(path) == outcome.artifact

    # the switcher loads the artifact, accepts the pair, and switches on a selected cue
    cue = outcome.artifact.cues[0]
    trace = f"<think>\nWe start here. {cue.rstrip()} it works.\n</think>\n\nIt is 4."
    config = RelayConfig(
        large=EndpointConfig(base_url=qwen_large.url, model=qwen_large.large_model),
        small=EndpointConfig(base_url=qwen_small.url, model=qwen_small.small_model),
        cues=str(path),
        sampling=SamplingConfig(max_tokens=200),
        policy=SwitchPolicy(cooldown_tokens=0),
    )
    async with RelaySwitcher(config, request_hook=forcing(trace)) as relay:
        result = await relay.generate([{"role": "user", "content": "What is 2 + 2?"}])
    assert result.text == trace
    assert (result.segments[0].ended_by, result.segments[0].cue) == ("cue", cue)
    assert result.segments[1].model == "small"


async def test_the_small_model_scores_what_it_sees_at_run_time(
    qwen_large: Server, qwen_small: Server
) -> None:
    """At every switch, the small model's prompt is a prefix of the text calibration scores."""
    reasoning = PLANTED[0]
    trace = f"<think>\n{reasoning}\n</think>\n\nIt is 12."
    messages = [{"role": "user", "content": PROBLEMS[0]}]
    small_transcripts: list[str] = []
    force = forcing(trace)

    def hook(role, phase, transcript):
        if role == "small" and phase == "reasoning":
            small_transcripts.append(transcript)
        return force(role, phase, transcript)

    config = RelayConfig(
        large=EndpointConfig(base_url=qwen_large.url, model=qwen_large.large_model),
        small=EndpointConfig(base_url=qwen_small.url, model=qwen_small.small_model),
        cues=["Therefore,", "Now", "So "],
        sampling=SamplingConfig(max_tokens=200),
        # the hook would also see the requests opened ahead of a hand-off, used or not; the
        # requests used are the same either way (test_relay_real_vllm proves it)
        policy=SwitchPolicy(cooldown_tokens=0, speculative_handoff=False),
    )
    async with RelaySwitcher(config, request_hook=hook) as relay:
        await relay.generate(messages)
        small = relay.endpoints["small"]
        prompt = (await ServerChatTemplate().render(small, ChatInput(messages))).text
        scored_text = (
            await TraceScorer(small, ServerChatTemplate()).scoring_text(
                Trace(id="0", messages=messages, reasoning=reasoning)
            )
        ).text
    assert len(small_transcripts) == 3
    for transcript in small_transcripts:
        assert scored_text.startswith(prompt + transcript)


@pytest.mark.parametrize("server_name", ["qwen_small", "r1", "smollm2"])
async def test_a_margin_belongs_to_the_token_it_is_placed_at(
    server_name: str, request: pytest.FixtureRequest
) -> None:
    """The margin placed at a token equals the server's own next-token distribution after the
    text before that token, and differs from its neighbours' (so an off-by-one fails)."""
    server: Server = request.getfixturevalue(server_name)
    reasoning = "Let me think. Therefore, the answer is 4. café 🙂 Now we check: 2+2=4."
    trace = Trace(
        id="t", messages=[{"role": "user", "content": "What is 2+2?"}], reasoning=reasoning
    )
    async with Calibrator(
        small=EndpointConfig(base_url=server.url, model=server.small_model), show_progress=False
    ) as run:
        scorer = TraceScorer(run.small, run.renderer)
        target = await scorer.scoring_text(trace)
        scored = await scorer.score(trace)
        assert scored.reasoning == reasoning
        ends = [*scored.token_starts[1:], len(reasoning)]
        pieces = [reasoning[max(a, 0) : b] for a, b in zip(scored.token_starts, ends, strict=True)]
        assert "".join(pieces) == reasoning
        for word in (" Therefore", " café", " Now", " check"):
            k = scored.token_starts.index(reasoning.index(word))
            assert word.startswith(pieces[k])
            before = target.text[: target.reasoning_start + scored.token_starts[k]]
            response = await run.small.post_json(
                "/v1/completions",
                {
                    "model": server.small_model,
                    "prompt": before,
                    "max_tokens": 1,
                    "temperature": 0,
                    "logprobs": 2,
                    "add_special_tokens": False,
                },
                Completion,
            )
            top = sorted(response.choices[0]["logprobs"]["top_logprobs"][0].values())[::-1]
            expected = math.exp(top[0]) - math.exp(top[1])
            assert scored.margins[k] == pytest.approx(expected, rel=1e-3)
            assert scored.margins[k] != pytest.approx(scored.margins[k + 1], rel=1e-3)
            assert scored.margins[k] != pytest.approx(scored.margins[k - 1], rel=1e-3)


async def test_an_interrupted_trace_run_resumes_where_it_stopped(
    qwen_large: Server, qwen_small: Server, tmp_path: Path
) -> None:
    problems = write_problems(tmp_path / "problems.jsonl", PROBLEMS[:3])
    out = TraceFile(tmp_path / "traces.jsonl")
    requests: list[tuple[int, int]] = []

    def counting(index: int, sample: int) -> dict[str, object]:
        requests.append((index, sample))
        return force_planted(index, sample)

    async with calibrator(qwen_large, qwen_small) as run:
        await run.write_traces(problems, out, samples=1, request_fields=counting)
        lines = out.path.read_text().splitlines()  # in the order the traces finished
        last = json.loads(lines[2])["id"]
        # a crash while writing the third trace: two complete lines and half of one
        out.path.write_text(lines[0] + "\n" + lines[1] + "\n" + lines[2][:40])
        requests.clear()
        traces = await run.write_traces(problems, out, samples=1, request_fields=counting)
        assert [f"{i}/{s}" for i, s in requests] == [last]
        assert [t.reasoning for t in traces] == PLANTED[:3]
        assert len(out.path.read_text().splitlines()) == 3
        requests.clear()
        await run.write_traces(problems, out, samples=1, request_fields=counting)
        assert requests == []  # nothing missing: nothing written

        other = write_problems(tmp_path / "other.jsonl", ["A different problem"])
        with pytest.raises(DatasetError, match="answers another problem"):
            await run.write_traces(other, out, samples=1)


async def test_an_artifact_for_another_pair_is_refused_unless_allowed(
    qwen_large: Server, qwen_small: Server, r1: Server, tmp_path: Path
) -> None:
    problems = write_problems(tmp_path / "problems.jsonl")
    async with calibrator(qwen_large, qwen_small) as run:
        traces = await run.write_traces(
            problems, TraceFile(tmp_path / "t.jsonl"), samples=1, request_fields=force_planted
        )
        outcome = await run.calibrate(traces, problems)
    path = save_artifact(outcome.artifact, tmp_path / "qwen-cues.json")

    def r1_config(**extra: object) -> RelayConfig:
        return RelayConfig(
            large=EndpointConfig(base_url=r1.url, model=r1.large_model),
            small=EndpointConfig(base_url=r1.url, model=r1.small_model),
            cues=str(path),
            sampling=SamplingConfig(max_tokens=8),
            **extra,
        )

    question = [{"role": "user", "content": "Hi"}]
    async with RelaySwitcher(r1_config()) as relay:
        with pytest.raises(CueArtifactError, match="calibrated for large model"):
            await relay.generate(question)
    async with RelaySwitcher(r1_config(allow_model_mismatch=True)) as relay:
        assert (await relay.generate(question)).completion_tokens > 0


def calibrate_cli(small: Server, tmp_path: Path, *options: str) -> subprocess.CompletedProcess[str]:
    rows = [{"question": p, "solution": r} for p, r in zip(PROBLEMS * 2, PLANTED * 2, strict=True)]
    traces = tmp_path / "solutions.jsonl"
    traces.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "relay_integrations.cli",
            "calibrate",
            "--traces",
            str(traces),
            "--prompt-field",
            "question",
            "--reasoning-field",
            "solution",
            "--large-model",
            "Qwen/Qwen3-32B",
            "--small-url",
            small.url,
            "--small-model",
            small.small_model,
            "--out",
            str(tmp_path / "report"),
            *options,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_command_line_calibrates_ready_traces(qwen_small: Server, tmp_path: Path) -> None:
    candidates = ["Therefore,", "Now", "So ", "Wait,", "Nowhere"]
    done = calibrate_cli(
        qwen_small,
        tmp_path,
        "--candidates",
        json.dumps(candidates),
        "--k",
        "0",
        "--min-occurrences",
        "2",
    )
    assert done.returncode == 0, done.stderr
    out = tmp_path / "report"
    csv_rows = (out / "cues.csv").read_text().splitlines()
    assert csv_rows[0].startswith("cue,selected,occurrences")
    assert len(csv_rows) == 1 + len(candidates)
    assert "global mean margin" in done.stdout and "'Therefore,'" in done.stdout
    artifact = load_artifact(out / "cues.json")
    assert artifact.model_pair.large.model == "Qwen/Qwen3-32B"
    assert artifact.model_pair.small.served_name == qwen_small.small_model
    assert artifact.calibration is not None
    assert artifact.calibration.calibration_set.trace_source == "file"
    assert artifact.calibration.calibration_set.traces == 8
    assert f"selected {len(artifact.cues)} cues: {artifact.cues}" in done.stdout
    assert (out / "cues.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_calibration_that_selects_nothing_still_reports_its_figures(
    qwen_small: Server, tmp_path: Path
) -> None:
    # "Wait," occurs twice in the eight traces: below a minimum of three occurrences
    done = calibrate_cli(
        qwen_small, tmp_path, "--candidates", '["Wait,"]', "--min-occurrences", "3"
    )
    assert done.returncode == 1
    assert (
        "no candidate cue passed the selection rule (k=1, at least 3 occurrences) over 8 traces"
        in done.stderr
    )
    assert "'Wait,'                  2" in done.stdout
    assert (tmp_path / "report" / "cues.csv").read_text().splitlines()[1].startswith('"Wait,",0,2,')
    assert (tmp_path / "report" / "cues.png").exists()
    assert not (tmp_path / "report" / "cues.json").exists()


def test_the_command_line_writes_traces_and_resumes_them(r1: Server, tmp_path: Path) -> None:
    """From a problem set: the R1-style template opens the reasoning, so the random model's
    text is reasoning; it holds no cue, so nothing is selected, but traces and figures stay."""
    problems = tmp_path / "problems.jsonl"
    problems.write_text("".join(json.dumps({"problem": p}) + "\n" for p in PROBLEMS[:2]))
    command = [
        sys.executable,
        "-m",
        "relay_integrations.cli",
        "calibrate",
        "--problems",
        str(problems),
        "--samples",
        "2",
        "--max-tokens",
        "24",
        "--seed",
        "1",
        "--large-url",
        r1.url,
        "--large-model",
        r1.large_model,
        "--small-url",
        r1.url,
        "--small-model",
        r1.small_model,
        "--candidates",
        '["Therefore,"]',
        "--out",
        str(tmp_path / "run"),
    ]
    first = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert first.returncode == 1, first.stderr
    assert "no candidate cue passed the selection rule" in first.stderr
    trace_file = tmp_path / "run" / "traces.jsonl"
    traces = [Trace.model_validate_json(line) for line in trace_file.read_text().splitlines()]
    assert sorted(t.id for t in traces) == ["0/0", "0/1", "1/0", "1/1"]
    assert all(t.reasoning and t.completion_tokens == 24 for t in traces)
    assert all(t.finish_reason == "length" for t in traces)
    assert "traces  [####################]  4/4  100%" in first.stderr

    again = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert again.returncode == 1
    assert "4/4  100%" in again.stderr and "resumed" in again.stderr
    assert trace_file.read_text().splitlines() == [t.model_dump_json() for t in traces]
