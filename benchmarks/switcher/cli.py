"""The command line: the run from the options to the report."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
from collections.abc import Mapping, Sequence

from benchmarks import upstream
from benchmarks.machine import REPO, MachineFacts
from relay_integrations.jobs.statistics import median
from relay_integrations.upstream.config import ModelRole

from .analysis import summarize
from .client_cost import ClientCosts, client_costs
from .engine import real_engine
from .export import plot, to_json
from .meters import log
from .options import Options, parse_args
from .report import client_own_cost, report
from .results import RunFacts
from .servers import Server, servers_from_env, servers_up


def run_client(args: Options) -> ClientCosts:
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
            "start them with: RELAY_VLLM_EXECUTOR=uni scripts/vllm_servers.sh start qwen3-large "
            'qwen3-small  (then: eval "$(scripts/vllm_servers.sh env)")',
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
