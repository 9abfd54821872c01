"""The command line: arguments, machine facts, and the run from start to report."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import openai
import scripted_upstream

from .analysis import summarize
from .client_cost import client_costs
from .engine import real_engine
from .export import plot, to_json
from .meters import load_average, log, median
from .report import client_lines, report
from .servers import servers_from_env, servers_up
from .settings import REPO
from .variants import VARIANTS


def machine_facts(argv: Sequence[str]) -> dict[str, Any]:
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    commit = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    changed = subprocess.run(
        ["git", "-C", str(REPO), "status", "--porcelain", "--", "relay_integrations"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.split("\n")
    return {
        "library_uncommitted": [line[3:] for line in changed if line.strip()],
        "command": shlex.join([os.path.relpath(sys.executable, REPO), *argv]),
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "commit": commit,
        "openai": openai.__version__,
        "load_at_start": load_average(),
    }


def parse_args(argv: Sequence[str] | None, doc: str | None) -> argparse.Namespace:
    """The arguments; `doc`: the script's docstring, whose first paragraph describes it."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0] if doc else None)
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
        f"{', '.join(VARIANTS)} (default all; '' for none; see switcher_bench/variants.py)",
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
    parser.add_argument("--serve-fake", action="store_true", help=argparse.SUPPRESS)
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


def run_client(script: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Step 5 against the scripted upstream, started as `script` ``--serve-fake``."""
    log("5. the client's own cost against the scripted upstream (own process)")
    with tempfile.TemporaryFile() as fake_log:
        proc, url = scripted_upstream.start([str(script), "--serve-fake"], fake_log)
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
            scripted_upstream.stop(proc, grace=10)


def main(script: Path, doc: str | None, argv: Sequence[str] | None = None) -> int:
    """The benchmark, run as `script` (it starts itself again with ``--serve-fake``)."""
    raw = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(raw, doc)
    if args.serve_fake:
        scripted_upstream.serve(token_delay=0.0, keep=32)
        return 0
    if args.client_only:
        alone = run_client(script, args)
        print("\n".join(client_lines(alone)))
        if args.json:
            args.json.write_text(json.dumps({"client": alone}, indent=1, default=str))
        return 0
    servers = servers_from_env()
    problems = servers_up(servers)
    if problems:
        print("the tiny vLLM test servers do not answer:", file=sys.stderr)
        for problem in problems:
            print(f"  {problem}", file=sys.stderr)
        print(
            'start them with: scripts/vllm_servers.sh start  (then: eval "$(scripts/vllm_servers.sh env)")',
            file=sys.stderr,
        )
        return 2
    facts = machine_facts([str(Path(sys.argv[0])), *raw])
    facts["servers"] = ", ".join(f"{s.role} {s.model} @ {s.url}" for s in servers.values())
    facts["runs"] = args.runs
    engine = asyncio.run(real_engine(args, servers))
    summary = summarize(engine)
    firsts = [g.requests[0].prompt_tokens for g in engine["generations"] if g.approach == "relay"]
    facts["prompt_tokens"] = round(median(firsts)) if firsts else "?"
    client = None if args.skip_client else run_client(script, args)
    facts["load_at_end"] = load_average()
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
