"""``python -m benchmarks context-length``'s report, on fabricated measurements (no vLLM):
the medians, the tokens / text ratios, the targets, the plot and the CLI's output."""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from benchmarks import __main__ as benchmarks_main
from benchmarks.context_length import cli
from benchmarks.context_length.figures import Generation, Measured, RequestCost
from benchmarks.context_length.report import cells, report, targets
from benchmarks.machine import MachineFacts, reference_seconds
from relay_integrations.relay import ModelRole

# API CPU a generation (large, small) in seconds, over 4 switches
CPU = {
    (1024, "text"): (0.16, 0.08),
    (1024, "tokens"): (0.12, 0.08),
    (32768, "text"): (0.80, 0.80),
    (32768, "tokens"): (0.24, 0.16),
    (1024, "alone"): (0.10, 0.0),
    (32768, "alone"): (0.30, 0.0),
}


def generation(context: int, path: str, run: int) -> Generation:
    large, small = CPU[(context, path)]
    alone = path == "alone"
    return Generation(
        context=context,
        prompt_tokens=context - 3,
        path=path,
        wall=(2.0 if alone else 3.0) + run,  # runs 0, 1, 2: the median is run 1's
        switches=0 if alone else 4,
        api_cpu={"large": large + 0.04 * (run - 1), "small": small},
        requests={"large": 1 if alone else 6, "small": 0 if alone else 5},
        request_bytes={"large": context * 4, "small": 0 if alone else context * 3},
        routes={"/v1/chat/completions": 1} if alone else {"/v1/completions": 9, "/tokenize": 2},
    )


def fabricated() -> list[Generation]:
    return [
        generation(context, path, run)
        for context in (1024, 32768)
        for run in range(3)
        for path in ("text", "tokens", "alone")
    ]


def test_a_cell_is_the_median_of_its_generations() -> None:
    found = {(c.context, c.path): c for c in cells(fabricated())}
    text = found[(32768, "text")]
    assert text.generations == 3 and text.wall == 4.0 and text.requests == 11
    assert text.cpu_per_switch == {"large": pytest.approx(0.2), "small": pytest.approx(0.2)}
    assert text.request_bytes == 32768 * 7 and text.routes == {"/tokenize": 2, "/v1/completions": 9}
    assert math.isnan(found[(1024, "alone")].cpu_per_switch["large"])  # it does not switch


COSTS = [
    RequestCost(1024, "render", 0.0025),
    RequestCost(1024, "completion, prompt as ids", 0.004),
    RequestCost(32768, "render", 0.041),
    RequestCost(32768, "completion, prompt as ids", 0.021),
]


def test_the_report_gives_figures_ratios_targets_and_request_costs() -> None:
    lines = report(Measured(fabricated(), COSTS))
    assert (
        "| 32768 (32765) | text | 200.0 / 200.0 | 800.0 / 800.0 | 325.0 | 11 | 224 | 4.00 | 1.33 |"
        in lines
    )  # added a switch: (0.8 + 0.8 - 0.3 alone) / 4
    assert "| 1024 (1021) | alone | - / - | 100.0 / 0.0 | - | 1 | 4 | 3.00 | - |" in lines
    # tokens / text at 32k: large 0.24/0.8, small 0.16/0.8, both 0.4/1.6
    assert "| 32768 | 0.30, 0.20, 0.25 | 1.00 | 1.00 | 1.00 |" in lines
    # tokens 32k / 1k: 0.4 / 0.2 = 2 (<= 3); text 1.6 / 0.24
    assert (
        "tokens, API CPU a switch at 32768 / at 1024: 2.00 (target <= 3: met); text: 6.67" in lines
    )
    assert "API CPU a switch at 32768, tokens / text: 0.25 (target < 0.5: met)" in lines
    # beyond the large model alone: tokens (0.4 - 0.3) / 4 at 32k, (0.2 - 0.1) / 4 at 1k; text
    # (1.6 - 0.3) / 4 and (0.24 - 0.1) / 4
    assert (
        "tokens, API CPU added a switch at 32768 / at 1024: 1.00 (target <= 3: met); text: 9.29"
        in lines
    )
    assert "API CPU added a switch at 32768, tokens / text: 0.08 (target < 0.5: met)" in lines
    assert "requests a generation at 32768, alone: /v1/chat/completions 1" in lines
    assert lines[-4:] == [
        "| one request, large API server's CPU (ms) | render | completion, prompt as ids |",
        "|---|---|---|",
        "| context 1024 | 2.5 | 4.0 |",
        "| context 32768 | 41.0 | 21.0 |",
    ]


def test_a_missed_target_is_said() -> None:
    assert targets(cells(fabricated()[:3])) == ["targets: need two context lengths with both paths"]
    as_text: dict[ModelRole, float] = {
        "large": 0.8,
        "small": 0.8,
    }  # tokens at 32k no cheaper than text
    worse = [
        replace(g, api_cpu=as_text) if (g.context, g.path) == (32768, "tokens") else g
        for g in fabricated()
    ]
    assert targets(cells(worse)) == [
        "tokens, API CPU a switch at 32768 / at 1024: 8.00 (target <= 3: MISSED); text: 6.67",
        "API CPU a switch at 32768, tokens / text: 1.00 (target < 0.5: MISSED)",
        "tokens, API CPU added a switch at 32768 / at 1024: 13.00 (target <= 3: MISSED); "
        "text: 9.29",
        "API CPU added a switch at 32768, tokens / text: 1.00 (target < 0.5: MISSED)",
    ]
    without_alone = [g for g in worse if g.path != "alone"]
    assert len(targets(cells(without_alone))) == 2  # the added figure needs the large alone


def test_the_cli_prints_the_report_and_draws_the_plot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """main() as run, with the measuring (the vLLM servers) replaced by the fabrication."""

    def fake_run(args: argparse.Namespace, argv: Sequence[str]) -> tuple[list[str], Measured]:
        assert args.lengths == [1024, 4096] and args.generations == 1  # --quick
        return ["command: fabricated"], Measured(fabricated(), COSTS)

    monkeypatch.setattr(cli, "run", fake_run)
    out = tmp_path / "cpu.png"
    assert benchmarks_main.main(["context-length", "--quick", "--plot", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("command: fabricated\n\n| context (prompt tokens) |")
    assert "target < 0.5: met" in printed
    assert out.read_bytes().startswith(b"\x89PNG")


def test_the_options() -> None:
    assert cli.lengths("1k,4k,16k,32k") == [1024, 4096, 16384, 32768]
    assert cli.lengths("1000,2k") == [1000, 2048]
    full = cli.parse([])
    assert full.lengths == [1024, 4096, 16384, 32768] and full.generations == 3
    assert cli.parse(["--quick", "--generations", "2"]).generations == 2
    assert cli.parse(["--lengths", "2k"]).lengths == [2048]


def test_the_machines_speed_is_said_from_the_reference_workload() -> None:
    assert 0 < reference_seconds(runs=1) < 10
    facts = MachineFacts(
        command="python -m benchmarks context-length",
        commit="abc1234",
        library_uncommitted=[],
        cpus=2,
        cpus_usable=2,
        cpu="a CPU",
        python="3.11",
        platform="Linux",
        versions={},
        load_at_start=[1.0, 1.0, 1.0],
        reference_ms=[29.74],
    )
    assert facts.speed().endswith("took 29.7 ms at the start")
    facts.reference_ms.append(31.25)
    assert facts.speed() == (
        "the reference workload (benchmarks/machine.py) took 29.7 ms at the start and "
        "31.2 ms at the end"
    )
