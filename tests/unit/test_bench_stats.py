"""Summary figures of the benchmark on hand-built records, figures worked out by hand, and the
report (Markdown table, PNG plot)."""

import math
from pathlib import Path
from typing import Any

import pytest

from relay_integrations.bench.generate import BenchRecord, Mode
from relay_integrations.bench.report import markdown_table, write_plot
from relay_integrations.bench.stats import latest, summarize
from relay_integrations.jobs.statistics import median, percentile


def record(mode: Mode, problem: str, sample: int = 0, **fields: Any) -> BenchRecord:
    fields.setdefault("finish_reason", "stop")
    return BenchRecord(mode=mode, problem_id=problem, sample=sample, **fields)


def graded(mode: Mode, pattern: dict[str, list[int]], seconds: float = 1.0) -> list[BenchRecord]:
    """Records of `mode`: per problem, one sample per entry of its correct pattern."""
    return [
        record(mode, problem, sample, correct=bool(hit), seconds=seconds)
        for problem, hits in pattern.items()
        for sample, hit in enumerate(hits)
    ]


def test_pass_at_1_is_the_mean_over_problems_of_sample_accuracy() -> None:
    records = graded("relay", {"p1": [1, 1], "p2": [1, 0], "p3": [0, 0]})
    summary = summarize(records)["relay"]
    # per-problem means 1, 0.5, 0 -> pass@1 = 1.5 / 3 = 0.5
    assert summary.pass_at_1 == pytest.approx(0.5)
    # stdev([1, .5, 0]) = sqrt(((.5)^2 + 0 + (.5)^2) / 2) = 0.5; / sqrt(3) = 0.288675
    assert summary.pass_at_1_se == pytest.approx(0.5 / math.sqrt(3))
    assert summary.pass_at_1_se == pytest.approx(0.2887, abs=1e-4)
    assert (summary.problems, summary.generations, summary.errors) == (3, 6, 0)


def test_unequal_samples_weigh_problems_equally() -> None:
    # p1: 1 of 1 -> 1.0; p2: 1 of 4 -> 0.25; pass@1 = 1.25 / 2 = 0.625 (not 2/5 = 0.4)
    summary = summarize(graded("small", {"p1": [1], "p2": [1, 0, 0, 0]}))["small"]
    assert summary.pass_at_1 == pytest.approx(0.625)
    # stdev([1, .25]) = 0.75 / sqrt(2) = 0.530330; / sqrt(2) = 0.375
    assert summary.pass_at_1_se == pytest.approx(0.375)


def test_one_problem_has_no_standard_error() -> None:
    summary = summarize(graded("large", {"only": [1, 0, 1, 1]}))["large"]
    assert summary.pass_at_1 == pytest.approx(0.75)
    assert summary.pass_at_1_se == 0.0
    assert summary.problems == 1


@pytest.mark.parametrize(
    ("values", "fraction", "expected"),
    [
        ([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 0.9, 9.1),  # position 8.1: 9 + 0.1 * (10 - 9)
        ([10, 1, 9, 2, 8, 3, 7, 4, 6, 5], 0.9, 9.1),  # order does not matter
        ([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 0.5, 5.5),
        ([3.0, 1.0], 0.9, 2.8),  # position 0.9: 1 + 0.9 * 2
        ([1, 2, 3], 0.0, 1.0),
        ([1, 2, 3], 1.0, 3.0),
        ([1, 2, 3, 4, 5], 0.9, 4.6),  # position 3.6: 4 + 0.6
        ([7.5], 0.9, 7.5),  # one value is itself
    ],
)
def test_percentile_interpolates_like_numpy(
    values: list[float], fraction: float, expected: float
) -> None:
    assert percentile(values, fraction) == pytest.approx(expected)


def test_nothing_measured_has_no_percentile_or_median() -> None:
    assert math.isnan(percentile([], 0.5))
    assert math.isnan(median([]))
    assert median([3.0, 1.0, 2.0]) == 2.0


def test_latency_and_speedup_against_large() -> None:
    large = [record("large", f"p{i}", seconds=s) for i, s in enumerate([10.0, 20.0, 30.0])]
    relay = [record("relay", f"p{i}", seconds=s) for i, s in enumerate([4.0, 8.0, 12.0])]
    small = [record("small", f"p{i}", seconds=s) for i, s in enumerate([1.0, 2.0, 3.0, 4.0])]
    summaries = summarize(large + relay + small)
    assert list(summaries) == ["large", "small", "relay"]  # the order of MODES
    # large: mean 20, p90 at position 1.8: 20 + 0.8 * 10 = 28
    assert summaries["large"].mean_seconds == pytest.approx(20.0)
    assert summaries["large"].p90_seconds == pytest.approx(28.0)
    assert summaries["large"].speedup == pytest.approx(1.0)
    # relay: mean 8, p90 8 + 0.8 * 4 = 11.2, speedup 20 / 8 = 2.5
    assert summaries["relay"].mean_seconds == pytest.approx(8.0)
    assert summaries["relay"].p90_seconds == pytest.approx(11.2)
    assert summaries["relay"].speedup == pytest.approx(2.5)
    # small: mean 2.5, p90 at position 2.7: 3 + 0.7 = 3.7, speedup 20 / 2.5 = 8
    assert summaries["small"].mean_seconds == pytest.approx(2.5)
    assert summaries["small"].p90_seconds == pytest.approx(3.7)
    assert summaries["small"].speedup == pytest.approx(8.0)


def test_no_speedup_without_a_large_run() -> None:
    summaries = summarize(graded("relay", {"p1": [1]}, seconds=2.0))
    assert summaries["relay"].speedup is None
    assert summaries["relay"].p90_seconds == pytest.approx(2.0)


def test_large_share_is_token_weighted_and_tokens_are_per_generation() -> None:
    records = [
        record("relay", "p1", completion_tokens={"large": 30, "small": 10}, switches=2),
        record("relay", "p2", completion_tokens={"large": 10, "small": 50}, switches=3),
    ]
    summary = summarize(records)["relay"]
    # (30 + 10) / (40 + 60) = 0.4, not the mean of 0.75 and 1/6 (0.458)
    assert summary.large_share == pytest.approx(0.4)
    assert summary.switches_per_generation == pytest.approx(2.5)  # 5 / 2
    assert summary.tokens_per_generation == pytest.approx({"large": 20.0, "small": 30.0})


def test_tokens_of_a_model_missing_in_some_records_count_as_zero() -> None:
    records = [
        record("relay", "p1", completion_tokens={"large": 30, "small": 10}),
        record("relay", "p2", completion_tokens={"small": 50}),
    ]
    summary = summarize(records)["relay"]
    assert summary.tokens_per_generation == pytest.approx({"large": 15.0, "small": 30.0})
    assert summary.large_share == pytest.approx(30 / 90)


def test_a_model_alone_has_its_own_tokens_only() -> None:
    large = [record("large", "p1", completion_tokens={"large": 100}, large_share=1.0)]
    small = [record("small", "p1", completion_tokens={"small": 80})]
    summaries = summarize(large + small)
    assert summaries["large"].large_share == 1.0
    assert summaries["large"].tokens_per_generation == {"large": 100.0}
    assert summaries["small"].large_share == 0.0
    assert summaries["small"].tokens_per_generation == {"small": 80.0}
    assert summaries["small"].switches_per_generation == 0.0


def test_no_tokens_is_a_share_of_zero() -> None:
    assert summarize([record("relay", "p1")])["relay"].large_share == 0.0


def test_errors_are_counted_but_not_graded() -> None:
    records = [
        *graded("relay", {"p1": [1], "p2": [0]}, seconds=2.0),
        record("relay", "p3", error="EndpointError: boom", finish_reason="error", seconds=99.0),
        record("relay", "p4", error="EndpointError: boom", finish_reason="error"),
    ]
    summary = summarize(records)["relay"]
    # only p1 and p2: pass@1 0.5 (not 1/4), latency 2 (not the failure's 99)
    assert summary.errors == 2
    assert (summary.problems, summary.generations) == (2, 2)
    assert summary.pass_at_1 == pytest.approx(0.5)
    assert summary.mean_seconds == pytest.approx(2.0)
    assert summary.p90_seconds == pytest.approx(2.0)


def test_a_mode_with_only_errors_stays_in_the_report_with_its_errors() -> None:
    records = [*graded("large", {"p1": [1]}), record("relay", "p1", error="boom")]
    summaries = summarize(records)
    assert list(summaries) == ["large", "relay"]
    relay = summaries["relay"]
    assert (relay.generations, relay.errors, relay.speedup) == (0, 1, None)
    row = markdown_table(summaries).splitlines()[-1]
    assert row == "| relay |" + " - |" * 11 + " 0 | 1 |"


def test_latest_keeps_the_last_record_of_a_mode_problem_and_sample() -> None:
    failed = record("relay", "p1", 0, error="EndpointError: boom")
    retried = record("relay", "p1", 0, correct=True, seconds=3.0)
    other_sample = record("relay", "p1", 1, correct=False, seconds=1.0)
    other_mode = record("large", "p1", 0, correct=True, seconds=5.0)
    kept = latest([failed, other_sample, other_mode, retried])
    assert len(kept) == 3
    assert retried in kept and failed not in kept
    assert {r.key for r in kept} == {("relay", "p1", 0), ("relay", "p1", 1), ("large", "p1", 0)}
    # a rerun's success replaces the earlier failure in the summary
    summary = summarize([failed, other_sample, other_mode, retried])["relay"]
    assert summary.errors == 0
    assert summary.generations == 2
    assert summary.pass_at_1 == pytest.approx(0.5)


def summaries_for_report() -> dict[Mode, Any]:
    records = [
        record(
            "large",
            "p1",
            correct=True,
            seconds=10.0,
            completion_tokens={"large": 1000},
            large_share=1.0,
        ),
        record("large", "p2", correct=True, seconds=30.0, completion_tokens={"large": 3000}),
        record(
            "relay",
            "p1",
            correct=True,
            seconds=5.0,
            switches=4,
            completion_tokens={"large": 300, "small": 700},
        ),
        record(
            "relay",
            "p2",
            correct=False,
            seconds=5.0,
            switches=2,
            completion_tokens={"large": 500, "small": 1500},
        ),
        record("relay", "p3", error="EndpointError: boom"),
    ]
    return summarize(records)


def test_markdown_table_has_a_header_and_a_row_per_mode() -> None:
    table = markdown_table(summaries_for_report())
    lines = table.splitlines()
    assert table.endswith("\n")
    assert lines[0].startswith(
        "| mode | pass@1 | ± SE | mean s | p90 s | ms/token | predicted ms/token | speedup |"
    )
    assert lines[1] == "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    assert len(lines) == 4
    assert all(line.count("|") == 15 for line in lines)
    # large: 100%, SE 0, mean 20, p90 10 + 0.9 * 20 = 28, 40 s / 4000 tokens = 10 ms a token,
    # speedup 1, 2000 tokens a generation
    assert lines[2] == (
        "| large | 100.0% | 0.0% | 20.00 | 28.00 | 10.0 | - | 1.00x | 100.0% | 0.0 | 2000 | 0 "
        "| 2 | 0 |"
    )
    # relay: 50%, SE stdev([1, 0]) / sqrt(2) = 0.5, mean 5, 10 s / 3000 tokens = 3.3 ms a token,
    # no prediction without a small run, speedup 20 / 5 = 4, share 800 / 3000 = 26.7%,
    # switches 3, tokens 400 and 1100, one error
    assert lines[3] == (
        "| relay | 50.0% | 50.0% | 5.00 | 5.00 | 3.3 | - | 4.00x | 26.7% | 3.0 | 400 | 1100 "
        "| 2 | 1 |"
    )


def test_time_per_token_is_all_seconds_over_all_written_tokens() -> None:
    records = [
        record("small", "p1", seconds=1.0, completion_tokens={"small": 100}),
        record("small", "p2", seconds=5.0, completion_tokens={"small": 200}),
    ]
    # 6 s / 300 tokens = 20 ms (the mean of the per-generation 10 and 25 ms would be 17.5)
    assert summarize(records)["small"].ms_per_token == pytest.approx(20.0)
    # a mode that wrote nothing has no time per token
    assert summarize(graded("large", {"p1": [1]}))["large"].ms_per_token is None


def test_the_relays_time_per_token_is_predicted_from_both_models_alone() -> None:
    records = [
        record("large", "p1", seconds=8.0, completion_tokens={"large": 100}),  # 80 ms
        record("small", "p1", seconds=4.0, completion_tokens={"small": 200}),  # 20 ms
        record("relay", "p1", seconds=9.0, completion_tokens={"large": 75, "small": 25}),
    ]
    summaries = summarize(records)
    relay = summaries["relay"]
    # share 0.75: 0.75 * 80 + 0.25 * 20 = 65 ms predicted; measured 9 s / 100 tokens = 90 ms
    assert relay.large_share == pytest.approx(0.75)
    assert relay.predicted_ms_per_token == pytest.approx(65.0)
    assert relay.ms_per_token == pytest.approx(90.0)
    # the same as the docs' formula: large * (s + (1 - s) / r) with r = 80 / 20
    assert relay.predicted_ms_per_token == pytest.approx(80 * (0.75 + 0.25 / 4))
    assert summaries["large"].predicted_ms_per_token is None
    row = markdown_table(summaries).splitlines()[-1]
    assert "| 90.0 | 65.0 |" in row
    # without the small model alone there is nothing to predict from
    assert summarize([records[0], records[2]])["relay"].predicted_ms_per_token is None


def test_markdown_table_without_large_has_no_speedup() -> None:
    summaries = summarize(graded("small", {"p1": [1, 0]}, seconds=1.5))
    row = markdown_table(summaries).splitlines()[2]
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert cells[:6] == ["small", "50.0%", "0.0%", "1.50", "1.50", "-"]


def test_markdown_table_of_nothing_is_the_header() -> None:
    assert len(markdown_table({}).splitlines()) == 2


def test_write_plot_writes_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    target = tmp_path / "accuracy_latency.png"
    written = write_plot(summaries_for_report(), target, title="test set")
    assert written == target
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert target.stat().st_size > 1000
