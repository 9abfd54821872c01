"""The command line: ``python -m benchmarks server-load [options]``; the run from the start of
the processes to the report, and the exit code (1: a response was wrong or a slot leaked)."""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from ..machine import MachineFacts
from . import __doc__ as package_doc
from . import report, workers
from .figures import Figures, Record, WorkerCountFigures, WorkersRecord
from .load import benchmark
from .processes import relay_log_lines, running, running_side_by_side, server_env
from .settings import CONCURRENCY, QUICK, Settings

PROG = ("python", "-m", "benchmarks", "server-load")


def parser() -> argparse.ArgumentParser:
    """The flags; only those given are in what it parses (`Settings` has the defaults)."""
    parser = argparse.ArgumentParser(
        prog=" ".join(PROG),
        description=(package_doc or "").split("\n")[0],
        argument_default=argparse.SUPPRESS,
    )
    add = parser.add_argument
    add("--concurrency", type=int, help="streams at once (200; --quick: 50)")
    add("--rounds", type=int, help="load rounds per path (3; --quick: 2)")
    add("--quick", action="store_true", help="--concurrency 50 --rounds 2 where not given")
    add("--token-delay", type=float, help="upstream s/token (0.002)")
    add("--sequential", type=int, help="single requests each way (20)")
    add(
        "--endpoint-concurrency",
        type=int,
        help="the relay's max_concurrency per endpoint (default: --concurrency)",
    )
    add("--timeout", type=float, help="client timeout, seconds (300)")
    add(
        "--keepalive-expiry",
        type=float,
        help="seconds the client keeps an idle connection (httpx's default, 5; uvicorn closes "
        "one idle for 5 s)",
    )
    add(
        "--workers",
        type=worker_counts,
        help="compare relaygen serve --workers N for these N side by side, e.g. 1,2,4 (instead "
        "of the server against the in-process core)",
    )
    add("--json", type=Path, dest="json_path", help="write all figures and samples here")
    return parser


def worker_counts(text: str) -> list[int]:
    """``1,2,4`` -> [1, 2, 4]: distinct, in order, each at least 1."""
    counts = list(dict.fromkeys(int(part) for part in text.split(",")))
    if any(count < 1 for count in counts):
        raise argparse.ArgumentTypeError(f"worker counts are at least 1: {text}")
    return counts


def parse_args(argv: Sequence[str]) -> Settings:
    given = vars(parser().parse_args(argv))
    values = {**(QUICK if given.get("quick") else {}), **given}
    values.setdefault("endpoint_concurrency", values.get("concurrency", CONCURRENCY))
    return Settings(**values)


def main(argv: Sequence[str]) -> int:
    settings = parse_args(argv)
    signal.signal(signal.SIGTERM, _terminated)  # so that the children are stopped
    facts = MachineFacts.now([Path(sys.executable).name, *PROG[1:], *argv])
    try:
        if settings.workers:
            failed = any(f.errors for f in compare_workers(settings, facts))
        else:
            failed = run(settings, facts).failed
    except KeyboardInterrupt:
        print("interrupted; the upstream and the relays were stopped", file=sys.stderr)
        return 130
    return 1 if failed else 0


def run(settings: Settings, facts: MachineFacts) -> Figures:
    """Start both processes, measure, report; the processes are stopped whatever happens."""
    with tempfile.TemporaryDirectory(prefix="bench-load-") as tmp:
        logs = Path(tmp)
        with running(settings, logs) as processes:
            figures = asyncio.run(benchmark(settings, processes))
            facts.finished()
            report.report(figures, facts, processes, settings)
        lines = relay_log_lines(logs)
    report.relay_log(lines)
    if settings.json_path:
        record = Record(
            facts=facts,
            relay_command=processes.relay_command,
            relay_env=processes.relay_env,
            settings=settings,
            figures=figures,
            relay_log_lines=len(lines),
        )
        settings.json_path.write_text(json.dumps(record.model_dump(mode="json"), indent=1))
        print(f"figures written to {settings.json_path}")
    return figures


def compare_workers(settings: Settings, facts: MachineFacts) -> list[WorkerCountFigures]:
    """Start the upstream and a relay per worker count, measure, report; all processes are
    stopped whatever happens."""
    with tempfile.TemporaryDirectory(prefix="bench-workers-") as tmp:
        with running_side_by_side(settings, Path(tmp)) as (upstream_proc, relays):
            figures = asyncio.run(workers.compare(settings, relays, upstream_proc.pid))
            facts.finished()
            report.workers(figures, facts, relays, settings)
        report.relay_log([line for relay in relays for line in relay.warnings()])
    if settings.json_path:
        record = WorkersRecord(
            facts=facts,
            relay_commands=[relay.command for relay in relays],
            relay_env=server_env(settings.endpoint_concurrency),
            settings=settings,
            figures=figures,
        )
        settings.json_path.write_text(json.dumps(record.model_dump(mode="json"), indent=1))
        print(f"figures written to {settings.json_path}")
    return figures


def _terminated(signum: int, frame: object) -> NoReturn:
    sys.exit(143)
