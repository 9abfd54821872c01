"""Command-line options shared by the subcommands: the two endpoints, from flags or RELAY_*."""

from __future__ import annotations

import argparse
from typing import Any

from ..core.errors import RelayError


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
