"""The relaygen commands' options: every SamplingConfig field, checked by it; --cues."""

from __future__ import annotations

import argparse
import warnings

import pytest
from pydantic import BaseModel, ValidationError

from relay_integrations.cli import command_line, main
from relay_integrations.cli.options import add_relay_options, relay_config
from relay_integrations.relay.config import RelayConfig, SwitchPolicy
from relay_integrations.server import ServerSettings
from relay_integrations.upstream.config import SamplingConfig

ENDPOINTS = ["--large-url", "http://a/v1", "--large-model", "l"]
ENDPOINTS += ["--small-url", "http://b/v1", "--small-model", "s"]


def parse(*options: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_relay_options(parser)
    return parser.parse_args([*ENDPOINTS, *options])


def test_every_sampling_field_is_an_option(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RELAY_SAMPLING__TOP_P", "0.8")
    args = parse(
        *("--presence-penalty", "1.5", "--frequency-penalty", "-0.5"),
        *("--repetition-penalty", "1.1", "--min-p", "0.05", "--top-k", "40"),
        *("--temperature", "0.7", "--seed", "3", "--max-tokens", "512"),
    )
    sampling = relay_config(args).sampling
    assert (sampling.presence_penalty, sampling.frequency_penalty) == (1.5, -0.5)
    assert (sampling.repetition_penalty, sampling.min_p, sampling.top_k) == (1.1, 0.05, 40)
    assert (sampling.temperature, sampling.seed, sampling.max_tokens) == (0.7, 3, 512)
    assert sampling.top_p == 0.8  # from the environment, not overridden


def test_a_value_out_of_vllms_range_is_refused_naming_the_field() -> None:
    with pytest.raises(ValidationError, match="presence_penalty"):
        relay_config(parse("--presence-penalty", "5"))


@pytest.mark.parametrize("command", ["generate", "serve"])
def test_a_malformed_cue_list_is_a_configuration_error_naming_the_fix(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([command, *ENDPOINTS, "--cues", '["Now"']) == 2  # before any request
    error = capsys.readouterr().err
    assert "configuration error: --cues '[\"Now\"' is not a JSON list" in error
    assert "an artifact path or builtin:NAME" in error and "Traceback" not in error


@pytest.mark.parametrize(
    ("command", "options", "prefix"),
    [
        ("generate", [], "relaygen"),
        ("check", [], "relaygen"),
        ("serve", [], "relaygen serve"),
        ("bench", ["--problems", "missing.jsonl", "--out", "unused"], "relaygen"),
        ("calibrate", ["--traces", "missing.jsonl", "--out", "unused"], "relaygen"),
    ],
)
def test_every_command_ends_a_missing_endpoint_with_exit_code_2_and_the_fix(
    command: str,
    options: list[str],
    prefix: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("RELAY_LARGE__BASE_URL", "RELAY_SMALL__BASE_URL", "RELAY_SMALL__MODEL"):
        monkeypatch.delenv(name, raising=False)
    assert main([command, *options]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"{prefix}: configuration error: no ")
    assert "pass --" in error and "Traceback" not in error


def test_the_small_models_cap_is_an_option_over_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RELAY_POLICY__COOLDOWN_TOKENS", "3")
    policy = relay_config(parse("--max-small-tokens", "40")).policy
    assert (policy.max_small_tokens, policy.cooldown_tokens) == (40, 3)
    with pytest.raises(ValidationError, match="max_small_tokens"):
        relay_config(parse("--max-small-tokens", "0"))


def test_check_refuses_the_small_models_cap_it_would_not_use(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["check", *ENDPOINTS, "--max-small-tokens", "40"])
    assert exit_.value.code == 2
    assert "unrecognized arguments: --max-small-tokens 40" in capsys.readouterr().err


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    (commands,) = [a for a in command_line()._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(commands.choices)


SUBCOMMANDS = _subcommands()
OPTIONS = [
    pytest.param(command, action, id=f"{command} {'/'.join(action.option_strings) or action.dest}")
    for command, parser in SUBCOMMANDS.items()
    for action in parser._actions
    if not isinstance(action, argparse._HelpAction)
]
_FLAGS = (argparse._StoreTrueAction, argparse._StoreFalseAction, argparse._StoreConstAction)
_CONFIGURED_BY: list[tuple[type[BaseModel], set[str]]] = [
    (SamplingConfig, set(SamplingConfig.model_fields)),
    (SwitchPolicy, {"max_small_tokens"}),
    (RelayConfig, {"cues"}),
]
"""Options that are None on the command line because the configuration (or RELAY_*) holds
their default."""


def _default(command: str, action: argparse.Action) -> object:
    """What applies when the option is not given: argparse's default, or the default of the
    configuration field the option fills."""
    if action.default is not None or isinstance(action, _FLAGS):
        return None if isinstance(action, _FLAGS) else action.default
    served: list[tuple[type[BaseModel], set[str]]] = [
        (ServerSettings, set(ServerSettings.model_fields))
    ]
    for model, names in _CONFIGURED_BY + (served if command == "serve" else []):
        if action.dest in names:
            return model.model_fields[action.dest].get_default(call_default_factory=True)
    return None


def test_the_commands_are_all_checked() -> None:
    assert set(SUBCOMMANDS) == {"generate", "calibrate", "serve", "bench", "check"}


@pytest.mark.parametrize(("command", "action"), OPTIONS)
def test_every_option_has_help_that_states_its_default(
    command: str, action: argparse.Action
) -> None:
    parser = SUBCOMMANDS[command]
    assert action.help and action.help != argparse.SUPPRESS, "no help text"
    shown = parser._get_formatter()._expand_help(action)  # %(default)s filled, as --help does
    default = _default(command, action)
    if default is None or default == []:  # nothing to state: None, a flag, an empty list
        return
    said = {str(default), format(default, "g") if isinstance(default, float) else str(default)}
    assert any(f"default: {text}" in shown for text in said), shown


def test_an_unknown_variable_is_warned_about_in_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RELAY_TEMPERATURE", "0.2")
    monkeypatch.delenv("RELAY_SMALL__MODEL", raising=False)
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        assert main(["check", "--large-url", "http://a/v1", "--large-model", "l"]) == 2
    first, *_ = capsys.readouterr().err.splitlines()
    assert first == (
        "relaygen: RELAY_TEMPERATURE is not a variable of the relay's configuration, and is "
        "ignored; did you mean RELAY_SAMPLING__TEMPERATURE?"
    )
