"""No secret ever shows: an API key, a header or a proxy's password, given in any of the ways a
user can give one, never appears in what a model prints, dumps or hands to tracers, in an
error, a log record or captured output, nor in what ``relaygen serve`` answers or logs.

The secret is the canary of :mod:`tests.fakes.canary`; every test of the tier also carries
it in its environment and has its logs and output scanned for it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import BaseMessage
from llama_index.core.base.llms.types import ChatMessage
from llama_index.core.callbacks import CallbackManager, LlamaDebugHandler
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.instrumentation.events import BaseEvent
from llama_index_instrumentation import get_dispatcher
from pydantic import Field

from relay_integrations.chat.settings import RelaySettings
from relay_integrations.langchain import RelayChatModel
from relay_integrations.llama_index import RelayLLM
from relay_integrations.relay import EndpointConfig, RelayConfig
from relay_integrations.relay.config import RelayEnvironment
from relay_integrations.server import ServerSettings
from relay_integrations.testing.scripted_vllm import ScriptedVLLM, serving
from tests.component.test_http import serving as raw_server
from tests.fakes.canary import (
    ANSWERED,
    CANARY,
    CANARY_HEADER,
    CanaryScreen,
    scan,
    without_canary,
)
from tests.fakes.capable_model import capable_server, relay_fields
from tests.fakes.ports import free_port, refusing_port
from tests.fakes.relay_env import relay_server_env, relaygen_serve

QUESTION = "What is 7 * 6?"
ADAPTERS = [RelayChatModel, RelayLLM]
DEAD_PROXY = f"http://relay:{CANARY}@127.0.0.1:1"
"""A proxy with the canary as its password, where nothing listens (port 1)."""

SECRET_PATHS: dict[str, tuple[dict[str, Any], dict[str, str]]] = {
    # how the secret is given: (fields, environment variables)
    "api_key": ({"api_key": CANARY}, {}),
    "large api_key": ({"large": {"api_key": CANARY}}, {}),
    "small api_key": ({"small": {"api_key": CANARY, "read_timeout": 30}}, {}),
    "RELAY_API_KEY": ({}, {"RELAY_API_KEY": CANARY}),
    "RELAY_LARGE__API_KEY": ({}, {"RELAY_LARGE__API_KEY": CANARY}),
    "default_headers": ({"default_headers": {"Authorization": f"Bearer {CANARY}"}}, {}),
    "large extra_headers": ({"large": {"extra_headers": {"X-Api-Key": CANARY}}}, {}),
    "RELAY_SMALL__EXTRA_HEADERS": ({}, {"RELAY_SMALL__EXTRA_HEADERS": json.dumps({"k": CANARY})}),
    "proxy": ({"proxy": DEAD_PROXY}, {}),
    "small proxy": ({"small": {"proxy": DEAD_PROXY}}, {}),
    "RELAY_LARGE__PROXY": ({}, {"RELAY_LARGE__PROXY": DEAD_PROXY}),
}
REACHES_THE_UPSTREAM = {name for name in SECRET_PATHS if "proxy" not in name.lower()}


def secret_model(
    adapter: type[RelaySettings],
    path: str,
    monkeypatch: pytest.MonkeyPatch,
    url: str = "http://127.0.0.1:8000/v1",
    **more: Any,
) -> RelaySettings:
    """A model given the canary in the way `path` names, and in no other."""
    fields, variables = SECRET_PATHS[path]
    without_canary(monkeypatch)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    return adapter(**relay_fields(url, max_retries=0, **fields), **more)


# --- what a model shows ---------------------------------------------------------------------


@pytest.mark.parametrize("path", SECRET_PATHS)
@pytest.mark.parametrize("adapter", ADAPTERS)
def test_no_rendering_of_a_model_shows_its_secret(
    adapter: type[RelaySettings], path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """repr, str, LangChain's dumpd/dumps, LlamaIndex's to_dict/to_json, pydantic's JSON: of
    the model, of a copy, and of the relay configuration it stands for."""
    model = secret_model(adapter, path, monkeypatch)
    config = model.relay_config()
    scan(model, model.model_copy(update={"temperature": 0.2}), config, config.large, config.small)


def test_llama_index_to_json_serializes_a_model_with_a_key() -> None:
    model = RelayLLM(**relay_fields("http://127.0.0.1:8000/v1", api_key=CANARY))
    dumped = json.loads(model.to_json())
    assert dumped["class_name"] == "RelayLLM"
    assert dumped["large_url"] == "http://127.0.0.1:8000/v1"


def test_a_llama_index_dump_leaves_secrets_out_and_loads_them_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What a dump leaves out comes back from the environment, as LangChain's secrets do on
    load: a dump written where the key was given loads where ``RELAY_API_KEY`` holds it."""
    without_canary(monkeypatch)
    model = RelayLLM(
        **relay_fields(
            "http://127.0.0.1:8000/v1",
            api_key=CANARY,
            large={"api_key": CANARY, "read_timeout": 30},
            default_headers={"Authorization": f"Bearer {CANARY}"},
        )
    )
    dumped = model.to_dict()
    scan(json.dumps(dumped))
    assert dumped["large"] == {"read_timeout": 30}
    monkeypatch.setenv("RELAY_API_KEY", "from-the-environment")
    config = RelayLLM.from_dict(dumped).relay_config()
    assert config.large.read_timeout == 30
    assert config.large.api_key is not None
    assert config.large.api_key.get_secret_value() == "from-the-environment"


def test_the_environment_object_shows_no_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RELAY_LARGE__API_KEY", CANARY)
    monkeypatch.setenv("RELAY_LARGE__PROXY", DEAD_PROXY)
    scan(RelayEnvironment.read())


def test_a_relay_configuration_and_server_settings_show_no_secret() -> None:
    endpoint = EndpointConfig(
        base_url="http://127.0.0.1:8000/v1",
        model="large",
        api_key=CANARY,
        extra_headers={"Authorization": f"Bearer {CANARY}"},
        proxy=DEAD_PROXY,
    )
    config = RelayConfig(large=endpoint, small=endpoint)
    scan(endpoint, config, ServerSettings(api_keys=[CANARY]))


# --- what a traced call hands to callbacks --------------------------------------------------


class StartRecorder(BaseCallbackHandler):
    """What LangChain hands a tracer when a chat model starts: ``serialized`` (the model's
    ``dumpd``) and the rest (invocation params, metadata)."""

    def __init__(self) -> None:
        self.starts: list[Any] = []

    def on_chat_model_start(
        self,
        serialized: dict[str, Any],
        messages: list[list[BaseMessage]],
        *,
        run_id: UUID,
        **kwargs: Any,
    ) -> None:
        self.starts.append((serialized, kwargs))


class EventRecorder(BaseEventHandler):
    """LlamaIndex's instrumentation events (a chat's start event holds the model's
    ``to_payload()``, as its callbacks' payload does)."""

    events: list[BaseEvent] = Field(default_factory=list)

    @classmethod
    def class_name(cls) -> str:
        return "EventRecorder"

    def handle(self, event: BaseEvent, **kwargs: Any) -> None:
        self.events.append(event)


@contextlib.contextmanager
def recording_events() -> Iterator[EventRecorder]:
    recorder = EventRecorder()
    dispatcher = get_dispatcher()
    dispatcher.add_event_handler(recorder)
    try:
        yield recorder
    finally:
        dispatcher.event_handlers.remove(recorder)


@pytest.mark.parametrize("path", SECRET_PATHS)
def test_a_langchain_tracer_is_handed_no_secret(
    path: str, server: ScriptedVLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = secret_model(RelayChatModel, path, monkeypatch, server.base_url)
    assert isinstance(model, RelayChatModel)
    recorder = StartRecorder()
    try:
        answer: Any = model.invoke(QUESTION, config={"callbacks": [recorder]})
    except Exception as failed:  # through a dead proxy
        assert path not in REACHES_THE_UPSTREAM, failed
        answer = failed
    assert recorder.starts, "on_chat_model_start was not called"
    serialized = recorder.starts[0][0]
    assert serialized["id"][-1] == "RelayChatModel"
    scan(*recorder.starts, answer)


@pytest.mark.parametrize("path", SECRET_PATHS)
def test_a_llama_index_callback_and_event_handler_are_handed_no_secret(
    path: str, server: ScriptedVLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    debug = LlamaDebugHandler()
    model = secret_model(
        RelayLLM, path, monkeypatch, server.base_url, callback_manager=CallbackManager([debug])
    )
    assert isinstance(model, RelayLLM)
    with recording_events() as recorder:
        try:
            answer: Any = model.chat([ChatMessage(role="user", content=QUESTION)])
        except Exception as failed:  # through a dead proxy
            assert path not in REACHES_THE_UPSTREAM, failed
            answer = failed
    payloads = [event.payload for event in debug.get_events()]
    assert payloads and recorder.events
    scan(*payloads, *recorder.events, answer)


# --- what an error says ---------------------------------------------------------------------

BAD_BESIDE_A_SECRET: dict[str, dict[str, Any]] = {
    # a value refused next to the secret, or the secret itself refused
    "bad timeout beside a key": {"large": {"api_key": CANARY, "read_timeout": "x"}},
    "unknown field beside a key": {"small": {"api_key": CANARY, "bogus": 1}},
    "key of a wrong type": {"large": {"api_key": [CANARY]}},
    "endpoint fields not a dict": {"large": CANARY},
    "key with a newline": {"api_key": CANARY + "\n"},
    "per-model key with a newline": {"large": {"api_key": CANARY + "\n"}},
    "header with a newline": {"default_headers": {"Authorization": f"Bearer {CANARY}\r\n"}},
    "per-model header with a newline": {"small": {"extra_headers": {"X-Key": CANARY + "\n"}}},
    "header of a wrong type": {"default_headers": {"X-Key": [CANARY]}},
    "SOCKS proxy with a password": {"proxy": f"socks5://relay:{CANARY}@127.0.0.1:1080"},
    "per-model proxy not http": {"large": {"proxy": f"ftp://relay:{CANARY}@127.0.0.1:21"}},
    "a password in the URL": {"large_url": f"http://relay:{CANARY}@127.0.0.1:8000/v1"},
    "a per-model password in the URL": {
        "small": {"base_url": f"http://relay:{CANARY}@127.0.0.1:8000/v1"}
    },
    "bad temperature beside a key": {"api_key": CANARY, "temperature": 7},
    "header with a C1 control": {"default_headers": {"X-Key": CANARY + "\x85"}},
    "per-model header with a line separator": {
        "large": {"extra_headers": {"X-Key": CANARY + "\u2028"}}
    },
    "key past ASCII": {"api_key": CANARY + "\xe9"},
    "framing header holding a key": {"default_headers": {"Content-Length": CANARY}},
    "proxy with a line break": {"proxy": f"http://relay:{CANARY}@127.0.0.1:1\r\n"},
    "per-model proxy without a host": {"small": {"proxy": f"http://relay:{CANARY}@"}},
}


@pytest.mark.parametrize("case", BAD_BESIDE_A_SECRET)
@pytest.mark.parametrize("adapter", ADAPTERS)
def test_a_refused_setting_s_error_shows_no_secret(adapter: type[RelaySettings], case: str) -> None:
    """The constructor's error, an assignment's and ``model_copy(update=...)``'s."""
    bad = BAD_BESIDE_A_SECRET[case]
    with pytest.raises(ValueError) as built:
        adapter(**relay_fields("http://127.0.0.1:8000/v1", **bad))
    model = adapter(**relay_fields("http://127.0.0.1:8000/v1"))
    with pytest.raises(ValueError) as copied:
        model.model_copy(update=bad)
    with pytest.raises(ValueError) as assigned:
        for name, value in bad.items():
            setattr(model, name, value)
    scan(built.value, copied.value, assigned.value, model)


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_a_refused_environment_s_error_shows_no_secret(
    adapter: type[RelaySettings], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RELAY_LARGE__API_KEY", CANARY + "\n")
    monkeypatch.setenv("RELAY_SMALL__PROXY", f"socks5://relay:{CANARY}@127.0.0.1:1080")
    with pytest.raises(ValueError) as refused:
        adapter(**relay_fields("http://127.0.0.1:8000/v1"))
    scan(refused.value)


@pytest.mark.parametrize("path", SECRET_PATHS)
@pytest.mark.parametrize("adapter", ADAPTERS)
async def test_an_unreachable_server_s_error_shows_no_secret(
    adapter: type[RelaySettings], path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with refusing_port() as port:
        model = secret_model(adapter, path, monkeypatch, f"http://127.0.0.1:{port}/v1")
        scan(await adapter_error(model))


SECRETS_BY_FIELD = {
    "api_key": CANARY,
    "extra_headers": {"X-Key": CANARY},
    "proxy": f"http://relay:{CANARY}@127.0.0.1:1",
}
ANY_VALUE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.text(max_size=4),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.one_of(st.integers(), st.text(max_size=3)), max_size=2),
)
ENDPOINT_FIELDS = sorted({*EndpointConfig.model_fields, "bogus"} - {"session_factory"})


@pytest.mark.parametrize("adapter", ADAPTERS)
@settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    role=st.sampled_from(["large", "small", None]),
    secret_field=st.sampled_from(sorted(SECRETS_BY_FIELD)),
    others=st.dictionaries(st.sampled_from(ENDPOINT_FIELDS), ANY_VALUE, max_size=3),
)
def test_no_error_beside_a_secret_shows_it(
    adapter: type[RelaySettings], role: str | None, secret_field: str, others: dict[str, Any]
) -> None:
    """Whatever else is wrong in a model's own settings (``large=``/``small=``) or in the
    flat fields, the secret given beside it is not in the error."""
    secret = SECRETS_BY_FIELD[secret_field]
    if role is None:  # the flat fields, under their names
        flat = {"extra_headers": "default_headers", "read_timeout": "timeout"}
        fields = {flat.get(k, k): v for k, v in others.items() if flat.get(k, k) != "model"}
        fields = {k: v for k, v in fields.items() if k in adapter.model_fields or k == "bogus"}
        fields[flat.get(secret_field, secret_field)] = secret
    else:
        fields = {role: {**others, secret_field: secret}}
    try:
        model = adapter(**relay_fields("http://127.0.0.1:1/v1", **fields))
    except Exception as refused:
        scan(*shown_with(refused))
    else:
        model.close()


def shown_with(error: BaseException) -> list[BaseException]:
    """`error` and the exceptions shown with it, as a traceback (and error trackers) shows
    them: its cause, or else its context unless suppressed, and theirs."""
    chain = [error]
    while True:
        last = chain[-1]
        after = last.__cause__ or (None if last.__suppress_context__ else last.__context__)
        if after is None or after in chain:
            return chain
        chain.append(after)


async def adapter_error(model: RelaySettings) -> BaseException:
    """The error of a generation that cannot be done, raised by the adapter's async call."""
    with pytest.raises(Exception) as failed:
        if isinstance(model, RelayChatModel):
            await model.ainvoke(QUESTION)
        else:
            assert isinstance(model, RelayLLM)
            await model.achat([ChatMessage(role="user", content=QUESTION)])
    await model.aclose()
    return failed.value


async def broken_head(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A server whose answer is not HTTP: aiohttp's error keeps the request's headers."""
    await reader.readuntil(b"\r\n\r\n")
    writer.write(b"HTTP/1.1 200 OK\r\nnot a header\r\n\r\n")
    await writer.drain()


@pytest.mark.parametrize("failure", ["refused", "broken head"])
@pytest.mark.parametrize("path", SECRET_PATHS)
@pytest.mark.parametrize("adapter", ADAPTERS)
async def test_no_exception_under_an_upstream_error_shows_a_secret(
    adapter: type[RelaySettings], path: str, failure: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The str and repr of every exception chained under the error (aiohttp's keep the
    request's headers and the proxy's URL), not only the error's own traceback."""
    async with contextlib.AsyncExitStack() as stack:
        if failure == "refused":
            url = f"http://127.0.0.1:{stack.enter_context(refusing_port())}/v1"
        else:
            url = await stack.enter_async_context(raw_server(broken_head)) + "/v1"
        error = await adapter_error(secret_model(adapter, path, monkeypatch, url))
    scan(*shown_with(error))


def refusing_proxy(status: bytes) -> Any:
    """An HTTP proxy that answers every request (a CONNECT) with `status`."""

    async def proxy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 " + status + b"\r\ncontent-length: 0\r\n\r\n")
        await writer.drain()

    return proxy


PROXY_PATHS = ["proxy", "large proxy", "RELAY_LARGE__PROXY", "HTTPS_PROXY"]


def proxy_given(path: str, proxy: str) -> tuple[dict[str, Any], dict[str, str]]:
    """The fields and environment variables that give `proxy` in the way `path` names."""
    if path == "proxy":
        return {"proxy": proxy}, {}
    if path == "large proxy":
        return {"large": {"proxy": proxy}}, {}
    return {}, {path: proxy}


@pytest.mark.parametrize(
    "status", [b"407 Proxy Authentication Required", b"403 Forbidden"], ids=["407", "403"]
)
@pytest.mark.parametrize("path", PROXY_PATHS)
@pytest.mark.parametrize("adapter", ADAPTERS)
async def test_a_proxy_that_refuses_the_tunnel_is_named_without_its_password(
    adapter: type[RelaySettings], path: str, status: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """aiohttp's error for a refused CONNECT says the proxy's URL, password included."""
    without_canary(monkeypatch)
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    async with raw_server(refusing_proxy(status)) as proxy_origin:
        proxy = proxy_origin.replace("http://", f"http://relay:{CANARY}@")
        fields, variables = proxy_given(path, proxy)
        for name, value in variables.items():
            monkeypatch.setenv(name, value)
        model = adapter(**relay_fields("https://127.0.0.1:9/v1", max_retries=0, **fields))
        error = await adapter_error(model)
    assert status.split()[0].decode() in str(error)
    scan(*shown_with(error))


# --- relaygen serve -------------------------------------------------------------------------


def test_relaygen_serve_shows_no_secret_in_answers_metrics_health_or_logs() -> None:
    """The canary as the upstreams' key and header and as the server's own client key: not in
    /metrics, /health, /readyz, /livez, /v1/models, a normal answer (chat completions whole and
    streamed, a response), a refused key's answer, the same once the upstream is down, or the
    server's log (at debug level)."""
    chat = {"model": "large", "messages": [{"role": "user", "content": QUESTION}]}
    answers: list[dict[str, httpx.Response]] = []
    with contextlib.ExitStack() as stack, contextlib.ExitStack() as upstream_running:
        upstream = upstream_running.enter_context(serving(capable_server()))
        env = relay_server_env(upstream, free_port())
        env.update(
            RELAY_API_KEY=CANARY,
            RELAY_SMALL__API_KEY=CANARY,
            RELAY_SERVER_API_KEYS=CANARY,
            RELAY_SERVER_LOG_LEVEL="debug",
        )
        served = stack.enter_context(relaygen_serve(env))
        client = stack.enter_context(
            httpx.Client(
                base_url=served.url, timeout=60, headers={"Authorization": f"Bearer {CANARY}"}
            )
        )

        def everything() -> dict[str, httpx.Response]:
            got = {path: client.get(path) for path in ("/metrics", "/health", "/readyz", "/livez")}
            got["models"] = client.get("/v1/models")
            got["chat"] = client.post("/v1/chat/completions", json=chat)
            got["stream"] = client.post("/v1/chat/completions", json={**chat, "stream": True})
            got["response"] = client.post(
                "/v1/responses", json={"model": "large", "input": QUESTION}
            )
            got["bad key"] = client.get("/v1/models", headers={"Authorization": "Bearer x"})
            return got

        answers.append(everything())
        assert answers[0]["chat"].status_code == 200, answers[0]["chat"].text
        upstream_running.close()  # the upstream goes down
        answers.append(everything())
        assert answers[1]["chat"].status_code >= 500, answers[1]["chat"].text
        served.process.terminate()
        served.process.wait(30)
        served.reader.join(10)
    sent = upstream.models["large"].headers
    assert sent and all(h.get("authorization") == f"Bearer {CANARY}" for h in sent)
    assert all(h.get(CANARY_HEADER.lower()) == CANARY for h in sent)
    scan(
        *(answer.text for round_ in answers for answer in round_.values()),
        *(json.dumps(record) for record in served.records),
    )


# --- the canary itself ----------------------------------------------------------------------

LEAKS = """
import logging, os, sys

def test_a_debug_record() -> None:
    logging.getLogger("leaky").debug("calling with %s", os.environ["RELAY_API_KEY"])

def test_stdout() -> None:
    print(os.environ["RELAY_API_KEY"])

def test_stderr() -> None:
    sys.stderr.write(os.environ["RELAY_LARGE__EXTRA_HEADERS"])

def test_a_test_with_capsys_keeps_it(capsys) -> None:
    print("hello")
    assert capsys.readouterr().out == "hello\\n"

def test_a_clean_test() -> None:
    logging.getLogger("clean").debug("nothing to see")
"""


def test_the_canary_fails_a_test_whose_logs_or_output_show_it(tmp_path: Path) -> None:
    """The fixture and hook of :mod:`tests.fakes.canary` on tests that leak (a DEBUG record,
    stdout, stderr) and tests that do not (one that uses ``capsys`` itself)."""
    (tmp_path / "conftest.py").write_text(
        "from tests.fakes.canary import (  # noqa: F401\n"
        "    canary_environment, canary_everywhere, pytest_runtest_makereport\n)\n"
    )
    (tmp_path / "test_leaks.py").write_text(LEAKS)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", str(tmp_path), "-q", "-rA", "-p", "no:cacheprovider"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},
    )
    summary = [
        line.split(" - ")[0] for line in run.stdout.splitlines() if "test_leaks.py::" in line
    ]
    assert sorted(summary) == [
        "ERROR test_leaks.py::test_a_debug_record",  # at its teardown: the test itself passed
        "FAILED test_leaks.py::test_stderr",
        "FAILED test_leaks.py::test_stdout",
        "PASSED test_leaks.py::test_a_clean_test",
        "PASSED test_leaks.py::test_a_debug_record",
        "PASSED test_leaks.py::test_a_test_with_capsys_keeps_it",
    ], run.stdout
    assert "in the message of a DEBUG record of the logger 'leaky'" in run.stdout
    assert "in the Captured stdout call: 'sk-canary" in run.stdout
    assert 'in the Captured stderr call: \'{"X-Relay-Canary": "sk-canary' in run.stdout


async def test_the_screen_in_front_of_every_served_relay_finds_the_canary_across_chunks() -> None:
    """What puts every answer of ``relaygen serve`` in every test under the canary's watch:
    a body that shows it, split over two chunks, is found (and the answer passed on)."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": f"a {CANARY[:5]}".encode()})
        await send({"type": "http.response.body", "body": f"{CANARY[5:]} b".encode()})

    sent: list[Any] = []

    async def send(message: Any) -> None:
        sent.append(message)

    async def receive() -> Any:
        return {"type": "http.disconnect"}

    scope = {"type": "http", "method": "GET", "path": "/v1/models"}
    await CanaryScreen(app)(scope, receive, send)
    found, ANSWERED[:] = list(ANSWERED), []  # taken here: the test's own, on purpose
    assert len(found) == 1 and found[0].startswith("GET /v1/models: ")
    assert len(sent) == 3
