"""What a generation does when a server fails it mid-way: a stream that broke after sending
text resumes from the text so far (``SwitchPolicy.max_resumes`` times a turn); a server that
is out (no connection, a 502/503/504, known down) is waited for within
``SwitchPolicy.resume_wait_seconds``, when the generation cannot go on without it and has
text to lose::

    recovery = Recovery(generation_id, config, endpoints, tally)
    recovery.resume("large", broken, resumes=1)       # logs it, or raises UpstreamFailure
    await recovery.wait_for("large", failure, written=True)  # returns once it is back
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

from ..upstream.config import ModelRole
from ..upstream.endpoint import Endpoint, StreamInterrupted, UpstreamFailure
from ._tally import Tally
from .config import RelayConfig

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

    def resume(self, role: ModelRole, broken: StreamInterrupted, resumes: int) -> None:
        """Go on after a broken stream (the `resumes`-th break of the turn), or raise once
        the resumes are spent."""
        config = self.endpoints[role].config
        if resumes > self.policy.max_resumes:
            raise UpstreamFailure.broken(broken, config, resumes) from broken
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
        within what is left of ``resume_wait_seconds``, so that a restart loses no text; or
        raise `failure` at once when the generation can go on without the server (the small
        one's, unless the policy says raise), has not `written` anything yet (nothing to
        lose: the caller may try elsewhere), or the failure is not an outage (a refused
        request)."""
        essential = role == "large" or self.policy.on_small_failure == "raise"
        if not (essential and written and failure.outage):
            raise failure
        budget = self.policy.resume_wait_seconds - self.tally.waited
        endpoint, began, back = self.endpoints[role], time.monotonic(), False
        if budget > 0:
            logger.warning(
                "generation %s: the %s server %s is out (%s); waiting up to %.0f s for it",
                self.generation_id,
                role,
                endpoint.config.base_url,
                failure.reason,
                budget,
            )
            back = await endpoint.availability.wait_until_up(budget)
            self.tally.waited += time.monotonic() - began
        if not back:
            waited = f"{self.tally.waited:.0f} s of SwitchPolicy.resume_wait_seconds"
            raise UpstreamFailure(
                role,
                failure.cause,
                f"{failure.detail} The generation waited {waited} for it to come back.",
                f"{failure.reason}; it did not come back within the {waited}",
            ) from failure
