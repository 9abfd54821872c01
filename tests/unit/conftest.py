"""The unit tests start no server and no process: pure logic, fast. A test that listens on a
socket or starts a process fails here, naming where it belongs (tests/component)."""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

ELSEWHERE = "a unit test starts no server and no process: this test belongs in tests/component"


@pytest.fixture(scope="package", autouse=True)
def no_server_and_no_process() -> Iterator[None]:
    def refused(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError(ELSEWHERE)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(socket.socket, "listen", refused)
        patch.setattr(subprocess.Popen, "__init__", refused)  # asyncio's subprocesses too
        yield
