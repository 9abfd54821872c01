"""A deadline for recovering from failures: a budget of seconds that runs only while
something is being recovered. Every retry loop of an :class:`~.endpoint.Endpoint` counts
against the current one (a context variable, so that nothing between the caller and the
retry loop has to pass it on)::

    deadline = Deadline(30.0)
    with deadline_scope(deadline):  # around the call that may retry: opening a stream
        first = await anext(endpoint.stream_completion(request))
    deadline.remaining()  # 30.0, less the retry loop's waits
    deadline.retries, deadline.retry_wait  # what those were

Its clock runs while at least one recovery is open, so that time two of them share counts
once: a retry loop's wait is one (:func:`sleep_within_deadline`), and a caller opens its own
around what it spends recovering (the relay: from a failure it meets until a request gives
text again; :meth:`Deadline.recover`). A retry loop under a deadline waits no longer than
what is left, and makes no attempt once nothing is (:func:`wait_within_deadline`,
:func:`stop_at_deadline`): the last attempt comes at the deadline. An attempt in flight is
not cut: the endpoint's own timeouts bound it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from tenacity import RetryCallState, stop_never
from tenacity.stop import stop_base


class Deadline:
    """`seconds` of recovery (see the module docstring), and what they went on."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.retries = 0
        """Retries made under it (each after a wait)."""
        self.retry_wait = 0.0
        """Seconds of those retries' waits (backoff and ``Retry-After``)."""
        self.stalled = 0.0
        """Seconds streams stalled before they broke (counted from their last event)."""
        self._spent = 0.0
        self._open = 0
        self._since = 0.0

    def remaining(self) -> float:
        """Seconds left: negative once it has run out."""
        running = time.monotonic() - self._since if self._open else 0.0
        return self.seconds - self._spent - running

    def recover(self, stalled: float = 0.0) -> None:
        """Open a recovery: the clock runs until every open one is closed. `stalled`: seconds
        the failure took to show (a stream that stalled until its read timeout), counted
        as spent already."""
        if not self._open:
            self._since = time.monotonic() - stalled
            self.stalled += stalled
        self._open += 1

    def recovered(self) -> None:
        """Close a recovery opened with :meth:`recover`."""
        self._open -= 1
        if not self._open:
            self._spent += time.monotonic() - self._since

    async def sleep(self, seconds: float) -> None:
        """A retry loop's wait of `seconds` before its next attempt: a recovery while it
        lasts, and counted as a retry."""
        self.retries += 1
        self.retry_wait += seconds
        self.recover()
        try:
            await asyncio.sleep(seconds)
        finally:
            self.recovered()


_CURRENT: ContextVar[Deadline | None] = ContextVar("relay_deadline", default=None)


@contextmanager
def deadline_scope(deadline: Deadline | None) -> Iterator[Deadline | None]:
    """Make `deadline` the current one for the block (None: no deadline). Keep the block
    free of ``yield``: a context variable set in an async generator leaks into, and cannot be
    reset from, whatever iterates it next (a sync bridge's next task)."""
    token = _CURRENT.set(deadline)
    try:
        yield deadline
    finally:
        _CURRENT.reset(token)


def current_deadline() -> Deadline | None:
    """The current deadline, or None."""
    return _CURRENT.get()


def stop_at_deadline(deadline: Deadline | None) -> stop_base:
    """A tenacity stop condition: stop once `deadline` has no time left (none: never)."""
    return stop_never if deadline is None else _StopAtDeadline(deadline)


def wait_within_deadline(
    wait: Callable[[RetryCallState], float], deadline: Deadline | None
) -> Callable[[RetryCallState], float]:
    """`wait`, cut to what is left of `deadline`: the next attempt comes at the deadline
    at the latest, the last chance it leaves."""
    if deadline is None:
        return wait
    return lambda retry_state: max(min(wait(retry_state), deadline.remaining()), 0.0)


def sleep_within_deadline(deadline: Deadline | None) -> Callable[[float], Awaitable[None]]:
    """A tenacity sleep that counts in `deadline` (:meth:`Deadline.sleep`)."""
    return asyncio.sleep if deadline is None else deadline.sleep


class _StopAtDeadline(stop_base):
    def __init__(self, deadline: Deadline) -> None:
        self.deadline = deadline

    def __call__(self, retry_state: RetryCallState) -> bool:
        return self.deadline.remaining() <= 0
