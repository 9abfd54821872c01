"""Errors of the relay. Each says what went wrong and, where it can, what to do about it."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .result import RelayResult


class RelayError(Exception):
    """Base class of every error raised by relay_integrations."""


class CueArtifactError(RelayError, ValueError):
    """A cue artifact that cannot be used: missing, malformed, or for another model pair."""

    def __init__(self, where: str, reason: str) -> None:
        super().__init__(f"cue artifact {where}: {reason}")
        self.where = where
        self.reason = reason


class RenderError(RelayError):
    """The chat messages could not be turned into a prompt."""


class InvalidChatError(RenderError):
    """The server's chat template refused these messages or tools (the caller's to fix)."""


class EndpointError(RelayError):
    """An upstream endpoint failed (after retries) and the generation could not go on.

    ``partial`` holds everything generated before the failure, so no work is lost::

        try:
            result = await switcher.generate(messages)
        except EndpointError as exc:
            print(exc.role, exc.partial.text if exc.partial else "")
    """

    def __init__(self, role: str, message: str, partial: RelayResult | None = None) -> None:
        super().__init__(f"{role} endpoint: {message}")
        self.role = role
        self.partial = partial
