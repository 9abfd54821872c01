"""``relaygen serve``: the relay as an OpenAI-compatible server (``relay-integrations[server]``).

    relaygen serve --large-url http://gpu-a:8000/v1 --large-model Qwen/Qwen3-32B \\
                   --small-url http://gpu-b:8000/v1 --small-model Qwen/Qwen3-1.7B \\
                   --cues calibration/cues.json --port 9000 --api-key "$KEY"

The endpoints also come from ``RELAY_LARGE__BASE_URL``, ... and the server's options from
``RELAY_SERVER_<OPTION>`` (``RELAY_SERVER_PORT``, ``RELAY_SERVER_API_KEYS=k1,k2``).
See docs/deployment.md.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .options import add_relay_options, configuration, relay_config


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "serve",
        help="serve the relay as an OpenAI-compatible API",
        # the defaults below are ServerSettings' (tests/unit/test_cli_options.py holds them
        # to it); the server extra is not imported to build the parser of every command
        description="Every option also comes from RELAY_SERVER_<OPTION> (RELAY_SERVER_PORT, "
        "RELAY_SERVER_API_KEYS=k1,k2); the command line wins.",
    )
    add_relay_options(parser)
    parser.add_argument("--host", help="address to listen on (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port to listen on (default: 8000)")
    parser.add_argument(
        "--served-model-name",
        action="append",
        dest="served_model_names",
        help="a name clients may send as 'model' (repeatable; default: the large model's name "
        "and LARGE+SMALL)",
    )
    parser.add_argument(
        "--api-key",
        action="append",
        dest="api_keys",
        help="a Bearer key clients must send (repeatable; default: none asked for)",
    )
    parser.add_argument(
        "--max-concurrent-generations",
        type=int,
        help="generations in flight; one more is answered 429 (default: 256)",
    )
    parser.add_argument("--retry-after", type=int, help="Retry-After seconds of a 429 (default: 1)")
    parser.add_argument(
        "--max-body-bytes",
        type=int,
        help="largest request body; a larger one is answered 413 (default: 4194304: 4 MiB)",
    )
    parser.add_argument(
        "--max-messages",
        type=int,
        help="most messages a request may send (of the Responses API: that its input makes), "
        "else 400 (default: 1024)",
    )
    parser.add_argument(
        "--max-tokens-limit",
        type=int,
        help="largest max_tokens a client may ask (default: 32768)",
    )
    parser.add_argument(
        "--max-stop-strings", type=int, help="stop strings a request may send (default: 4)"
    )
    parser.add_argument(
        "--max-stop-length", type=int, help="characters per stop string (default: 256)"
    )
    parser.add_argument(
        "--shutdown-timeout",
        type=int,
        help="seconds in-flight streams get at shutdown (default: 30)",
    )
    parser.add_argument(
        "--keep-alive-timeout",
        type=int,
        help="seconds an idle client connection stays open (default: 75)",
    )
    parser.add_argument(
        "--head-timeout",
        type=float,
        help="seconds to send a request head, else 408 (default: 30)",
    )
    parser.add_argument(
        "--body-timeout",
        type=float,
        help="seconds to send a request body, else 408 (default: 60)",
    )
    parser.add_argument(
        "--send-timeout",
        type=float,
        help="seconds a client may accept nothing before its stream is ended (default: 60)",
    )
    parser.add_argument(
        "--max-connections",
        type=int,
        help="client connections open at once, per process; one more gets 503 (default: "
        "2048; 0: no cap)",
    )
    parser.add_argument(
        "--max-connections-per-client",
        type=int,
        help="connections open at once from one client address, per process; one more gets "
        "503 (default: 512; 0: no cap)",
    )
    parser.add_argument(
        "--sse-keepalive",
        type=float,
        help="seconds a stream may stay silent before an SSE comment keeps proxies from "
        "cutting it (default: 15; 0: never)",
    )
    parser.add_argument(
        "--health-timeout",
        type=float,
        help="seconds each upstream has to answer /health (default: 5)",
    )
    parser.add_argument(
        "--health-cache-seconds",
        type=float,
        help="seconds one upstream check answers every /health and /readyz probe (default: 1)",
    )
    parser.add_argument(
        "--otlp-endpoint",
        help="OTLP/HTTP collector's base URL to export traces to, e.g. http://localhost:4318 "
        "(default: none, or where the OTEL_EXPORTER_OTLP_* variables say)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        help="processes sharing the port, each with its own --max-concurrent-generations "
        "(default: 1)",
    )
    parser.add_argument(
        "--log-format", choices=["json", "text"], help="log lines as (default: json)"
    )
    parser.add_argument(
        "--log-level",
        choices=["debug", "info", "warning", "error"],
        help="least severe level logged (default: info)",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:
        from ..server import ServerSettings
        from ..server.runner import serve
    except ImportError as missing:
        print(
            f"relaygen serve needs the server extra ({missing.name} is missing): "
            "pip install 'relay-integrations[server]'",
            file=sys.stderr,
        )
        return 2
    fields = (
        "host",
        "port",
        "served_model_names",
        "api_keys",
        "max_concurrent_generations",
        "retry_after",
        "max_body_bytes",
        "max_messages",
        "max_tokens_limit",
        "max_stop_strings",
        "max_stop_length",
        "shutdown_timeout",
        "keep_alive_timeout",
        "head_timeout",
        "body_timeout",
        "send_timeout",
        "max_connections",
        "max_connections_per_client",
        "sse_keepalive",
        "health_timeout",
        "health_cache_seconds",
        "otlp_endpoint",
        "workers",
        "log_format",
        "log_level",
    )
    with configuration("relaygen serve"):
        config = relay_config(args)
        settings = ServerSettings.from_env(**{name: getattr(args, name) for name in fields})
    with configuration(
        "relaygen serve"
    ):  # a cue file that does not load, workers that do not start
        serve(config, settings)
    return 0
