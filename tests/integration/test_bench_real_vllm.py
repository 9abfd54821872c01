"""``relaygen bench`` on the real vLLM servers: a handful of problems in every mode.

The tiny random models cannot solve anything, so the first test forces a known trace (with two
switch cues and a boxed 4) through vLLM structured outputs: grading, the side-by-side modes and
the statistics then have exact expected figures. The second runs the command unforced, as a
user would, and checks that everything it promises is written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from relay_integrations.bench.problems import load_problems
from relay_integrations.bench.runner import run_bench
from relay_integrations.bench.stats import summarize
from relay_integrations.cli import main
from relay_integrations.relay import EndpointConfig, RelayConfig, SamplingConfig, SwitchPolicy
from relay_integrations.testing import forcing

from .conftest import Server, pair_options

pytestmark = pytest.mark.vllm

TRACE = (
    "<think>\nLet me add them. Therefore, the sum is 4. Now we check it.\n</think>\n\n"
    "The answer is $\\boxed{4}$."
)


def write_problems(path: Path, answers: list[object]) -> Path:
    rows = [{"problem": f"Problem {i}: what is 2 + 2?", "answer": a} for i, a in enumerate(answers)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


async def test_every_mode_is_graded_side_by_side_with_exact_figures(
    qwen_large: Server, qwen_small: Server, tmp_path: Path
) -> None:
    problems = load_problems(write_problems(tmp_path / "p.jsonl", [4.0, "4", "\\frac{10}{2}"]))
    config = RelayConfig(
        large=EndpointConfig(base_url=qwen_large.url, model=qwen_large.large_model),
        small=EndpointConfig(base_url=qwen_small.url, model=qwen_small.small_model),
        cues=["Therefore,", "Now"],
        policy=SwitchPolicy(cooldown_tokens=0),
        sampling=SamplingConfig(max_tokens=200, seed=7),
    )
    results = tmp_path / "out" / "results.jsonl"
    records = await run_bench(
        config, problems, results, samples=2, concurrency=4, request_hook=forcing(TRACE)
    )
    assert len(records) == 3 * 3 * 2 and not [r for r in records if r.error]
    summaries = summarize(records)
    for mode in ("large", "small", "relay"):
        assert summaries[mode].pass_at_1 == pytest.approx(2 / 3)  # 4 and 4 right, 5 wrong
        assert summaries[mode].generations == 6
    assert {r.extracted for r in records} == {"4"}
    relay = [r for r in records if r.mode == "relay"]
    assert {r.switches for r in relay} == {2}
    assert all(0 < r.large_share < 1 and r.completion_tokens["small"] > 0 for r in relay)
    assert all(r.prompt_tokens > 0 for r in records)
    large = [r for r in records if r.mode == "large"]
    assert all(set(r.completion_tokens) == {"large"} and r.large_share == 1 for r in large)
    assert summaries["large"].speedup == pytest.approx(1.0)
    lines = results.read_text().splitlines()
    assert json.loads(lines[0])["header"]["problems_sha256"] == problems.sha256
    # a rerun finds everything done
    again = await run_bench(config, problems, results, samples=2, request_hook=forcing(TRACE))
    assert len(again) == len(records) and results.read_text().splitlines() == lines


def test_the_command_writes_results_table_and_plot(
    qwen_large: Server, qwen_small: Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    problems = write_problems(tmp_path / "p.jsonl", [1, 2])
    out = tmp_path / "bench"
    code = main(
        [
            "bench",
            "--problems",
            str(problems),
            "--out",
            str(out),
            "--samples",
            "1",
            *pair_options(qwen_large, qwen_small),
            "--cues",
            '["Therefore,", "Now"]',
            "--max-tokens",
            "48",
        ]
    )
    assert code == 0
    table = (out / "summary.md").read_text()
    assert [line.split("|")[1].strip() for line in table.splitlines()[2:]] == [
        "large",
        "small",
        "relay",
    ]
    assert table in capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    assert {m: summary[m]["generations"] for m in summary} == {"large": 2, "small": 2, "relay": 2}
    # time per written token for every mode, and the relay's predicted from the two alone
    assert all(summary[m]["ms_per_token"] > 0 for m in summary)
    large, small, relay = (summary[m] for m in ("large", "small", "relay"))
    share = relay["large_share"]
    assert relay["predicted_ms_per_token"] == pytest.approx(
        share * large["ms_per_token"] + (1 - share) * small["ms_per_token"]
    )
    assert (out / "accuracy_latency.png").read_bytes()[:4] == b"\x89PNG"
    assert len((out / "results.jsonl").read_text().splitlines()) == 1 + 3 * 2
