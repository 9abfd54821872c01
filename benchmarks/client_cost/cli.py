"""``python -m benchmarks client-cost``: the two fits of the client's CPU, and their cells."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel

from benchmarks import upstream
from benchmarks.machine import REPO, MachineFacts

from .fit import Cell, Fit, cpu_fit


class Costs(BaseModel):
    """One fit and its cells, with the endpoints' `stop_limit` (None: every stop at the server)."""

    stop_limit: int | None
    fit: Fit
    cells: list[Cell]


def parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks client-cost",
        description="The relay's client CPU against the scripted upstream, fitted to "
        "cpu = a*tokens + b*switches + c*generations (docs/benchmarks.md: The client's CPU).",
    )
    add = parser.add_argument
    add("--quick", action="store_true", help="2 rounds of 8 (default 5 of 10)")
    add("--rounds", type=int, help="rounds over the 9 cells")
    add("--per-cell", type=int, help="generations per cell and round")
    add(
        "--stop-limit",
        type=int,
        default=1,
        help="the second fit's max_stop_strings (stops found in the stream; default 1: every "
        "cue and sentence end); -1 skips it",
    )
    add("--json", type=Path, help="write the fits and cells to this JSON file")
    args = parser.parse_args(argv)
    args.rounds = args.rounds or (2 if args.quick else 5)
    args.per_cell = args.per_cell or (8 if args.quick else 10)
    return args


async def measure(url: str, rounds: int, per_cell: int, limits: list[int | None]) -> list[Costs]:
    costs = []
    for limit in limits:
        print(f"client CPU fit, {label(limit)}", file=sys.stderr, flush=True)
        fit, cells = await cpu_fit(url, rounds, per_cell, limit)
        costs.append(Costs(stop_limit=limit, fit=fit, cells=cells))
    return costs


def label(stop_limit: int | None) -> str:
    return "stop strings at the server" if stop_limit is None else f"max_stop_strings={stop_limit}"


def fit_line(name: str, f: Fit) -> str:
    return (
        f"{name:34} a = {f.cpu_per_token_us:5.1f} us per streamed token, "
        f"b = {f.cpu_per_switch_ms:.2f} ms per switch, c = {f.cpu_per_generation_ms:.2f} ms "
        f"per generation (R^2 {f.r_squared:.4f}, largest residual "
        f"{100 * f.max_relative_residual:.1f}%)"
    )


def report(costs: list[Costs], machine: MachineFacts) -> list[str]:
    lines = [
        f"command: {machine.command}",
        f"machine: {machine.cpus} CPUs, {machine.cpu}, Python {machine.python}; "
        f"repo {machine.commit}; load {machine.load_at_start} at start, {machine.load_at_end} "
        "at end",
        "CPU time of this process against the scripted upstream (its own process), least "
        f"squares cpu = a*tokens + b*switches + c*generations over {len(costs[0].cells)} cells "
        f"(each cell's least CPU of {len(costs[0].cells[0].round_cpu)} rounds):",
    ]
    lines += [fit_line(label(c.stop_limit), c.fit) for c in costs]
    lines.append(
        f"{'switches':>8} {'tokens':>7} {'requests':>8} {'cpu ms/gen least':>16} "
        f"{'mean':>6} {'wall ms/gen':>11}"
    )
    for x in sorted(costs[0].cells, key=lambda x: (x.switches, x.tokens)):
        lines.append(
            f"{x.switches / x.gens:>8.1f} {x.tokens / x.gens:>7.0f} {x.reqs / x.gens:>8.1f} "
            f"{1e3 * min(x.round_cpu):>16.2f} {1e3 * x.cpu / x.gens:>6.2f} "
            f"{1e3 * x.wall / x.gens:>11.2f}"
        )
    return lines


def main(argv: Sequence[str]) -> int:
    """The benchmark; its exit status."""
    args = parse(argv)
    python = os.path.relpath(sys.executable, REPO)
    machine = MachineFacts.now([python, "-m", "benchmarks", "client-cost", *argv])
    limits = [None] + ([args.stop_limit] if args.stop_limit >= 0 else [])
    with tempfile.TemporaryFile() as upstream_log:
        proc, url = upstream.start(token_delay=0.0, log=upstream_log)
        try:
            costs = asyncio.run(measure(url, args.rounds, args.per_cell, limits))
        finally:
            upstream.stop(proc, grace=10)
    machine.finished()
    print("\n".join(report(costs, machine)))
    if args.json:
        figures = {"machine": machine.model_dump(), "fits": [c.model_dump() for c in costs]}
        args.json.write_text(json.dumps(figures, indent=1))
    return 0
