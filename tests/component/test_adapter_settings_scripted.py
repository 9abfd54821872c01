"""One truth for an adapter's settings: however a model is made or changed (the constructor,
``model_copy(update=...)``, attribute assignment, ``configurable_fields``), its requests carry
the values the object shows; a change the relay cannot honour is refused and changes nothing.
Copies of a model use the connections already open to the same endpoints."""

from __future__ import annotations

import asyncio
import copy
import gc
import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from langchain_core.runnables import ConfigurableField
from llama_index.core.base.llms.types import ChatMessage
from pydantic import ValidationError

from relay_integrations.chat.settings import RelaySettings
from relay_integrations.langchain import RelayChatModel
from relay_integrations.llama_index import RelayLLM
from relay_integrations.relay import CueArtifactError, ModelRole, SwitchPolicy
from relay_integrations.relay.config import Phase, RequestHook
from relay_integrations.testing.scripted_vllm import ScriptedVLLM, serving
from tests.fakes.capable_model import capable_server, relay_fields
from tests.fakes.descriptors import open_sockets

QUESTION = "What is 2 + 2?"
ADAPTERS = [RelayChatModel, RelayLLM]

SAMPLING_CHANGES: dict[str, tuple[Any, Any]] = {
    # field: (the model's value, the changed value)
    "temperature": (0.3, 0.2),
    "top_p": (0.9, 0.8),
    "top_k": (20, 7),
    "min_p": (0.01, 0.05),
    "presence_penalty": (0.5, 1.5),
    "frequency_penalty": (0.1, 0.4),
    "repetition_penalty": (1.05, 1.2),
    "seed": (1, 2),
}


@pytest.fixture(scope="module")
def other() -> Iterator[ScriptedVLLM]:
    """A second upstream, for the changes that move a model to another server."""
    with serving(capable_server()) as running:
        yield running


def use(model: RelaySettings) -> str:
    if isinstance(model, RelayChatModel):
        return str(model.invoke(QUESTION).text)
    assert isinstance(model, RelayLLM)
    return str(model.chat([ChatMessage(role="user", content=QUESTION)]).message.content)


def sent(server: ScriptedVLLM, use_: Callable[[], str]) -> list[dict[str, Any]]:
    """The bodies `server`'s two models received while `use_` ran."""
    for model in server.models.values():
        model.requests.clear()
        model.headers.clear()
    assert use_() == "The answer is 4."
    return server.models["large"].requests + server.models["small"].requests


def first_request_budget(max_tokens: int) -> int:
    """The large model's first request's max_tokens: the budget less the answer's reserve
    (a quarter of it below 4,096 tokens)."""
    return max_tokens - max_tokens // 4


def built(adapter: type[RelaySettings], server: ScriptedVLLM, **fields: Any) -> RelaySettings:
    values = {name: old for name, (old, _) in SAMPLING_CHANGES.items()}
    return adapter(**relay_fields(server.base_url, max_tokens=400, **values, **fields))


@pytest.mark.parametrize("adapter", ADAPTERS)
@pytest.mark.parametrize("how", ["model_copy", "assignment"])
def test_every_sampling_field_changed_reaches_the_upstream(
    server: ScriptedVLLM, adapter: type[RelaySettings], how: str
) -> None:
    model = built(adapter, server)
    changes: dict[str, Any] = {name: new for name, (_, new) in SAMPLING_CHANGES.items()}
    changes["max_tokens"] = 200
    if how == "model_copy":
        changed = model.model_copy(update=changes)
    else:
        changed = model
        for name, value in changes.items():
            setattr(changed, name, value)
    for name, value in changes.items():
        assert getattr(changed, name) == value  # what the object shows ...
    bodies = sent(server, lambda: use(changed))
    for name, (_, new) in SAMPLING_CHANGES.items():  # ... is what every request carries
        assert all(body[name] == new for body in bodies), (name, [b[name] for b in bodies])
    assert bodies[0]["max_tokens"] == first_request_budget(200)
    assert changed.relay_config().sampling.temperature == 0.2
    if how == "model_copy":  # the original keeps its own values
        original = sent(server, lambda: use(model))
        assert all(body["temperature"] == 0.3 for body in original)
        assert original[0]["max_tokens"] == first_request_budget(400)


def salted(salt: str) -> RequestHook:
    def hook(role: ModelRole, phase: Phase, transcript: str) -> dict[str, Any]:
        return {"cache_salt": salt}

    return hook


@pytest.mark.parametrize("adapter", ADAPTERS)
@pytest.mark.parametrize("how", ["model_copy", "assignment"])
def test_a_request_hook_changed_reaches_every_request(
    server: ScriptedVLLM, adapter: type[RelaySettings], how: str
) -> None:
    """The hook is part of the relay a model is built on: a changed one builds another."""
    model = built(adapter, server, request_hook=salted("a"))
    assert {body["cache_salt"] for body in sent(server, lambda: use(model))} == {"a"}
    if how == "model_copy":
        changed = model.model_copy(update={"request_hook": salted("b")})
    else:
        changed = model
        changed.request_hook = salted("b")
    assert {body["cache_salt"] for body in sent(server, lambda: use(changed))} == {"b"}
    if how == "model_copy":  # the original keeps its own
        assert {body["cache_salt"] for body in sent(server, lambda: use(model))} == {"a"}


@pytest.mark.parametrize("adapter", ADAPTERS)
@pytest.mark.parametrize("field", ["large_url", "small_url"])
@pytest.mark.parametrize("how", ["model_copy", "assignment"])
def test_a_url_changed_sends_that_model_s_requests_to_the_new_server(
    server: ScriptedVLLM,
    other: ScriptedVLLM,
    adapter: type[RelaySettings],
    field: str,
    how: str,
) -> None:
    model = built(adapter, server)
    if how == "model_copy":
        changed = model.model_copy(update={field: other.base_url})
    else:
        changed = model
        setattr(changed, field, other.base_url)
    role = field.removesuffix("_url")
    moved, stayed = other.models[role], server.models["small" if role == "large" else "large"]
    for upstream in (server, other):
        for scripted in upstream.models.values():
            scripted.requests.clear()
    assert use(changed) == "The answer is 4."
    assert moved.requests, f"no {role} request reached the new server"
    assert stayed.requests, "the other model left its server"
    assert not server.models[role].requests
    assert not other.models["small" if role == "large" else "large"].requests


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_model_copy_renames_aliases_as_the_constructor_does(
    server: ScriptedVLLM, adapter: type[RelaySettings]
) -> None:
    alias = {RelayChatModel: "model_kwargs", RelayLLM: "additional_kwargs"}[adapter]
    changed = built(adapter, server).model_copy(update={alias: {"ignore_eos": False}})
    assert changed.extra_body == {"ignore_eos": False}
    assert all(body["ignore_eos"] is False for body in sent(server, lambda: use(changed)))


def test_configurable_fields_and_bind_carry_their_values(server: ScriptedVLLM) -> None:
    model = RelayChatModel(**relay_fields(server.base_url, temperature=0.3))
    configurable = model.configurable_fields(temperature=ConfigurableField(id="temperature"))
    config: Any = {"configurable": {"temperature": 0.05}}
    bodies = sent(server, lambda: str(configurable.invoke(QUESTION, config=config).text))
    assert all(body["temperature"] == 0.05 for body in bodies)
    bound = model.bind(temperature=0.15)
    assert all(
        b["temperature"] == 0.15 for b in sent(server, lambda: str(bound.invoke(QUESTION).text))
    )


REFUSED: list[tuple[dict[str, Any], type[Exception], str]] = [
    ({"temperature": 5}, ValidationError, "less than or equal to 2"),
    ({"max_tokens": 0}, ValidationError, "greater than or equal to 1"),
    ({"temprature": 0.1}, ValueError, "did you mean 'temperature'"),
    ({"cues": "missing-artifact.json"}, CueArtifactError, "file not found"),
    ({"large_url": "127.0.0.1:8000/v1"}, ValueError, "has no scheme"),
    (
        {"policy": SwitchPolicy(warm_small_prompt=True)},
        ValueError,
        "needs the small model on a server of its own",
    ),
]


@pytest.mark.parametrize("adapter", ADAPTERS)
@pytest.mark.parametrize(("change", "error", "message"), REFUSED)
@pytest.mark.parametrize("how", ["model_copy", "assignment"])
def test_a_change_the_relay_cannot_honour_is_refused_and_changes_nothing(
    server: ScriptedVLLM,
    adapter: type[RelaySettings],
    change: dict[str, Any],
    error: type[Exception],
    message: str,
    how: str,
) -> None:
    model = built(adapter, server)
    before = (model.model_dump(), set(model.model_fields_set))
    with pytest.raises(error, match=message):
        if how == "model_copy":
            model.model_copy(update=change)
        else:
            [(name, value)] = change.items()
            setattr(model, name, value)
    assert (model.model_dump(), set(model.model_fields_set)) == before
    assert all(body["temperature"] == 0.3 for body in sent(server, lambda: use(model)))


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_a_dict_field_edited_in_place_reaches_the_next_request(
    server: ScriptedVLLM, adapter: type[RelaySettings]
) -> None:
    model = built(adapter, server, default_headers={"x-team": "a"})
    use(model)
    model.default_headers["x-team"] = "b"
    sent(server, lambda: use(model))
    headers = server.models["large"].headers + server.models["small"].headers
    assert headers and all(h["x-team"] == "b" for h in headers)


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_copies_use_the_connections_already_open(
    server: ScriptedVLLM, adapter: type[RelaySettings]
) -> None:
    model = built(adapter, server)
    use(model)  # connections to both models, kept alive
    before = open_sockets()
    copies = []
    for step in range(20):
        changed = model.model_copy(update={"temperature": step / 20})
        assert use(changed) == "The answer is 4."
        copies.append(changed)  # kept alive: nothing is closed behind the count
    copies.append(copy.deepcopy(model))
    use(copies[-1])
    assert open_sockets() <= before


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_closing_a_copy_leaves_the_shared_connections_to_the_others(
    server: ScriptedVLLM, adapter: type[RelaySettings]
) -> None:
    model = built(adapter, server)
    use(model)
    changed = model.model_copy(update={"temperature": 0.1})
    use(changed)
    changed.close()
    assert use(model) == "The answer is 4."  # on the connections still open
    assert use(changed) == "The answer is 4."  # a closed model opens new ones when used


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_a_deep_copy_of_a_used_model_works_and_prints_nothing(
    server: ScriptedVLLM, adapter: type[RelaySettings], capfd: pytest.CaptureFixture[str]
) -> None:
    model = built(adapter, server)
    use(model)
    copied = copy.deepcopy(model)
    assert use(copied) == "The answer is 4."
    del copied
    gc.collect()
    captured = capfd.readouterr()
    assert "Exception ignored" not in captured.err + captured.out


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_another_pair_s_cues_fail_each_call_with_the_reason_and_print_nothing(
    server: ScriptedVLLM,
    adapter: type[RelaySettings],
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    cues = "builtin:r1-distill-qwen-32b--r1-distill-qwen-1.5b"
    model = adapter(**relay_fields(server.base_url, cues=cues))

    async def on_a_new_loop(model: RelaySettings) -> str:
        if isinstance(model, RelayChatModel):
            return str((await model.ainvoke(QUESTION)).text)
        assert isinstance(model, RelayLLM)
        reply = await model.achat([ChatMessage(role="user", content=QUESTION)])
        return str(reply.message.content)

    for _ in range(3):
        with pytest.raises(CueArtifactError, match="calibrated for large model"):
            use(model)
        with pytest.raises(CueArtifactError, match="allow_model_mismatch=True"):
            asyncio.run(on_a_new_loop(model))
    del model
    gc.collect()
    captured = capfd.readouterr()
    assert captured.err == "" and captured.out == ""
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
