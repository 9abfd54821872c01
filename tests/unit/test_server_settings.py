"""ServerSettings from RELAY_SERVER_* variables, and how the server sizes its upstream clients."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from relay_integrations.core import EndpointConfig, RelayConfig
from relay_integrations.server import RelayServer, ServerSettings


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
