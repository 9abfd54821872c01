"""The fields the relay sets on every request are the ones ``extra_body`` may not set."""

from __future__ import annotations

import pytest

from relay_integrations.upstream.config import EndpointConfig
from relay_integrations.upstream.endpoint import CompletionRequest, Endpoint
from relay_integrations.upstream.reserved_fields import RESERVED_BODY_FIELDS, check_extra_body


def test_every_field_the_relay_sets_is_refused_in_extra_body() -> None:
    endpoint = Endpoint(EndpointConfig(base_url="http://127.0.0.1:9/v1", model="m"), "large")
    body = endpoint.completion_body(CompletionRequest(prompt="p", max_tokens=5, stop=("x",)))
    assert set(body) == {
        "model",
        "prompt",
        "max_tokens",
        "stream",
        "stop",
        "include_stop_str_in_output",
        "add_special_tokens",
        "stream_options",
    }
    assert set(body) <= set(RESERVED_BODY_FIELDS)
    for name in body:
        with pytest.raises(ValueError, match=f"extra_body may not set {name}"):
            check_extra_body({name: body[name]}, "extra_body", sampling=())


def test_the_requests_own_fields_and_sampling_go_on_top_of_the_endpoints() -> None:
    config = EndpointConfig(
        base_url="http://127.0.0.1:9/v1", model="m", extra_body={"cache_salt": "a", "x": 1}
    )
    endpoint = Endpoint(config, "small")
    request = CompletionRequest(
        prompt="p", max_tokens=5, sampling={"temperature": 0.5}, extra_body={"x": 2}
    )
    body = endpoint.completion_body(request)
    assert (body["cache_salt"], body["x"], body["temperature"]) == ("a", 2, 0.5)
    assert "stop" not in body  # no stop strings: no field
