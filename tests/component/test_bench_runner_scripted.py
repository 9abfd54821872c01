"""``run_bench`` and ``relaygen bench`` against the scripted fake vLLM server: every mode graded,
resumable results, reruns that redo only failures, and the report files."""

import json
import os
from pathlib import Path
from typing import Any

import pytest

from relay_integrations.bench.generate import BenchRecord
from relay_integrations.bench.problems import load_problems
from relay_integrations.bench.runner import ResultLine, run_bench
from relay_integrations.bench.stats import latest, summarize
from relay_integrations.cli import main
from relay_integrations.jobs.datasets import DatasetError
from relay_integrations.relay import RelayConfig, SamplingConfig
from relay_integrations.testing.scripted_vllm import Fault, ScriptedModel, ScriptedVLLM, serving
from tests.fakes.relay_config import make_config

TRACE = (
    "<think>\nLet me see. Therefore, it is 4. Now we check.\n</think>\n\nThe answer is \\boxed{4}."
)
CUES = ["Therefore,", "Now"]
ANSWERS = [4, 4, 5]  # the scripted models always answer 4: pass@1 is 2/3 in every mode


def problem_file(tmp_path: Path) -> Path:
    path = tmp_path / "sums.jsonl"
    rows = [{"problem": f"What is {a - 2} + 2?", "answer": a} for a in ANSWERS]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def bench_config(server: ScriptedVLLM, max_retries: int = 2, **sampling: Any) -> RelayConfig:
    """The benchmark's relay: no cooldown, 512 tokens (`sampling`: more sampling fields)."""
    budget = SamplingConfig(max_tokens=512, **sampling)
    return make_config(server, max_retries=max_retries, sampling=budget, cooldown_tokens=0)


def models() -> tuple[ScriptedModel, ScriptedModel]:
    return ScriptedModel("large", TRACE), ScriptedModel("small", TRACE)


def requests(*scripted: ScriptedModel) -> list[int]:
    return [len(model.requests) for model in scripted]


def read_lines(path: Path) -> list[ResultLine]:
    text = path.read_text(encoding="utf-8")
    return [ResultLine.model_validate_json(line) for line in text.splitlines()]


async def test_every_mode_is_graded_and_a_rerun_does_nothing(tmp_path: Path) -> None:
    problems = load_problems(problem_file(tmp_path))
    results = tmp_path / "out" / "results.jsonl"  # the directory does not exist yet
    large, small = models()
    async with ScriptedVLLM(large, small) as server:
        records = await run_bench(bench_config(server), problems, results, concurrency=2)
        counts = requests(large, small)
        lines = results.read_text(encoding="utf-8").splitlines()
        again = await run_bench(bench_config(server), problems, results, concurrency=2)
        assert requests(large, small) == counts  # nothing was generated again
    assert results.read_text(encoding="utf-8").splitlines() == lines
    assert sorted(r.key for r in again) == sorted(r.key for r in records)

    assert len(records) == 9 and all(r.error is None for r in records)
    summaries = summarize(records)
    assert list(summaries) == ["large", "small", "relay"]
    for summary in summaries.values():
        assert summary.pass_at_1 == pytest.approx(2 / 3)
        assert (summary.problems, summary.generations, summary.errors) == (3, 3, 0)
        assert summary.mean_seconds > 0
    assert summaries["large"].speedup == pytest.approx(1.0)

    by_mode = {mode: [r for r in records if r.mode == mode] for mode in summaries}
    for mode_records in by_mode.values():
        assert [r.correct for r in mode_records] == [True, True, False]
        assert all(r.extracted == "4" for r in mode_records)
        assert all(r.answer == "The answer is \\boxed{4}." for r in mode_records)
        assert all(r.finish_reason == "stop" and r.seconds > 0 for r in mode_records)
        assert all(r.time_to_first_token is not None for r in mode_records)
        assert all(r.prompt_tokens > 0 for r in mode_records)
    for record in by_mode["relay"]:
        assert record.switches == 2
        assert 0 < record.large_share < 1
        assert set(record.completion_tokens) == {"large", "small"}
        share = record.completion_tokens["large"] / sum(record.completion_tokens.values())
        assert record.large_share == pytest.approx(share)
    for record in by_mode["large"]:
        assert record.large_share == 1.0 and record.switches == 0
        assert list(record.completion_tokens) == ["large"]
        assert record.completion_tokens["large"] > 0
    for record in by_mode["small"]:
        assert record.large_share == 0.0 and record.switches == 0
        assert list(record.completion_tokens) == ["small"]
    assert 0 < summaries["relay"].large_share < 1

    # the file: a header, then one record a generation
    parsed = read_lines(results)
    assert len(parsed) == 10
    header = parsed[0].header
    assert header is not None and parsed[0].record is None
    assert (header.problems, header.problems_sha256) == ("sums", problems.sha256)
    assert (header.large_model, header.small_model, header.cues) == ("large", "small", CUES)
    assert header.sampling["max_tokens"] == 512
    assert all(line.header is None and line.record is not None for line in parsed[1:])


async def test_a_model_alone_sends_one_completion_over_its_rendered_prompt(
    tmp_path: Path,
) -> None:
    problems = load_problems(problem_file(tmp_path))
    large, small = models()
    async with ScriptedVLLM(large, small) as server:
        config = bench_config(server, temperature=0.3, top_k=None, seed=None)
        await run_bench(config, problems, tmp_path / "results.jsonl", modes=["small"])
    assert requests(large, small) == [0, 3]
    body = small.requests[0]
    assert body["stream"] is True
    assert body["prompt"].endswith("<|im_start|>assistant\n")
    assert "What is 2 + 2?" in body["prompt"] and "\\boxed{}" in body["prompt"]
    assert body["temperature"] == 0.3 and body["top_p"] == 0.95
    assert 0 < body["max_tokens"] <= 512


async def test_a_seed_is_distinct_per_sample(tmp_path: Path) -> None:
    problems = load_problems(problem_file(tmp_path))
    large, small = models()
    async with ScriptedVLLM(large, small) as server:
        records = await run_bench(
            bench_config(server, seed=10),
            problems,
            tmp_path / "results.jsonl",
            modes=["large"],
            samples=2,
        )
    assert len(records) == 6
    assert sorted(body["seed"] for body in large.requests) == [10, 10, 10, 11, 11, 11]


async def test_more_samples_on_a_rerun_generate_only_the_new_ones(tmp_path: Path) -> None:
    problems = load_problems(problem_file(tmp_path))
    results = tmp_path / "results.jsonl"
    large, small = models()
    async with ScriptedVLLM(large, small) as server:
        await run_bench(bench_config(server), problems, results, modes=["large"])
        assert requests(large, small) == [3, 0]
        records = await run_bench(
            bench_config(server), problems, results, modes=["large"], samples=2
        )
    assert requests(large, small) == [6, 0]
    assert sorted((r.problem_id, r.sample) for r in records) == [
        (p, s) for p in ("1", "2", "3") for s in (0, 1)
    ]
    assert summarize(records)["large"].pass_at_1 == pytest.approx(2 / 3)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"sampling": SamplingConfig(max_tokens=512, temperature=0.9)}, "sampling"),
        ({"cues": ["Therefore,"]}, "cues"),
    ],
)
async def test_a_rerun_for_another_run_is_refused(
    tmp_path: Path, change: dict[str, Any], field: str
) -> None:
    problems = load_problems(problem_file(tmp_path))
    results = tmp_path / "results.jsonl"
    large, small = models()
    async with ScriptedVLLM(large, small) as server:
        config = bench_config(server)
        await run_bench(config, problems, results, modes=["small"])
        before = results.read_text(encoding="utf-8")
        counts = requests(large, small)
        with pytest.raises(DatasetError, match="written for another run") as refused:
            await run_bench(config.model_copy(update=change), problems, results, modes=["small"])
        assert requests(large, small) == counts
    assert f"different {field})" in str(refused.value)
    assert str(results) in str(refused.value)
    assert results.read_text(encoding="utf-8") == before


async def test_a_rerun_on_other_problems_is_refused(tmp_path: Path) -> None:
    path = problem_file(tmp_path)
    results = tmp_path / "results.jsonl"
    large, small = models()
    async with ScriptedVLLM(large, small) as server:
        await run_bench(
            bench_config(server), load_problems(path, limit=2), results, modes=["small"]
        )
        with pytest.raises(DatasetError, match=r"different problems, problems_sha256\)"):
            await run_bench(bench_config(server), load_problems(path), results, modes=["small"])


async def test_a_file_without_a_header_is_refused(tmp_path: Path) -> None:
    results = tmp_path / "results.jsonl"
    stray = BenchRecord(mode="large", problem_id="1", sample=0)
    results.write_text(ResultLine(record=stray).model_dump_json() + "\n", encoding="utf-8")
    large, small = models()
    async with ScriptedVLLM(large, small) as server:
        with pytest.raises(DatasetError, match="its first line is not a header"):
            await run_bench(bench_config(server), load_problems(problem_file(tmp_path)), results)


async def test_failed_generations_are_recorded_and_retried_alone(tmp_path: Path) -> None:
    problems = load_problems(problem_file(tmp_path))
    results = tmp_path / "results.jsonl"
    large, small = models()
    large.faults.extend([Fault(status=500)] * 2)  # the first two large requests fail
    async with ScriptedVLLM(large, small) as server:
        config = bench_config(server, max_retries=0)
        first = await run_bench(config, problems, results, modes=["large"], concurrency=1)
        failed = [r for r in first if r.error]
        assert [r.problem_id for r in failed] == ["1", "2"]
        assert all("500" in (r.error or "") for r in failed)
        assert all(r.finish_reason == "error" and not r.correct for r in failed)
        summary = summarize(first)["large"]
        assert (summary.errors, summary.generations, summary.pass_at_1) == (2, 1, 0.0)
        assert requests(large, small) == [3, 0]

        again = await run_bench(config, problems, results, modes=["large"], concurrency=1)
        assert requests(large, small) == [5, 0]  # exactly the two failures again
        third = await run_bench(config, problems, results, modes=["large"], concurrency=1)
        assert requests(large, small) == [5, 0]
    assert len(again) == 3 and all(r.error is None for r in again)
    assert sorted(r.key for r in third) == sorted(r.key for r in again)
    lines = read_lines(results)
    assert len(lines) == 1 + 3 + 2  # the failures stay in the file, superseded
    kept = latest(line.record for line in lines if line.record)
    assert [r.correct for r in sorted(kept, key=lambda r: r.problem_id)] == [True, True, False]
    summary = summarize(kept)["large"]
    assert (summary.errors, summary.generations) == (0, 3)
    assert summary.pass_at_1 == pytest.approx(2 / 3)


async def test_a_relay_whose_small_model_fails_still_answers(tmp_path: Path) -> None:
    # the small endpoint failing is absorbed by the relay (the large model writes the rest)
    problems = load_problems(problem_file(tmp_path))
    large, small = models()
    small.faults.extend([Fault(status=500)] * 50)
    async with ScriptedVLLM(large, small) as server:
        config = bench_config(server, max_retries=0)
        records = await run_bench(config, problems, tmp_path / "r.jsonl", modes=["relay"])
    assert all(r.error is None and r.large_share == 1.0 for r in records)
    assert summarize(records)["relay"].pass_at_1 == pytest.approx(2 / 3)


NOBODY = "http://127.0.0.1:9/v1"
"""A URL where no server listens: the command must refuse its input before any request."""


def bench_argv(server: ScriptedVLLM | str, problems: Path, out: Path, *extra: str) -> list[str]:
    """``relaygen bench`` on `server` (a scripted one, or a URL where none listens)."""
    url = server if isinstance(server, str) else server.base_url
    return [
        *("bench", "--problems", str(problems), "--out", str(out)),
        *("--large-url", url, "--large-model", "large"),
        *("--small-url", url, "--small-model", "small"),
        *("--cues", json.dumps(CUES), "--max-tokens", "512", "--concurrency", "2"),
        *extra,
    ]


@pytest.fixture
def relay_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("RELAY_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("RELAY_POLICY__COOLDOWN_TOKENS", "0")  # the CLI has no flag for it


@pytest.mark.usefixtures("relay_env")
def test_the_command_line_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    problems = problem_file(tmp_path)
    out = tmp_path / "bench"
    large, small = models()
    with serving(ScriptedVLLM(large, small)) as server:
        code = main(bench_argv(server, problems, out, "--title", "sums"))
        printed = capsys.readouterr().out
        counts = requests(large, small)
        assert main(bench_argv(server, problems, out)) == 0  # resumed: nothing to do
        assert requests(large, small) == counts
    assert code == 0
    assert {p.name for p in out.iterdir()} == {
        "results.jsonl",
        "summary.md",
        "summary.json",
        "accuracy_latency.png",
    }
    lines = read_lines(out / "results.jsonl")
    assert lines[0].header is not None and len(lines) == 10
    table = (out / "summary.md").read_text(encoding="utf-8")
    assert table in printed
    assert [row.split("|")[1].strip() for row in table.splitlines()[2:]] == [
        "large",
        "small",
        "relay",
    ]
    assert all("| 66.7% |" in row for row in table.splitlines()[2:])
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert list(summary) == ["large", "small", "relay"]
    assert summary["relay"]["pass_at_1"] == pytest.approx(2 / 3)
    assert summary["relay"]["switches_per_generation"] == 2.0  # the env's cooldown of 0
    assert summary["large"]["speedup"] == pytest.approx(1.0)
    assert (out / "accuracy_latency.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.usefixtures("relay_env")
def test_the_command_line_reports_failures_with_exit_code_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RELAY_LARGE__MAX_RETRIES", "0")
    problems = problem_file(tmp_path)
    out = tmp_path / "bench"
    large, small = models()
    large.faults.append(Fault(status=500))
    with serving(ScriptedVLLM(large, small)) as server:
        argv = bench_argv(server, problems, out, "--modes", "large", "--no-plot")
        assert main([*argv, "--concurrency", "1"]) == 1
        assert requests(large, small) == [3, 0]
        assert main([*argv, "--concurrency", "1"]) == 0  # the failure is retried
        assert requests(large, small) == [4, 0]
    assert not (out / "accuracy_latency.png").exists()
    assert len(read_lines(out / "results.jsonl")) == 1 + 3 + 1


@pytest.mark.usefixtures("relay_env")
@pytest.mark.parametrize("modes", ["wrong", "large,wrong", ",", ""])
def test_the_command_line_refuses_unknown_modes(
    tmp_path: Path, modes: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = bench_argv(NOBODY, problem_file(tmp_path), tmp_path / "out", "--modes", modes)
    assert main(argv) == 2
    assert "--modes takes large, small, relay" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.usefixtures("relay_env")
def test_the_command_line_names_a_bad_problem_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    problems = tmp_path / "bad.jsonl"
    problems.write_text('{"problem": "a"}\n', encoding="utf-8")
    assert main(bench_argv(NOBODY, problems, tmp_path / "out")) == 2
    assert "no 'answer' field" in capsys.readouterr().err
