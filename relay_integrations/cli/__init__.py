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
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from ..relay.config import RelayEnvironmentWarning
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
    with warnings.catch_warnings():  # restores the warning display on the way out
        warnings.showwarning = _one_line_for_the_environment(warnings.showwarning)
        return _run(args)


def _run(args: argparse.Namespace) -> int:
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


def _one_line_for_the_environment(show: Callable[..., None]) -> Callable[..., None]:
    """A warning about a RELAY_* variable as one line, ``relaygen: RELAY_X ...``: where in
    the library it was raised would tell a user of the command line nothing."""

    def shown(message: Warning | str, category: type[Warning], *where: Any, **kw: Any) -> None:
        if issubclass(category, RelayEnvironmentWarning):
            print(f"relaygen: {message}", file=sys.stderr)
        else:
            show(message, category, *where, **kw)

    return shown
