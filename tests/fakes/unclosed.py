"""The unclosed-connections fixtures of the component and integration tiers: a test fails when
an HTTP session or connector it made (aiohttp's: the relay's and the frameworks') is dropped
without being closed, the connections it held left to the garbage collector. aiohttp says so
through the event loop's exception handler ("Unclosed client session"), which logs it on the
``asyncio`` logger.

The young garbage is collected at each test's end, so the test that dropped a session is
usually the one that fails; what outlived the young generations is collected (a full
collection takes ~0.2 s in this process, too long for every test) at the end of each module,
whose last test then fails, naming the module. A tier's conftest imports the fixtures::

    from tests.fakes.unclosed import nothing_dropped_unclosed  # noqa: F401  (autouse)
    from tests.fakes.unclosed import no_module_dropped_unclosed  # noqa: F401  (autouse)
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Iterator

import pytest

UNCLOSED = ("Unclosed client session", "Unclosed connector")
FIX = "close the model, client or session it made, or use it in a with block"


class _Unclosed(logging.Handler):
    """What the ``asyncio`` logger said was dropped unclosed, from one point on."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.found: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith(UNCLOSED):
            self.found.append(message.splitlines()[0])

    def __enter__(self) -> _Unclosed:
        logging.getLogger("asyncio").addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        logging.getLogger("asyncio").removeHandler(self)


@pytest.fixture(autouse=True)
def nothing_dropped_unclosed(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail the test (at its teardown) if it dropped a session or connector unclosed."""
    with _Unclosed() as caught:
        yield
        gc.collect(1)  # the young garbage: what the test let go of, found in this test
    if caught.found:
        found = ", ".join(caught.found)
        pytest.fail(f"{request.node.nodeid} dropped without closing: {found} ({FIX})", False)


@pytest.fixture(autouse=True, scope="module")
def no_module_dropped_unclosed(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail the module's last test if the full collection at its end finds a session or
    connector one of its tests dropped unclosed."""
    with _Unclosed() as caught:
        yield
        gc.collect()
    if caught.found:
        found = ", ".join(caught.found)
        pytest.fail(f"a test of {request.node.nodeid} dropped without closing: {found} ({FIX})")
