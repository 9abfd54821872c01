"""Configuration from Python and from environment variables."""

import pytest

from relay_integrations.relay import RelayConfig


def test_from_env_reads_nested_fields_and_ignores_foreign_variables() -> None:
    env = {
        "RELAY_LARGE__BASE_URL": "http://a:8000/v1",
        "RELAY_LARGE__MODEL": "big",
        "RELAY_LARGE__EXTRA_HEADERS": '{"x-team": "math"}',
        "RELAY_SMALL__BASE_URL": "http://b:8000/v1",
        "RELAY_SMALL__MODEL": "tiny",
        "RELAY_SMALL__API_KEY": "secret",
        "RELAY_SAMPLING__MAX_TOKENS": "4096",
        "RELAY_POLICY__ANSWER_MODEL": "large",
        "RELAY_CUES": '["Now", "So "]',
        "RELAY_VLLM_VENV": "/somewhere",  # another tool's variable
        "OTHER": "x",
    }
    config = RelayConfig.from_env(environ=env)
    assert config.large.model == "big" and config.large.extra_headers == {"x-team": "math"}
    assert config.small.api_key is not None and config.small.api_key.get_secret_value() == "secret"
    assert "secret" not in repr(config)
    assert config.sampling.max_tokens == 4096 and config.sampling.temperature == 0.6
    assert config.policy.answer_model == "large"
    assert config.cues == ["Now", "So "]
    assert config.large.server_root == "http://a:8000"


def test_bad_values_say_which_field() -> None:
    env = {
        "RELAY_LARGE__BASE_URL": "u",
        "RELAY_LARGE__MODEL": "m",
        "RELAY_SMALL__BASE_URL": "u",
        "RELAY_SMALL__MODEL": "m",
        "RELAY_POLICY__MAX_SMALL_TOKENS": "0",
    }
    with pytest.raises(ValueError, match=r"RELAY_POLICY__MAX_SMALL_TOKENS \(the field policy\.max"):
        RelayConfig.from_env(environ=env)
