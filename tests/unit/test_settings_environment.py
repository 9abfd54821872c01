"""The adapters' flat settings: the environment read once per model, the core's fields as
declared in the core (default, bounds, description)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from relay_integrations.chat.settings import RelaySettings
from relay_integrations.langchain import RelayChatModel
from relay_integrations.llama_index import RelayLLM
from relay_integrations.relay import EndpointConfig, SamplingConfig
from relay_integrations.relay.config import RelayEnvironment

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
