"""Loopback ports: a free one for a server a test starts, one that refuses connections for
tests of a server that is not up."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def refusing_port() -> Iterator[int]:
    """A port bound (so nothing else takes it) but not listening: connections are refused."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    try:
        yield sock.getsockname()[1]
    finally:
        sock.close()


def free_port() -> int:
    """A loopback port nothing listens on now (a server the test starts takes it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
