"""What a generation does when a server fails it mid-way: a stream that broke after sending
text resumes from the text so far (``SwitchPolicy.max_resumes`` times a turn); a server that
is out (no connection, a 502/503/504, known down) is waited for within
``SwitchPolicy.resume_wait_seconds``, when the generation cannot go on without it and has
text to lose. All of it is within the generation's recovery deadline
(``SwitchPolicy.deadline_seconds``: :class:`~..upstream.deadline.Deadline`), whose clock runs
from a failure (from its last event, for a stream that stalled until its read timeout)
until a request gives text again, and which the endpoints' retry loops count
their waits against while a request is opened under it::

    recovery = Recovery(generation_id, config, endpoints, tally)
    with recovery.scope():                            # opening a request: its retries count
        first = await anext(stream, None)
    recovery.recovered()                              # it gave text: the clock stops
    recovery.resume("large", broken, resumes=1)       # logs it, or raises UpstreamFailure
    await recovery.wait_for("large", failure, written=True)  # returns once it is back
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from ..upstream.config import ModelRole
from ..upstream.deadline import Deadline, deadline_scope
from ..upstream.endpoint import Endpoint, StreamInterrupted, UpstreamFailure
from ._tally import Tally
from .config import RelayConfig
from .errors import DeadlineExceeded

logger = logging.getLogger(__name__)


class Recovery:
    def __init__(
        self,
        generation_id: str,
        config: RelayConfig,
        endpoints: Mapping[ModelRole, Endpoint],
        tally: Tally,
    ) -> None:
        self.generation_id = generation_id
        self.policy = config.policy
        self.endpoints = endpoints
        self.tally = tally
        self.deadline = Deadline(config.policy.deadline)
        self._recovering = False  # the generation's own recovery is open on the deadline

    @contextmanager
    def scope(self) -> Iterator[None]:
        """The generation's deadline is the current one (around opening a request, where
        the endpoint retries; no ``yield`` of the generation inside)."""
        with deadline_scope(self.deadline):
            yield

    def recovered(self) -> None:
        """A request gave text: the generation is no longer recovering."""
        if self._recovering:
            self._recovering = False
            self.deadline.recovered()

    def _failed(
        self, role: ModelRole, failure: UpstreamFailure | StreamInterrupted, stalled: float = 0.0
    ) -> None:
        """A failure met: the generation recovers from now (from `stalled` seconds before,
        for a stream that waited that long for nothing before it broke), and raises if the
        deadline has run out."""
        if not self._recovering:
            self._recovering = True
            self.deadline.recover(stalled)
        if self.deadline.remaining() <= 0:
            raise self._out_of_time(role, failure) from failure

    def resume(self, role: ModelRole, broken: StreamInterrupted, resumes: int) -> None:
        """Go on after a broken stream (the `resumes`-th break of the turn), or raise once
        the resumes or the deadline are spent."""
        config = self.endpoints[role].config
        if resumes > self.policy.max_resumes:
            raise UpstreamFailure.broken(broken, config, resumes) from broken
        self._failed(role, broken, config.read_timeout if broken.stalled else 0.0)
        self.tally.resumes += 1
        logger.warning(
            "generation %s: the %s stream from %s broke after %d characters (%s); "
            "resuming from the text so far (%d of SwitchPolicy.max_resumes=%d)",
            self.generation_id,
            role,
            config.base_url,
            len(broken.text),
            str(broken.cause) or type(broken.cause).__name__,
            resumes,
            self.policy.max_resumes,
        )

    async def wait_for(self, role: ModelRole, failure: UpstreamFailure, written: bool) -> None:
        """After a request found `role`'s server out: wait for a probe to find it up again,
        within what is left of ``resume_wait_seconds`` and of the deadline, so that a restart
        loses no text; or raise `failure` at once when the generation can go on without the
        server (the small one's, unless the policy says raise), has not `written` anything
        yet (nothing to lose: the caller may try elsewhere), or the failure is not an outage
        (a refused request). Past the deadline, whatever the failure, raise
        :class:`DeadlineExceeded`."""
        self._failed(role, failure)
        essential = role == "large" or self.policy.on_small_failure == "raise"
        if not (essential and written and failure.outage):
            raise failure
        budget = self.policy.resume_wait_seconds - self.tally.waited
        left = self.deadline.remaining()
        endpoint, began, back = self.endpoints[role], time.monotonic(), False
        if budget > 0:
            logger.warning(
                "generation %s: the %s server %s is out (%s); waiting up to %.0f s for it",
                self.generation_id,
                role,
                endpoint.config.base_url,
                failure.reason,
                min(budget, left),
            )
            back = await endpoint.availability.wait_until_up(min(budget, left))
            self.tally.waited += time.monotonic() - began
        if back:
            return
        if budget > left:  # the deadline ran out first
            raise self._out_of_time(role, failure) from failure
        waited = f"{self.tally.waited:.0f} s of SwitchPolicy.resume_wait_seconds"
        raise UpstreamFailure(
            role,
            failure.cause,
            f"{failure.detail} The generation waited {waited} for it to come back.",
            f"{failure.reason}; it did not come back within the {waited}",
        ) from failure

    def _out_of_time(
        self, role: ModelRole, failure: UpstreamFailure | StreamInterrupted
    ) -> DeadlineExceeded:
        """The error of a generation out of its deadline, after `failure`: the deadline,
        what it went on, the last failure and the setting that sets it."""
        deadline, tally = self.deadline, self.tally
        spent = (
            f"{tally.resumes} resumes of broken streams ({deadline.stalled:.1f} s of streams "
            f"that stalled before they broke), {tally.waited:.1f} s waiting for a server to "
            f"come back, {deadline.retries} retries after {deadline.retry_wait:.1f} s of retry "
            "waits"
        )
        if isinstance(failure, UpstreamFailure):
            cause, detail, reason = failure.cause, failure.detail, failure.reason
        else:
            cause, reason = failure.cause, f"its stream broke ({failure.cause!r})"
            detail = f"The {role} stream broke after {len(failure.text)} characters."
        return DeadlineExceeded(
            role,
            cause,
            f"the generation ran out of its recovery deadline "
            f"(SwitchPolicy.deadline_seconds={deadline.seconds:g} s: {spent}). The last "
            f"failure: {detail} Raise SwitchPolicy.deadline_seconds "
            "(RELAY_POLICY__DEADLINE_SECONDS) to let a generation recover for longer.",
            f"{reason}; the generation ran out of its {deadline.seconds:g} s recovery deadline",
        )
