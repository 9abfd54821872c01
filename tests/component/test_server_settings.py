"""ServerSettings from RELAY_SERVER_* variables, and how the server sizes its upstream clients."""

from __future__ import annotations

import argparse

import pytest
from pydantic import ValidationError

from relay_integrations.cli import serve
from relay_integrations.relay import EndpointConfig, RelayConfig
from relay_integrations.server import RelayServer, ServerSettings
from relay_integrations.server.errors import ApiError
from relay_integrations.server.protocol import ChatCompletionRequest


def test_settings_come_from_the_environment_and_flags_win() -> None:
    env = {
        "RELAY_SERVER_PORT": "9000",
        "RELAY_SERVER_API_KEYS": "k1, k2,",
        "RELAY_SERVER_SERVED_MODEL_NAMES": "relay",
        "RELAY_SERVER_LOG_FORMAT": "text",
        "RELAY_LARGE__MODEL": "not ours",  # the relay's own variables are not the server's
    }
    settings = ServerSettings.from_env(env, port=None, max_messages=8)
    assert settings.port == 9000 and settings.max_messages == 8
    assert [k.get_secret_value() for k in settings.api_keys] == ["k1", "k2"]
    assert settings.served_model_names == ["relay"] and settings.log_format == "text"
    assert ServerSettings.from_env(env, port=9001).port == 9001
    with pytest.raises(ValidationError, match="port"):
        ServerSettings.from_env({"RELAY_SERVER_PORT": "99999"})


def test_default_endpoint_limits_grow_to_the_generation_limit() -> None:
    config = RelayConfig(
        large=EndpointConfig(base_url="http://a/v1", model="l"),  # default: 64
        small=EndpointConfig(base_url="http://b/v1", model="s", max_concurrency=8),
        cues=["Now"],
    )
    server = RelayServer(config, ServerSettings(max_concurrent_generations=300))
    assert server.config.large.max_concurrency == 300  # else 236 admitted generations queue
    assert server.config.small.max_concurrency == 8  # set on purpose: kept
    assert server.model_names == ["l", "l+s"]


def test_every_setting_is_a_relaygen_serve_option() -> None:
    parser = argparse.ArgumentParser()
    serve.add_parser(parser.add_subparsers())
    args = parser.parse_args(["serve", "--max-stop-strings", "8", "--max-stop-length", "64"])
    assert (args.max_stop_strings, args.max_stop_length) == (8, 64)
    assert all(hasattr(args, name) for name in ServerSettings.model_fields)


def test_the_stop_bounds_are_configurable_and_name_stop() -> None:
    settings = ServerSettings.from_env({"RELAY_SERVER_MAX_STOP_STRINGS": "8"}, max_stop_length=3)
    assert (settings.max_stop_strings, settings.max_stop_length) == (8, 3)
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    ChatCompletionRequest.of({**body, "stop": list("abcdefgh")}, settings)
    for stop in (list("abcdefghi"), ["abcd"]):
        with pytest.raises(ApiError) as refused:
            ChatCompletionRequest.of({**body, "stop": stop}, settings)
        assert refused.value.status == 400 and refused.value.param == "stop"
    assert ServerSettings().max_stop_strings == 4  # OpenAI's
