"""Leases of shared relay clients when the garbage collector takes a model at any moment: a
model's finalizer may run inside the module's lock (a lease being made allocates), and must
neither wait for that lock (it would wait for ever) nor lose its release."""

from __future__ import annotations

import threading
from typing import Any

from relay_integrations.chat import _shared_clients as shared


class Client:
    def __init__(self) -> None:
        self.closed = 0

    def close_later(self) -> None:
        self.closed += 1


def test_a_model_collected_inside_the_lock_is_released_when_the_lock_is_let_go() -> None:
    client: Any = Client()
    shared._held["collected-inside"] = (client, 2)
    finished = threading.Event()
    with shared._lock:  # as lease_client holds it while a cue set loads and the collector runs
        shared._release_and_close_later("collected-inside")
        finished.set()  # returned at once: it did not wait for the lock its thread holds
        assert shared._held["collected-inside"] == (client, 2)  # queued, not released yet
    shared._release_collected()  # what the holder does as it lets go
    assert finished.is_set()
    assert shared._held["collected-inside"] == (client, 1)
    shared._release_and_close_later("collected-inside")  # the lock free: released at once
    assert "collected-inside" not in shared._held
    assert client.closed == 1


def test_a_collected_model_of_another_thread_is_released_by_the_lock_s_holder() -> None:
    client: Any = Client()
    shared._held["collected-elsewhere"] = (client, 1)
    with shared._lock:
        other = threading.Thread(
            target=shared._release_and_close_later, args=["collected-elsewhere"]
        )
        other.start()
        other.join(5)
        assert not other.is_alive()  # it queued the key and returned
    shared._release_collected()
    assert "collected-elsewhere" not in shared._held and client.closed == 1
