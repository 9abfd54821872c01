"""Command-line options shared by the subcommands: the two endpoints, from flags or RELAY_*."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ..relay.config import RelayConfig, SwitchPolicy
from ..upstream.config import MODEL_ROLES, SamplingConfig
from ..upstream.errors import RelayError


class CommandError(Exception):
    """Ends a subcommand: its message goes to stderr and `code` is the exit code (2: the
    configuration, 1: the run)."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


@contextmanager
def configuration(command: str = "relaygen") -> Iterator[None]:
    """A configuration that does not validate ends the command with exit code 2 and the
    reason::

        with configuration():
            config = relay_config(args)
    """
    try:
        yield
    except (ValueError, RelayError) as exc:  # pydantic's ValidationError is a ValueError
        raise CommandError(f"{command}: configuration error: {exc}", 2) from exc


def add_endpoint_options(parser: argparse.ArgumentParser, *roles: str) -> None:
    for role in roles:
        parser.add_argument(f"--{role}-url", help=f"OpenAI base URL of the {role} vLLM server")
        parser.add_argument(f"--{role}-model", help=f"served name of the {role} model")


def endpoint_values(
    args: argparse.Namespace, env: dict[str, Any], role: str, need_url: bool = True
) -> dict[str, Any]:
    """The `role` endpoint's settings: ``RELAY_<ROLE>__*`` overridden by ``--<role>-*``."""
    endpoint = dict(env.get(role, {}))
    for option, field in (("url", "base_url"), ("model", "model")):
        if getattr(args, f"{role}_{option}", None):
            endpoint[field] = getattr(args, f"{role}_{option}")
    missing = [f for f in ("base_url", "model") if f not in endpoint and (need_url or f == "model")]
    if missing:
        raise RelayError(
            f"no {role} endpoint: pass --{role}-url and --{role}-model "
            f"(or set RELAY_{role.upper()}__BASE_URL and RELAY_{role.upper()}__MODEL)"
        )
    return endpoint


def add_relay_options(parser: argparse.ArgumentParser) -> None:
    """Endpoints, cue set and sampling of a relay (``relaygen generate``, ``relaygen serve``)."""
    add_endpoint_options(parser, *MODEL_ROLES)
    add_cue_options(parser)
    parser.add_argument(
        "--max-small-tokens",
        type=int,
        help=with_default(
            "the small model's cap per mid-reasoning turn; calibrate with the same "
            "--max-span-tokens",
            SwitchPolicy.model_fields["max_small_tokens"].default,
            "RELAY_POLICY__MAX_SMALL_TOKENS",
        ),
    )
    add_sampling_options(parser, budget="budget for reasoning plus answer")


def with_default(text: str, default: object, variable: str) -> str:
    """An option's help that states what applies without it: the configuration's default,
    unless the environment's `variable` is set (escaped for argparse's ``%`` formatting)::

        with_default("sampling temperature", 0.6, "RELAY_SAMPLING__TEMPERATURE")
        # 'sampling temperature (default: 0.6, unless RELAY_SAMPLING__TEMPERATURE is set)'
    """
    if default is None:
        shown = "not sent: the server's own"
    else:
        shown = f"{default:g}" if isinstance(default, float) else str(default)
    return f"{text} (default: {shown}, unless {variable} is set)".replace("%", "%%")


def add_cue_options(parser: argparse.ArgumentParser) -> None:
    """``--cues`` and ``--allow-model-mismatch``."""
    parser.add_argument(
        "--cues",
        help=with_default(
            "cue artifact path, builtin:NAME, or a JSON list of cues",
            RelayConfig.model_fields["cues"].default,
            "RELAY_CUES",
        ),
    )
    parser.add_argument(
        "--allow-model-mismatch",
        action="store_true",
        help="use a cue artifact calibrated for another model pair",
    )


_INTEGER_SAMPLING = ("top_k", "seed", "max_tokens")


def add_sampling_options(parser: argparse.ArgumentParser, budget: str) -> None:
    """``--temperature``, ``--top-p``, ``--top-k``, ``--min-p``, the penalties, ``--seed`` and
    ``--max-tokens``: every field of :class:`SamplingConfig` (ranges checked by it)."""
    for name in SamplingConfig.model_fields:
        field = SamplingConfig.model_fields[name]
        parser.add_argument(
            "--" + name.replace("_", "-"),
            type=int if name in _INTEGER_SAMPLING else float,
            help=with_default(
                budget if name == "max_tokens" else field.description or name,
                field.default,
                f"RELAY_SAMPLING__{name.upper()}",
            ),
        )


def sampling_values(args: argparse.Namespace, env: dict[str, Any]) -> dict[str, Any]:
    """``RELAY_SAMPLING__*`` with the command line's sampling options on top."""
    values = dict(env.get("sampling", {}))
    for name in SamplingConfig.model_fields:
        if getattr(args, name, None) is not None:
            values[name] = getattr(args, name)
    return values


def relay_config(args: argparse.Namespace) -> RelayConfig:
    """The environment's configuration (RELAY_*), with the command line's options on top."""
    values = RelayConfig.env_values()
    for role in MODEL_ROLES:
        values[role] = endpoint_values(args, values, role)
    if args.cues:
        values["cues"] = _cues(args.cues)
    if args.allow_model_mismatch:
        values["allow_model_mismatch"] = True
    small_cap = vars(args).get("max_small_tokens")  # the commands that run a relay have it
    if small_cap is not None:
        values["policy"] = {**values.get("policy", {}), "max_small_tokens": small_cap}
    values["sampling"] = sampling_values(args, values)
    return RelayConfig.model_validate(values)


def _cues(option: str) -> object:
    """--cues: a JSON list of cues, or an artifact path or builtin:NAME (as it is)."""
    if option.lstrip()[:1] != "[":
        return option
    try:
        return json.loads(option)
    except json.JSONDecodeError as bad:
        raise ValueError(
            f"--cues {option!r} is not a JSON list ({bad.msg} at character {bad.pos}): give "
            """a list such as '["Therefore,", "Now"]', an artifact path or builtin:NAME"""
        ) from bad
