"""The adapters' flat settings: the environment read once per model, the core's fields as
declared in the core (default, bounds, description)."""

from __future__ import annotations

import json
import re
import typing
import warnings
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from relay_integrations.chat.settings import RelaySettings
from relay_integrations.langchain import RelayChatModel
from relay_integrations.llama_index import RelayLLM
from relay_integrations.relay import EndpointConfig, SamplingConfig
from relay_integrations.relay.config import RelayConfig, RelayEnvironment, RelayEnvironmentWarning

ADAPTERS = [RelayChatModel, RelayLLM]
FIELDS = {"large_model": "large", "small_model": "small", "cues": ["Therefore,"]}


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_building_a_model_reads_the_environment_once(
    adapter: type[RelaySettings], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RELAY_LARGE__BASE_URL", "http://gpu-a:8000/v1")
    monkeypatch.setenv("RELAY_SMALL__BASE_URL", "http://gpu-b:8000/v1")
    monkeypatch.setenv("RELAY_API_KEY", "shared")
    reads: list[RelayEnvironment] = []
    read = RelayEnvironment.read

    def counted(*args: object, **kwargs: object) -> RelayEnvironment:
        reads.append(read(*args, **kwargs))  # type: ignore[arg-type]
        return reads[-1]

    monkeypatch.setattr(RelayEnvironment, "read", counted)
    model = adapter(**FIELDS)
    assert len(reads) == 1
    assert model.large_url == "http://gpu-a:8000/v1"  # the fields read true
    assert model.api_key is not None and model.api_key.get_secret_value() == "shared"
    config = model.relay_config()
    assert config.small.base_url == "http://gpu-b:8000/v1"
    assert config.large.api_key is not None
    assert config.large.api_key.get_secret_value() == "shared"


@pytest.mark.parametrize(
    ("flat", "core", "name"),
    [
        ("connect_timeout", EndpointConfig, "connect_timeout"),
        ("max_retries", EndpointConfig, "max_retries"),
        ("max_concurrency", EndpointConfig, "max_concurrency"),
        ("timeout", EndpointConfig, "read_timeout"),
        ("max_tokens", SamplingConfig, "max_tokens"),
    ],
)
def test_a_flat_field_is_the_cores_field(flat: str, core: type[object], name: str) -> None:
    ours, theirs = RelaySettings.model_fields[flat], core.model_fields[name]  # type: ignore[attr-defined]
    assert ours.description == theirs.description and ours.metadata == theirs.metadata
    if flat != "timeout":  # None: each endpoint's own read_timeout
        assert ours.default == theirs.default
    lowest = {"max_retries": -1, "max_concurrency": 0, "max_tokens": 0}.get(flat, 0)
    with pytest.raises(ValidationError, match=flat):
        RelayChatModel(**FIELDS, large_url="http://a/v1", small_url="http://b/v1", **{flat: lowest})


# --- every RELAY_* variable: an error names it; an unknown one meant for us is warned about ---

BASE_ENV = {
    "RELAY_LARGE__BASE_URL": "http://gpu-a:8000/v1",
    "RELAY_LARGE__MODEL": "large",
    "RELAY_SMALL__BASE_URL": "http://gpu-b:8000/v1",
    "RELAY_SMALL__MODEL": "small",
    "RELAY_CUES": '["Therefore,"]',
}


def _variables(model: type[BaseModel], prefix: str = "RELAY_") -> list[str]:
    """Every variable the environment can set: each field of the configuration, at every
    level (a whole object as JSON too: RELAY_LARGE, RELAY_LARGE__SAMPLING)."""
    found = []
    for name, field in model.model_fields.items():
        variable = prefix + name.upper()
        found.append(variable)
        for kind in (field.annotation, *typing.get_args(field.annotation)):
            if isinstance(kind, type) and issubclass(kind, BaseModel):
                found += _variables(kind, variable + "__")
    return found


VARIABLES = _variables(RelayConfig)
BAD_VALUES = ["maybe", "-1", '{"a": [1]}', '["a", 1]', "{x-tenant: acme}", "[1, 2"]
"""Raw values, each wrong for many fields; every field refuses at least one of them."""


def _named(variable: str, message: str) -> bool:
    """`message` names `variable` itself (RELAY_LARGE is not named by RELAY_LARGE__MODEL)."""
    return re.search(re.escape(variable) + r"(?![A-Z_])", message) is not None


def _outcome(environ: dict[str, str]) -> str | None:
    """None when the environment makes a configuration, else the error's message."""
    try:
        RelayConfig.from_env(environ=environ)
    except ValueError as error:
        return str(error)
    return None


def test_every_field_of_the_configuration_is_a_variable() -> None:
    assert {"RELAY_LARGE__EXTRA_HEADERS", "RELAY_SMALL__SAMPLING__TOP_P"} <= set(VARIABLES)
    assert {"RELAY_POLICY__MAX_SMALL_TOKENS", "RELAY_MARKERS__END", "RELAY_SESSION_HEADER"} <= set(
        VARIABLES
    )
    assert len(VARIABLES) > 50


@pytest.mark.parametrize("variable", VARIABLES)
def test_a_bad_value_of_any_variable_is_an_error_that_names_it(variable: str) -> None:
    refused = 0
    for raw in BAD_VALUES:
        message = _outcome({**BASE_ENV, variable: raw})
        if message is not None:
            refused += 1
            assert _named(variable, message), (raw, message)
    assert refused, f"no bad value for {variable}"


@settings(max_examples=25, deadline=None, derandomize=True, database=None)
@given(
    variable=st.sampled_from(VARIABLES),
    raw=st.text(max_size=12)
    | st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
        max_leaves=5,
    ).map(json.dumps),
)
def test_any_value_of_any_variable_configures_or_is_refused_by_name(
    variable: str, raw: str
) -> None:
    message = _outcome({**BASE_ENV, variable: raw})
    assert message is None or _named(variable, message), message


def test_a_dict_that_is_not_json_names_the_variable_and_shows_json() -> None:
    message = _outcome({**BASE_ENV, "RELAY_LARGE__EXTRA_HEADERS": "{x-tenant: acme}"})
    assert message is not None
    assert "RELAY_LARGE__EXTRA_HEADERS: not JSON" in message
    assert """'{"x-tenant": "acme"}'""" in message


def test_a_misspelt_nested_field_is_an_error_with_the_close_match() -> None:
    message = _outcome({**BASE_ENV, "RELAY_LARGE__BASE_UR": "http://x/v1"})
    assert message is not None
    assert (
        "RELAY_LARGE__BASE_UR: large has no field 'base_ur'; did you mean RELAY_LARGE__BASE_URL?"
        in message
    )


def test_an_errors_message_never_shows_the_value() -> None:
    message = _outcome({**BASE_ENV, "RELAY_SMALL__API_KEY": "sk-secret\n"})
    assert message is not None and "RELAY_SMALL__API_KEY" in message
    assert "sk-secret" not in message


@pytest.mark.parametrize("adapter", ADAPTERS)
@pytest.mark.parametrize("variable", VARIABLES)
def test_the_adapters_name_the_bad_variable_too(
    adapter: type[RelaySettings], variable: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    bad = next(raw for raw in BAD_VALUES if _outcome({**BASE_ENV, variable: raw}) is not None)
    for name, value in {**BASE_ENV, variable: bad}.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError) as refused:
        adapter.from_env()
    assert _named(variable, str(refused.value)), str(refused.value)


@pytest.mark.parametrize(
    ("variable", "suggested"),
    [
        ("RELAY_TEMPERATURE", "RELAY_SAMPLING__TEMPERATURE"),
        ("RELAY_TEMPRATURE", "RELAY_SAMPLING__TEMPERATURE"),
        ("RELAY_MAX_TOKENS", "RELAY_SAMPLING__MAX_TOKENS"),
        ("RELAY_BASE_URL", "RELAY_LARGE__BASE_URL or RELAY_SMALL__BASE_URL"),
        ("RELAY_CUE", "RELAY_CUES"),
        ("RELAY_SAMPLNG__TOP_P", "RELAY_SAMPLING__TOP_P"),
        ("RELAY_ANSWER_MODEL", "RELAY_POLICY__ANSWER_MODEL"),
    ],
)
def test_an_unknown_variable_meant_for_the_relay_is_warned_about_with_the_close_match(
    variable: str, suggested: str
) -> None:
    with pytest.warns(RelayEnvironmentWarning) as warned:
        config = RelayConfig.from_env(environ={**BASE_ENV, variable: "0.2"})
    (warning,) = warned
    assert str(warning.message).startswith(f"{variable} is not a variable of the relay's ")
    assert f"did you mean {suggested}" in str(warning.message)
    assert config.sampling.temperature == 0.6  # ignored, as the warning says


_READ = [
    re.compile(r"""(?:environ(?:\.get)?\s*[(\[]|getenv\()\s*["'](RELAY_[A-Z0-9_]*[A-Z0-9])"""),
    re.compile(r"\$\{?(RELAY_[A-Z0-9_]*[A-Z0-9])"),  # the shell's $RELAY_X, ${RELAY_X:-...}
    re.compile(r"^\s*(?:export\s+|local\s+)?(RELAY_[A-Z0-9_]*[A-Z0-9])=", re.M),
]


def _foreign_variables() -> list[str]:
    """The RELAY_* variables the project uses for itself: every one its scripts and benchmarks
    name, and those its tests read or export (a test may name a misspelt one on purpose)."""
    root = Path(__file__).parents[2]
    names: set[str] = set()
    for folder in ("scripts", "benchmarks", ".ci", "tests"):
        for path in (root / folder).rglob("*"):
            if path.suffix not in ("", ".py", ".sh") or not path.is_file():
                continue
            text = path.read_text(errors="replace")
            if folder == "tests":
                names.update(name for pattern in _READ for name in pattern.findall(text))
            else:
                names.update(re.findall(r"\bRELAY_[A-Z0-9_]*[A-Z0-9]", text))
    config = {field.upper() for field in RelayConfig.model_fields}
    return sorted(n for n in names if n[len("RELAY_") :].split("__")[0] not in config)


FOREIGN = _foreign_variables()


def test_the_projects_own_variables_are_found() -> None:
    own = {"RELAY_TEST_QWEN_LARGE_URL", "RELAY_REQUIRE_VLLM", "RELAY_VLLM_VENV", "RELAY_FUZZ_SCALE"}
    assert own <= set(FOREIGN)
    assert "RELAY_SERVER_API_KEYS" in FOREIGN and "RELAY_API_KEY" in FOREIGN


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_other_programs_variables_are_not_warned_about_at_model_creation(
    adapter: type[RelaySettings], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in {**BASE_ENV, **dict.fromkeys(FOREIGN, "1")}.items():
        monkeypatch.setenv(name, value)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RelayEnvironmentWarning)
        adapter.from_env()
        RelayConfig.from_env()


def test_a_name_like_no_variable_is_left_to_the_program_that_reads_it() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", RelayEnvironmentWarning)
        RelayConfig.from_env(environ={**BASE_ENV, "RELAY_FOO": "1", "RELAY_SERVER_PORT": "1"})
    with pytest.warns(RelayEnvironmentWarning, match="^RELAY_FOO__BAR is not a variable"):
        RelayConfig.from_env(environ={**BASE_ENV, "RELAY_FOO__BAR": "1"})  # nested: ours
