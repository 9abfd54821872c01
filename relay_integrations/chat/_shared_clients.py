"""Relay clients shared by every model that talks to the same endpoints.

A model's client (:class:`~.client.RelayClient`: its connections, per event loop) depends on
the endpoints, the cue set, the policy, the renderer and the request hook, not on the
sampling, which every request carries. Models whose client would be the same share one, as
``ChatOpenAI`` instances share their HTTP client: a ``model_copy(update={"temperature":
0.2})``, a ``configurable_fields`` model made per call, or a model per request all use the
connections already open::

    key = client_key(config, renderer, request_hook)
    lease = lease_client(model, key, config, renderer, request_hook)
    await lease.client.respond(request)
    last = lease.release()   # the client, if that was its last holder (the caller closes it)

A lease ends when its model is closed, when the model's settings move it to another client,
or when the model is garbage-collected (then the client, if no one else holds it, closes its
connections on their loops without waiting).
"""

from __future__ import annotations

import hashlib
import json
import threading
import weakref
from collections import deque
from typing import Any

from pydantic import BaseModel, SecretStr

from ..relay.config import RelayConfig, RequestHook
from ..relay.cues import CueSet
from ..upstream.config import SamplingConfig
from ..upstream.rendering import PromptRenderer
from .client import RelayClient

_lock = threading.Lock()
_held: dict[str, tuple[RelayClient, int]] = {}
"""Key -> (client, number of leases)."""


class ClientLease:
    """One model's hold on a shared :class:`RelayClient`."""

    def __init__(self, key: str, client: RelayClient, owner: object) -> None:
        self.key = key
        self.client = client
        self._owner = weakref.ref(owner)
        self._finalizer = weakref.finalize(owner, _release_and_close_later, key)

    def held_by(self, model: object) -> bool:
        """Whether this is `model`'s own lease (a shallow copy of a model shares its
        private values, leases included, until it takes its own)."""
        return self._owner() is model

    def release(self) -> RelayClient | None:
        """End the lease (once); returns the client if no lease holds it any more, for the
        caller to close as it can (``close``, ``aclose``)."""
        if not self._finalizer.detach():
            return None  # released before
        return _release(self.key)

    def __copy__(self) -> None:
        return None  # a copied model takes a lease of its own on first use

    def __deepcopy__(self, memo: dict[int, Any]) -> None:
        return None  # never copy a client: its connections belong to their event loops


def lease_client(
    owner: object,
    key: str,
    config: RelayConfig,
    renderer: PromptRenderer | None,
    request_hook: RequestHook | None = None,
) -> ClientLease:
    """A lease on the client of `key` (:func:`client_key` of the other arguments),
    shared with every other model whose client would be the same; made (and its cue set
    loaded) if there is none."""
    with _lock:
        held = _held.get(key)
        if held is None:
            shared = config.model_copy(update={"sampling": SamplingConfig()})
            cues = CueSet.load(config.cues)
            client = RelayClient(shared, cues, renderer=renderer, request_hook=request_hook)
            _held[key] = (client, 1)
        else:
            client = held[0]
            _held[key] = (client, held[1] + 1)
    _release_collected()  # what the collector queued while the lock was held here
    return ClientLease(key, client, owner)


def client_key(
    config: RelayConfig, renderer: PromptRenderer | None, request_hook: RequestHook | None = None
) -> str:
    """What makes two clients the same: the configuration without its sampling (every
    request carries its own), secrets included, and the renderer, request hook and session
    factories (as objects). A digest, so that no key is kept in the clear."""
    identity = config.model_dump(exclude={"sampling"})
    identity["renderer"] = None if renderer is None else id(renderer)
    identity["request_hook"] = None if request_hook is None else id(request_hook)
    identity["sessions"] = [id(config.large.session_factory), id(config.small.session_factory)]
    text = json.dumps(identity, sort_keys=True, default=_plain)
    return hashlib.sha256(text.encode()).hexdigest()


def _plain(value: object) -> object:
    if isinstance(value, SecretStr):
        return value.get_secret_value()
    if isinstance(value, BaseModel):
        return value.model_dump()
    return repr(value)


def _release(key: str) -> RelayClient | None:
    with _lock:
        released = _released(key)
    _release_collected()
    return released


def _released(key: str) -> RelayClient | None:
    """One lease of `key` fewer (the caller holds the lock); the client if it was the last."""
    client, count = _held[key]
    if count > 1:
        _held[key] = (client, count - 1)
        return None
    del _held[key]
    return client


_collected: deque[str] = deque()
"""Keys whose models the garbage collector took, not yet released (see below)."""


def _release_and_close_later(key: str) -> None:
    """A model was collected while holding its lease: close the client if it was the last
    holder, on its loops, without waiting (safe in a finalizer, on any thread).

    A finalizer runs wherever the collector ran, which may be inside this module's lock (a
    lease being made, the cue set loading, allocates): waiting for the lock there would wait
    for ever. So the key is queued, and released now if the lock is free, else by its holder
    as it lets go (:func:`_release_collected`)."""
    _collected.append(key)
    _release_collected()


def _release_collected() -> None:
    """Release the leases of collected models, unless another holder has the lock (it calls
    this after letting go, so none is left behind)."""
    while _collected:
        if not _lock.acquire(blocking=False):
            return
        try:
            last = [c for c in (_released(k) for k in _drain(_collected)) if c is not None]
        finally:
            _lock.release()
        for client in last:
            client.close_later()


def _drain(queue: deque[str]) -> list[str]:
    keys = []
    while queue:
        keys.append(queue.popleft())
    return keys
