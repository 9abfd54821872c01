"""``relaygen check``: probe the two vLLM servers and print what would help or hurt the relay.

    relaygen check --large-url http://gpu-a:8000/v1 --large-model Qwen/Qwen3-32B \\
                   --small-url http://gpu-b:8000/v1 --small-model Qwen/Qwen3-1.7B \\
                   --cues builtin:qwen3-32b--qwen3-1.7b

Each item of the checklist is ok, a warning, a problem or unknown, with the fix when it is not
ok (:func:`~relay_integrations.relay.server_check.check_servers`); ``--json`` prints the report
as JSON. Exit status: 0 when nothing would break the relay (warnings allowed), 1 when something
would, 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import textwrap
from collections import Counter
from typing import Any, TextIO

from ..relay.config import RelayConfig
from ..relay.server_check import ServerReport, check_servers
from ..upstream.config import MODEL_ROLES
from .options import add_cue_options, add_endpoint_options, configuration, relay_config

STATUS_WIDTH, TITLE_WIDTH, LINE_WIDTH = 8, 21, 100


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "check", help="probe the two vLLM servers: what would help or hurt the relay"
    )
    add_endpoint_options(parser, *MODEL_ROLES)
    add_cue_options(parser)
    parser.add_argument("--json", action="store_true", help="print the report as JSON only")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    with configuration():
        config = relay_config(args)
        report = asyncio.run(check_servers(config))
    if args.json:
        print(report.model_dump_json(indent=2))
    else:
        print_report(sys.stdout, config, report)
    return 1 if report.breaks_relay else 0


def print_report(out: TextIO, config: RelayConfig, report: ServerReport) -> None:
    """The checklist: one item a line (wrapped), its fix below it, then the verdict."""
    print(f"large: {config.large.model} @ {config.large.base_url}", file=out)
    print(f"small: {config.small.model} @ {config.small.base_url}", file=out)
    cues = config.cues if isinstance(config.cues, str) else json.dumps(config.cues)
    print(f"cues:  {cues}\n", file=out)
    indent = " " * (STATUS_WIDTH + TITLE_WIDTH + 2)
    for item in report.items:
        line = f"{item.status:<{STATUS_WIDTH}} {item.title:<{TITLE_WIDTH}} {item.found}"
        print(textwrap.fill(line, LINE_WIDTH, subsequent_indent=indent), file=out)
        if item.fix:
            fix = textwrap.fill(
                f"fix: {item.fix}", LINE_WIDTH, initial_indent=indent, subsequent_indent=indent
            )
            print(fix, file=out)
    count = Counter(item.status for item in report.items)
    tally = f"{_many(count['warning'], 'warning')}, {count['unknown']} unknown"
    if report.breaks_relay:
        print(f"\n{_many(count['problem'], 'problem')} would break the relay ({tally})", file=out)
    else:
        print(f"\nnothing would break the relay ({tally})", file=out)


def _many(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "s")
