"""``relaygen``: the command line of relay_integrations.

    relaygen generate "What is 17 * 23?" --large-url ... --small-url ...
    relaygen calibrate --problems amc23.jsonl --samples 4 --large-url ... --small-url ...
    relaygen serve --large-url ... --small-url ... --cues cues.json --port 9000
    relaygen bench --problems aime24.jsonl --samples 4 --out bench/ --large-url ... --small-url ...
    relaygen check --large-url ... --large-model ... --small-url ... --small-model ...

Every endpoint option can come from the environment instead (``RELAY_LARGE__BASE_URL``, ...
see :meth:`~relay_integrations.relay.config.RelayConfig.from_env`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ..upstream.errors import RelayError
from . import bench, calibrate, check, generate, serve
from .options import CommandError


def command_line() -> argparse.ArgumentParser:
    """The parser of ``relaygen`` and its subcommands (``relaygen --help``)."""
    parser = argparse.ArgumentParser(prog="relaygen", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for command in (generate, calibrate, serve, bench, check):
        command.add_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = command_line().parse_args(argv)
    try:
        code: int = args.run(args)
    except CommandError as exc:
        print(exc, file=sys.stderr)
        return exc.code
    except RelayError as exc:  # the run failed: an endpoint, a file
        print(f"\nrelaygen: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return code
