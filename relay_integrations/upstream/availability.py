"""Whether an upstream server is known down: a circuit breaker per endpoint.

A request that fails for good because the server is out (no connection, a connection lost
before any answer, a 502, 503 or 504 after the retries: :func:`~._failures.is_outage`) opens
the breaker; a refused request, a busy server (429) or a slow one (the read timeout) do not.
While it is open, requests to the server fail at once with :class:`ServerDown`: no
connection attempts, no retry waits, so a relay can go around the server (the large model
writes the small model's turns) or tell its caller now. Requests already in their retry loop
stop at their next attempt. A probe (``GET /v1/models`` on the endpoint's own connections)
runs at most once every ``probe_interval`` seconds while the breaker is open, started by
whoever finds it open (a request, a waiting generation, a health check); the first probe the
server answers closes the breaker::

    availability = Availability("small", url, endpoint.probe, probe_interval=1.0, probe_timeout=10)
    availability.failed("connection refused")  # after a request's last retry
    availability.check()                        # raises ServerDown (and starts a probe)
    await availability.wait_until_up(120.0)     # True once a probe found it up again
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from ._failures import ServerDown as ServerDown
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
    ) -> None:
        self.role: ModelRole = role
        self.url = url
        self.probe_interval = probe_interval
        self._probe = probe
        self._probe_timeout = probe_timeout
        self.down_since: float | None = None
        """When the breaker opened (``time.monotonic()``), or None while the server is up."""
        self.reason = ""
        """Why it opened: the failure that opened it, in words without an address."""
        self._probing: asyncio.Task[None] | None = None
        self._next_probe = 0.0

    @property
    def down(self) -> bool:
        return self.down_since is not None

    def failed(self, reason: str) -> None:
        """A request failed for good with an outage: open the breaker (first probe after
        one interval)."""
        if self.down_since is None:
            self.down_since = time.monotonic()
            self._next_probe = self.down_since + self.probe_interval
            logger.warning(
                "%s server is down (%s): requests to it fail at once until a probe (every "
                "%.1f s) finds it up",
                self.role,
                reason,
                self.probe_interval,
            )
        self.reason = reason

    def up(self) -> None:
        """The server answered: close the breaker."""
        if self.down_since is not None:
            logger.warning(
                "%s server is up again after %.1f s", self.role, time.monotonic() - self.down_since
            )
        self.down_since = None

    def check(self) -> None:
        """Raise :class:`ServerDown` while the breaker is open (starting a probe if one is
        due); return while the server is up."""
        if self.down_since is None:
            return
        self._probe_if_due()
        raise ServerDown(message=self.explain(), request=sdk_request("POST", self.url))

    def explain(self) -> str:
        """Why requests fail now: since when, and why, in words without an address."""
        since = 0.0 if self.down_since is None else time.monotonic() - self.down_since
        return (
            f"known down for {since:.1f} s ({self.reason}); probed every {self.probe_interval:g} s"
        )

    async def wait_until_up(self, seconds: float) -> bool:
        """Wait up to `seconds` for a probe to find the server up; whether it did."""
        deadline = time.monotonic() + seconds
        while self.down_since is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            probing = self._probe_if_due()
            if probing is None:
                await asyncio.sleep(min(left, max(self._next_probe - time.monotonic(), 0.01)))
                continue
            try:
                async with asyncio.timeout(left):
                    await asyncio.shield(probing)
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

    def _probe_if_due(self) -> asyncio.Task[None] | None:
        """The probe in flight on this event loop, or a new one if one is due, else None."""
        probing = self._probing
        if probing is not None and not probing.done():
            if probing.get_loop() is asyncio.get_running_loop():
                return probing
        elif time.monotonic() < self._next_probe:
            return None
        self._next_probe = time.monotonic() + self.probe_interval
        self._probing = asyncio.get_running_loop().create_task(self._look())
        return self._probing

    async def _look(self) -> None:
        try:
            async with asyncio.timeout(self._probe_timeout):
                state = await self._probe()
        except TimeoutError:
            state = f"no answer within {self._probe_timeout:g} s"
        if state == "ok":
            self.up()
        else:
            logger.info("%s server still down: %s", self.role, state)
