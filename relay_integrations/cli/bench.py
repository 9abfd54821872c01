"""``relaygen bench``: accuracy and speed of the large model, the small one and the relay, side by
side on the same problems.

    relaygen bench --problems aime24.jsonl --samples 4 --concurrency 16 --out bench/aime24 \\
        --large-url http://gpu-a:8000/v1 --large-model Qwen/Qwen3-32B \\
        --small-url http://gpu-b:8001/v1 --small-model Qwen/Qwen3-1.7B \\
        --cues builtin:qwen3-32b--qwen3-1.7b --max-tokens 32768

``--out`` receives ``results.jsonl`` (one graded generation a line, written as they finish:
rerun the same command to resume), ``summary.md`` (the table), ``summary.json`` and
``accuracy_latency.png`` (the ``plot`` extra). Grading needs the ``bench`` extra (math-verify).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any, cast

from ..upstream.errors import RelayError
from .options import add_relay_options, configuration, relay_config


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "bench", help="accuracy and latency of large, small and relay on a problem set"
    )
    parser.add_argument("--problems", type=Path, required=True, help="JSON Lines: problem, answer")
    parser.add_argument("--limit", type=int, help="only the first N problems")
    parser.add_argument(
        "--modes",
        default="large,small,relay",
        help="comma-separated, run in this order (default: %(default)s)",
    )
    parser.add_argument(
        "--samples",
        type=int,
        default=1,
        help="generations per problem and mode (default: %(default)s)",
    )
    parser.add_argument(
        "--concurrency", type=int, default=8, help="generations in flight (default: %(default)s)"
    )
    parser.add_argument("--out", type=Path, required=True, help="directory of the results")
    parser.add_argument("--title", help="title of the plot")
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG plot")
    add_relay_options(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ..bench.generate import MODES, Mode
    from ..bench.problems import load_problems

    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        print(f"relaygen: --modes takes {', '.join(MODES)}; got {args.modes!r}", file=sys.stderr)
        return 2
    with configuration():
        config = relay_config(args)
        problems = load_problems(args.problems, limit=args.limit)
    if importlib.util.find_spec("math_verify") is None:
        print(
            "relaygen bench grades with math-verify: pip install 'relay-integrations[bench]'",
            file=sys.stderr,
        )
        return 2
    from ..bench.runner import run_bench

    records = asyncio.run(
        run_bench(
            config,
            problems,
            args.out / "results.jsonl",
            modes=cast(list[Mode], modes),
            samples=args.samples,
            concurrency=args.concurrency,
        )
    )
    return _report(records, args)


def _report(records: list[Any], args: argparse.Namespace) -> int:
    from ..bench.report import markdown_table, write_plot
    from ..bench.stats import summarize

    summaries = summarize(records)
    table = markdown_table(summaries)
    print("\n" + table)
    written = [args.out / "summary.md", args.out / "summary.json"]
    written[0].write_text(table, encoding="utf-8")
    written[1].write_text(
        json.dumps({m: s.model_dump() for m, s in summaries.items()}, indent=2), encoding="utf-8"
    )
    if not args.no_plot and summaries:
        try:
            title = args.title or f"{args.problems.stem}: accuracy against latency"
            written.append(write_plot(summaries, args.out / "accuracy_latency.png", title))
        except RelayError as exc:
            print(f"no plot: {exc}", file=sys.stderr)
    print("wrote " + ", ".join(str(p) for p in written))
    failed = sum(1 for record in records if record.error)
    if failed:
        print(f"relaygen: {failed} generations failed; run the same command to retry them")
        return 1
    return 0
