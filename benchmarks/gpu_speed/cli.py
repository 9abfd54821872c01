"""``python -m benchmarks gpu-speed``: the relay against two upstreams at GPU speed."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from benchmarks.machine import MachineFacts
from relay_integrations.jobs.progress import Progress
from relay_integrations.testing.gpu_speed import LatencyModel
from relay_integrations.upstream.config import ModelRole

from .report import Level, keeps_up_to, level, plot, requests_lines, table
from .runs import Load, Run, Setup, large_alone_run, relay_run, serve_run
from .traces import load_traces

FIGURES = Path(__file__).with_name("h200-qwen3-ctx1k.json")
CONCURRENCY = (1, 8, 64, 256, 1000)
QUICK_CONCURRENCY = (1, 8, 64, 256)


def parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks gpu-speed",
        description="The relay on upstreams that keep the step times of a GPU pair "
        "(measured H200 kernel times of Qwen3-32B and Qwen3-1.7B by default).",
    )
    parser.add_argument(
        "--traces",
        type=Path,
        required=True,
        help="JSON Lines: 'text' (whole traces) or 'solution' and 'answer' (MATH-500)",
    )
    parser.add_argument(
        "--trace-count",
        type=int,
        default=8,
        help="traces used, in file order (generation g writes trace g mod this: every level the same mix)",
    )
    parser.add_argument("--min-tokens", type=int, default=150, help="shortest trace used")
    parser.add_argument("--figures", type=Path, default=FIGURES, help="step times (H200 shape)")
    parser.add_argument("--large-model", default="qwen3-32b", help="the figures' large model")
    parser.add_argument("--small-model", default="qwen3-1.7b", help="the figures' small model")
    parser.add_argument(
        "--step-overhead-ms", type=float, default=0.0, help="a scheduler's CPU time per step"
    )
    parser.add_argument(
        "--concurrency", type=int, nargs="+", help=f"levels (default {list(CONCURRENCY)})"
    )
    parser.add_argument(
        "--quick", action="store_true", help=f"levels {list(QUICK_CONCURRENCY)}, no serve at 256"
    )
    parser.add_argument(
        "--generations",
        type=int,
        default=8,
        help="generations at each level, at least as many as run at once (default 8)",
    )
    parser.add_argument("--skip-serve", action="store_true", help="no relaygen serve runs")
    parser.add_argument(
        "--prompt-path",
        choices=["auto", "tokens", "text"],
        default="auto",
        help="how the relay sends prompts (RelayConfig.prompt_path; default auto: token ids)",
    )
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--plot", type=Path, help="draw the speed-up here (PNG)")
    return parser.parse_args(argv)


async def measure(setup: Setup, load: Load, with_serve: bool) -> tuple[Run, Run, Run | None]:
    relay = await relay_run(setup, load)
    large = await large_alone_run(setup, load)
    serve = await serve_run(setup, load) if with_serve else None
    return relay, large, serve


def main(argv: Sequence[str]) -> int:
    args = parse(argv)
    levels_asked = args.concurrency or (QUICK_CONCURRENCY if args.quick else CONCURRENCY)
    facts = MachineFacts.now(["python", "-m", "benchmarks", "gpu-speed", *argv])
    traces = load_traces(args.traces, args.trace_count, args.min_tokens)
    models: dict[ModelRole, str] = {"large": args.large_model, "small": args.small_model}
    latencies: dict[ModelRole, LatencyModel] = {
        role: LatencyModel.from_figures(args.figures, name, step_overhead_ms=args.step_overhead_ms)
        for role, name in models.items()
    }
    print(
        f"commit {facts.commit}, {facts.cpus_usable} cores ({facts.cpu}), load {facts.load_at_start}",
        file=sys.stderr,
    )
    levels: list[Level] = []
    runs: list[dict[str, object]] = []
    with (
        tempfile.TemporaryDirectory(prefix="gpu-speed-") as logs,
        Progress("levels", len(levels_asked)) as progress,
    ):
        setup = Setup(
            traces,
            args.traces,
            args.trace_count,
            args.min_tokens,
            args.figures,
            models,
            args.step_overhead_ms,
            Path(logs),
            args.prompt_path,
        )
        for concurrency in levels_asked:
            with_serve = not args.skip_serve and not (args.quick and concurrency >= 256)
            load = Load(concurrency, max(concurrency, args.generations))
            relay, large, serve = asyncio.run(measure(setup, load, with_serve))
            levels.append(level(latencies, relay, large, serve))
            runs += [_summary(run) for run in (relay, large, serve) if run is not None]
            progress.advance(
                note=f"{concurrency} at once: relay / ideal {levels[-1].relay_over_ideal:.3f}"
            )
    facts.finished()
    print(table(levels))
    print(f"\n{keeps_up_to(levels)}")
    print("\n".join(["", *requests_lines(levels), "", f"machine speed: {facts.speed()}"]))
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "facts": facts.model_dump(),
                    "traces": str(args.traces),
                    "figures": str(args.figures),
                    "models": models,
                    "prompt_path": args.prompt_path,
                    "levels": [x.model_dump() for x in levels],
                    "runs": runs,
                },
                indent=1,
            )
        )
    if args.plot:
        plot(levels, args.plot)
    return 0


def _summary(run: Run) -> dict[str, object]:
    return {
        "approach": run.approach,
        "concurrency": run.load.concurrency,
        "generations": run.load.generations,
        "walls": [round(w, 4) for w in run.walls],
        "seconds": run.seconds,
        "tokens": run.tokens,
        "cpu_seconds": run.cpu_seconds,
        "upstreams": run.upstreams,
    }
