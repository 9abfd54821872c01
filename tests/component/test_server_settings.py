"""ServerSettings from RELAY_SERVER_* variables, and how the server sizes its upstream clients."""

from __future__ import annotations

import argparse
import warnings

import pytest
from pydantic import SecretStr, ValidationError

from relay_integrations.cli import main, serve
from relay_integrations.relay import EndpointConfig, RelayConfig
from relay_integrations.relay.config import RelayEnvironmentWarning
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
    with pytest.raises(ValueError, match="RELAY_SERVER_PORT"):
        ServerSettings.from_env({"RELAY_SERVER_PORT": "99999"})


def test_a_bad_value_is_an_error_naming_its_variable_and_the_fix() -> None:
    with pytest.raises(ValueError) as refused:
        ServerSettings.from_env({"RELAY_SERVER_PORT": "99999", "RELAY_SERVER_WORKERS": "0"})
    assert not isinstance(refused.value, ValidationError)  # not pydantic's field-only report
    assert str(refused.value) == (
        "invalid environment variables: "
        "RELAY_SERVER_PORT (the field port): Input should be less than or equal to 65535; "
        "RELAY_SERVER_WORKERS (the field workers): Input should be greater than or equal to 1"
    )


SECRET = "sk-live-0123456789"


@pytest.mark.parametrize(
    "name",
    [
        name
        for name, field in ServerSettings.model_fields.items()
        if field.annotation not in (str, list[str], list[SecretStr])  # take any text
    ],
)
def test_no_error_about_a_variable_shows_its_value(name: str) -> None:
    variable = f"RELAY_SERVER_{name.upper()}"
    with pytest.raises(ValueError) as refused:
        ServerSettings.from_env({variable: SECRET})
    message = str(refused.value)
    assert f"{variable} (the field {name}): " in message
    assert SECRET not in message


def test_a_bad_variable_is_refused_under_a_flag_too_and_a_flags_error_hides_its_value() -> None:
    with pytest.raises(ValueError, match="RELAY_SERVER_PORT"):
        ServerSettings.from_env({"RELAY_SERVER_PORT": "x"}, port=9000)  # as the relay's
    with pytest.raises(ValidationError) as refused:
        ServerSettings.from_env({}, log_format=SECRET)
    assert "log_format" in str(refused.value) and SECRET not in str(refused.value)


@pytest.mark.parametrize(
    ("variable", "meant"),
    [
        ("RELAY_SERVER_MAX_CONECTIONS", "RELAY_SERVER_MAX_CONNECTIONS"),
        ("RELAY_SERVER__SEND_TIMEOUT", "RELAY_SERVER_SEND_TIMEOUT"),
        ("RELAY_SERVER_API_KEY", "RELAY_SERVER_API_KEYS"),
        ("RELAY_SERVER_port", "RELAY_SERVER_PORT"),
    ],
)
def test_an_unknown_server_variable_is_warned_about_once_with_the_closest(
    variable: str, meant: str
) -> None:
    env = {variable: "5", "RELAY_LARGE__MODEL": "l", "RELAY_SMALL__MODEL": "s", "RELAY_CUES": "x"}
    with pytest.warns(RelayEnvironmentWarning) as warned:
        settings = ServerSettings.from_env(env)
        RelayConfig.env_values(environ=env)  # the relay's own reading leaves it to the server
    assert [str(w.message) for w in warned] == [
        f"{variable} is not a variable of relaygen serve's settings, and is ignored; "
        f"did you mean {meant}?"
    ]
    assert settings == ServerSettings()  # ignored, as the warning says


def test_an_unknown_server_variable_with_no_close_name_is_still_warned_about() -> None:
    with pytest.warns(RelayEnvironmentWarning, match="^RELAY_SERVER_COLOUR is not a variable"):
        ServerSettings.from_env({"RELAY_SERVER_COLOUR": "blue"})
    with warnings.catch_warnings():
        warnings.simplefilter("error", RelayEnvironmentWarning)
        ServerSettings.from_env({f"RELAY_SERVER_{n.upper()}": "1" for n in ("port", "workers")})


ENDPOINTS = ["--large-url", "http://a/v1", "--large-model", "l"]
ENDPOINTS += ["--small-url", "http://b/v1", "--small-model", "s", "--cues", '["Now"]']


def test_relaygen_serve_stops_on_a_bad_variable_and_warns_of_a_typo_in_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RELAY_SERVER_MAX_CONECTIONS", "4096")
    monkeypatch.setenv("RELAY_SERVER_SEND_TIMEOUT", SECRET)
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        assert main(["serve", *ENDPOINTS]) == 2  # before it listens
    assert capsys.readouterr().err.splitlines() == [
        "relaygen: RELAY_SERVER_MAX_CONECTIONS is not a variable of relaygen serve's settings, "
        "and is ignored; did you mean RELAY_SERVER_MAX_CONNECTIONS?",
        "relaygen serve: configuration error: invalid environment variables: "
        "RELAY_SERVER_SEND_TIMEOUT (the field send_timeout): Input should be a valid number, "
        "unable to parse string as a number",
    ]


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


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("localhost:4318", "base URL"),
        ("grpc://collector:4317", "base URL"),
        ("http://", "base URL"),
        (f"https://user:{SECRET}@collector:4318", "OTEL_EXPORTER_OTLP_HEADERS"),
    ],
)
def test_a_collector_url_that_cannot_be_used_is_refused_with_the_fix(value: str, said: str) -> None:
    with pytest.raises(ValueError) as refused:
        ServerSettings.from_env({"RELAY_SERVER_OTLP_ENDPOINT": value})
    assert said in str(refused.value) and SECRET not in str(refused.value)
    assert ServerSettings(otlp_endpoint="http://localhost:4318").otlp_endpoint
