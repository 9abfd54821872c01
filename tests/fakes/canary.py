"""A canary secret, and the check that no surface ever shows it.

:data:`CANARY` is the API key and a header of every component and integration test: the
:func:`canary_environment` fixture sets it as ``RELAY_API_KEY`` and as a header of both models
(``RELAY_LARGE__EXTRA_HEADERS`` / ``RELAY_SMALL__EXTRA_HEADERS``), and
:func:`canary_everywhere` fails a test whose log records (every level, looked at as they are
logged) hold it; :func:`pytest_runtest_makereport` does the same for what the test wrote to
stdout and stderr. A test that sets its own key overrides the variable; a test of what the
environment gives, or of the exact headers a server received, runs without the variables
(:func:`without_canary`).

:class:`CanaryScreen` looks at every answer of ``relaygen serve`` a test serves
(:func:`tests.fakes.relay_http.relay_http` puts it in front of the app).

:func:`scan` renders things every way a surface can show them and fails naming where the
canary appeared::

    scan(model, exc_info.value, response.text)

Why a hook for stdout and stderr: a fixture that asks for ``capfd`` makes every test that
asks for ``capsys`` an error (pytest allows one capture fixture per test), so the captured
output is read where pytest puts it for the report, from every test, whatever it asks for.
"""

from __future__ import annotations

import json
import logging
import traceback
from collections.abc import Generator, Iterator
from typing import Any

import pytest
from langchain_core.load import Serializable, dumpd, dumps
from llama_index.core.schema import BaseComponent
from pydantic import BaseModel

CANARY = "sk-canary-7f3e2a9d51c84b06"
"""A secret no surface may show: distinctive, so that a hit is this and nothing else."""

CANARY_HEADER = "X-Relay-Canary"
"""The header that carries the canary to both models in every test (servers ignore it)."""

CANARY_VARIABLES = {
    "RELAY_API_KEY": CANARY,
    "RELAY_LARGE__EXTRA_HEADERS": json.dumps({CANARY_HEADER: CANARY}),
    "RELAY_SMALL__EXTRA_HEADERS": json.dumps({CANARY_HEADER: CANARY}),
}
"""The environment every test runs in: the canary as the key and a header of both models."""


def renderings(thing: Any) -> Iterator[tuple[str, str]]:
    """Every text `thing` can be shown as, each with how: ``str``/``repr``; for an exception
    its traceback with its causes; for pydantic models their JSON; for LangChain objects
    ``dumpd``/``dumps``; for LlamaIndex components ``to_dict``/``to_json``; for a log record
    its message, exception and every attribute (the ``fields`` a JSON formatter writes).

    Not renderings: a Python ``model_dump()`` (the values themselves, as a key's
    ``SecretStr`` is one) and a ``ValidationError``'s ``errors()`` (pydantic keeps the input
    there for programs; ``errors(include_input=False)`` leaves it out)."""
    if isinstance(thing, bytes):
        yield "bytes", thing.decode("utf-8", "replace")
        return
    if isinstance(thing, str):
        yield "text", thing
        return
    yield "str", str(thing)
    yield "repr", repr(thing)
    if isinstance(thing, BaseException):
        yield "traceback", "".join(traceback.format_exception(thing))
    if isinstance(thing, logging.LogRecord):
        yield "message", thing.getMessage()
        if thing.exc_info and thing.exc_info[1] is not None:
            yield "exception", "".join(traceback.format_exception(thing.exc_info[1]))
        yield "attributes", repr(vars(thing))
    if isinstance(thing, Serializable):
        yield "dumpd", repr(dumpd(thing))
        yield "dumps", dumps(thing)
    if isinstance(thing, BaseComponent):
        yield "to_dict", repr(thing.to_dict())
        yield "to_json", thing.to_json()
    if isinstance(thing, BaseModel):
        yield "model_dump_json", thing.model_dump_json()


def scan(*things: Any) -> None:
    """Fail if the canary shows in any rendering of any of `things`, naming which and how."""
    for index, thing in enumerate(things):
        for how, text in renderings(thing):
            assert CANARY not in text, (
                f"the canary secret shows in the {how} of argument {index} "
                f"({type(thing).__name__}): {_around(text)}"
            )


def _around(text: str) -> str:
    """The canary in its context, for the failure message."""
    at = text.index(CANARY)
    return repr(text[max(at - 200, 0) : at + len(CANARY) + 60])


@pytest.fixture(scope="package", autouse=True)
def canary_environment() -> Iterator[None]:
    """The canary as ``RELAY_API_KEY`` and as a header of both models, for every test of the
    package (module fixtures, such as relays built once per module, included); the variables
    end with the package, so that the unit tests run without them."""
    with pytest.MonkeyPatch.context() as patch:
        for name, value in CANARY_VARIABLES.items():
            patch.setenv(name, value)
        yield


class _CanaryWatch(logging.Handler):
    """Looks for the canary in every record as it is logged and keeps only what it found (so
    that a test of many requests holds no more memory than it did)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.found: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            for how, text in renderings(record):
                if CANARY in text and not self.found:
                    self.found.append(
                        f"the canary secret shows in the {how} of a {record.levelname} record "
                        f"of the logger {record.name!r}: {_around(text)}"
                    )
        except Exception:
            self.handleError(record)


ANSWERED: list[str] = []
"""Where an answer of ``relaygen serve`` (served by :func:`tests.fakes.relay_http.relay_http`)
showed the canary: :func:`canary_everywhere` fails the test that was running."""


class CanaryScreen:
    """ASGI middleware that looks for the canary in every answer it passes on: the status
    line's headers and the body, across its chunks (an SSE stream's events). What it finds
    goes to :data:`ANSWERED`; the answer is passed on as it is::

        config.app = CanaryScreen(config.app)
    """

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        tail = ""

        async def screened(message: Any) -> None:
            nonlocal tail
            if message["type"] == "http.response.start":
                shown = b"\n".join(b": ".join(pair) for pair in message.get("headers", []))
                text = shown.decode("latin-1")
            elif message["type"] == "http.response.body":
                text = tail + message.get("body", b"").decode("utf-8", "replace")
                tail = text[-len(CANARY) :]
            else:
                text = ""
            if CANARY in text:
                ANSWERED.append(f"{scope['method']} {scope['path']}: {_around(text)}")
            await send(message)

        await self.app(scope, receive, screened)


@pytest.fixture(autouse=True)
def canary_everywhere(canary_environment: None, caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """Every record logged while the test runs, at every level (the root logger at DEBUG), is
    looked at; at teardown the test fails if one showed the canary, naming the logger and
    how. The other handlers (``caplog``'s and the report's) keep the level they had, so that
    ``caplog.records`` and the report of a failure are as without the canary (a test's own
    ``caplog.set_level`` moves both)."""
    root = logging.getLogger()
    before = root.getEffectiveLevel()
    others = [handler for handler in root.handlers if handler is not caplog.handler]
    caplog.set_level(logging.DEBUG)  # restored by caplog
    caplog.handler.setLevel(before)

    def as_caplog_sees(record: logging.LogRecord) -> bool:
        return record.levelno >= caplog.handler.level

    watch = _CanaryWatch()
    root.addHandler(watch)
    for handler in others:
        handler.addFilter(as_caplog_sees)
    try:
        yield
    finally:
        root.removeHandler(watch)
        for handler in others:
            handler.removeFilter(as_caplog_sees)
    if watch.found:
        pytest.fail(watch.found[0], pytrace=False)
    answered, ANSWERED[:] = list(ANSWERED), []
    if answered:
        pytest.fail(f"the canary secret shows in an answer of relaygen serve: {answered[0]}")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A test whose captured stdout or stderr shows the canary fails in the phase (setup,
    call, teardown) that wrote it."""
    report = yield
    for title, content in report.sections:
        own = title in (f"Captured stdout {call.when}", f"Captured stderr {call.when}")
        if own and CANARY in content and report.outcome != "failed":
            report.outcome = "failed"
            report.longrepr = f"the canary secret shows in the {title}: {_around(content)}"
    return report


def without_canary(monkeypatch: pytest.MonkeyPatch) -> None:
    """This test runs without the canary's variables: for a test of what the environment
    gives, or of the exact headers an upstream receives."""
    for name in CANARY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
