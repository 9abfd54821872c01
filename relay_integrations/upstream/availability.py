"""Whether an upstream server is known down: a circuit breaker per endpoint, on the rules of
Envoy's outlier detection (a host ejected after 5 consecutive 5xx) and vllm-router's breaker.

- It opens after ``failures_to_open`` (5) requests in a row failed for good because the server
  is out (no connection, a connection lost before any answer, a 502, 503 or 504 after the
  request's retries: :func:`~._failures.is_outage`). One failure opens nothing: a caller's
  own retry goes to the server. Any request the server answers (a success, and also a
  refusal, a 429, a 500: it is up) resets the count; what says nothing about the server
  being up (a read timeout, a TLS failure, a proxy's refusal, a cancelled request) leaves it.
- While it is open, requests fail at once with :class:`ServerDown`: no connection attempts,
  no retry waits, so a relay can go around the server (the large model writes the small
  model's turns) or tell its caller now. Requests already in their retry loop stop at their
  next attempt.
- Half-open: ``probe_interval`` seconds after it opened, the next request is let through as
  the trial (one at a time, without retries; the others still fail at once). The trial's
  success closes the breaker, its outage re-opens it for another interval, and a trial that
  ends otherwise (cancelled, timed out) hands its turn to the next request an interval later.
- A probe (``GET /v1/models``, :meth:`Endpoint.probe`) counts like any request; a generation
  waiting for the server (:meth:`wait_until_up`) probes every ``probe_interval``, as the
  trial while the breaker is open::

    availability = Availability("small", url, endpoint.probe, probe_interval=1.0,
                                probe_timeout=10, failures_to_open=5)
    trial = availability.admit()      # raises ServerDown while open; True: the trial
    availability.succeeded()          # the server answered: count reset, breaker closed
    availability.record(failure, "it refused the connection", trial=trial)  # a final failure
    await availability.wait_until_up(120.0)  # True once a probe (or a request) found it up
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from ._failures import ServerDown as ServerDown
from ._failures import answered, is_outage
from ._http import sdk_request
from .config import ModelRole

logger = logging.getLogger(__name__)

Probe = Callable[[], Awaitable[str]]
"""One look at the server: ``"ok"``, or why not (:meth:`Endpoint.probe`)."""


class Availability:
    """The breaker of one endpoint (see the module docstring)."""

    def __init__(
        self,
        role: ModelRole,
        url: str,
        probe: Probe,
        *,
        probe_interval: float,
        probe_timeout: float,
        failures_to_open: int,
    ) -> None:
        self.role: ModelRole = role
        self.url = url
        self.probe_interval = probe_interval
        self.failures_to_open = failures_to_open
        self._probe = probe
        self._probe_timeout = probe_timeout
        self.failures = 0
        """Requests in a row that failed for good with an outage (reset by any answer)."""
        self.down_since: float | None = None
        """When the breaker opened (``time.monotonic()``), or None while it is closed."""
        self.reason = ""
        """Why: the last outage, in words without an address."""
        self._next_trial = 0.0
        self._trial = False  # the half-open trial is in flight
        self._probing: asyncio.Task[bool] | None = None
        self._next_probe = 0.0

    @property
    def down(self) -> bool:
        return self.down_since is not None

    def admit(self) -> bool:
        """Let a request go, or raise :class:`ServerDown` while the breaker is open. True when
        the request is the half-open trial: report how it ended (:meth:`succeeded`,
        :meth:`record`, :meth:`abandoned`), and send it once, without retries."""
        if self.down_since is None:
            return False
        if self._trial or time.monotonic() < self._next_trial:
            raise ServerDown(message=self.explain(), request=sdk_request("POST", self.url))
        self._trial = True
        logger.info("%s server known down: one request is let through to try it", self.role)
        return True

    def succeeded(self) -> None:
        """The server answered a request: reset the count, close the breaker."""
        self.failures = 0
        self._trial = False
        if self.down_since is not None:
            logger.warning(
                "%s server is up again after %.1f s", self.role, time.monotonic() - self.down_since
            )
            self.down_since = None

    def record(self, failure: BaseException, reason: str, *, trial: bool) -> None:
        """Count a request's final `failure` (`reason`: why, without an address): an outage
        counts (and opens the breaker at ``failures_to_open``, or re-opens it after a failed
        trial), an answer of the server's own resets, anything else leaves the count."""
        if isinstance(failure, ServerDown):
            return  # not sent
        if answered(failure):
            self.succeeded()
        elif not is_outage(failure):
            self.abandoned(trial)
        else:
            self._failed(reason, trial)

    def abandoned(self, trial: bool) -> None:
        """A request ended saying nothing about the server (cancelled, timed out, refused on
        the way): if it was the trial, the next request may try an interval from now."""
        if trial and self._trial:
            self._trial = False
            self._next_trial = time.monotonic() + self.probe_interval

    def _failed(self, reason: str, trial: bool) -> None:
        self.failures += 1
        self.reason = reason
        now = time.monotonic()
        if self.down_since is None and self.failures >= self.failures_to_open:
            self.down_since, self._next_trial = now, now + self.probe_interval
            logger.warning(
                "%s server is down (%s; %d requests in a row): requests to it fail at once, "
                "one is let through every %.1f s to try it",
                self.role,
                reason,
                self.failures,
                self.probe_interval,
            )
        elif self.down_since is not None and trial:
            self._trial, self._next_trial = False, now + self.probe_interval
            logger.info("%s server still down: %s", self.role, reason)

    def explain(self) -> str:
        """Why requests fail now: since when, and why, in words without an address."""
        since = 0.0 if self.down_since is None else time.monotonic() - self.down_since
        return (
            f"known down for {since:.1f} s ({self.reason}; {self.failures} failed requests in "
            f"a row); one request is let through every {self.probe_interval:g} s to try it"
        )

    async def wait_until_up(self, seconds: float) -> bool:
        """Wait up to `seconds` for the server to answer: True at once if a request succeeded
        since the last outage, else once a probe (every ``probe_interval``; while the breaker
        is open, as its trial) or a request's success finds it up."""
        deadline = time.monotonic() + seconds
        while self.failures:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            probing = self._probe_if_due()
            if probing is None:
                due = max(self._next_probe, self._next_trial if self.down else 0.0)
                await asyncio.sleep(min(left, max(due - time.monotonic(), 0.01)))
                continue
            try:
                async with asyncio.timeout(left):
                    if await asyncio.shield(probing):
                        return True
            except TimeoutError:
                return False
        return True

    async def aclose(self) -> None:
        """Cancel a probe in flight (before the endpoint closes its connections)."""
        probing, self._probing = self._probing, None
        if probing is not None and not probing.done():
            probing.cancel()
            if probing.get_loop() is asyncio.get_running_loop():
                await asyncio.gather(probing, return_exceptions=True)

    def _probe_if_due(self) -> asyncio.Task[bool] | None:
        """The probe in flight on this event loop, or a new one if one is due, else None."""
        probing = self._probing
        running = asyncio.get_running_loop()
        if probing is not None and not probing.done() and probing.get_loop() is running:
            return probing
        now = time.monotonic()
        if now < self._next_probe or (self.down and (self._trial or now < self._next_trial)):
            return None
        self._next_probe = now + self.probe_interval
        self._probing = running.create_task(self._look())
        return self._probing

    async def _look(self) -> bool:
        try:
            async with asyncio.timeout(self._probe_timeout):
                state = await self._probe()
        except TimeoutError:
            state = f"no answer within {self._probe_timeout:g} s"
        if state != "ok":
            logger.info("%s server still down: %s", self.role, state)
        return state == "ok"
