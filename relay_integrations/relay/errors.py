"""Errors of the relay. Each says what went wrong and, where it can, what to do about it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..upstream.config import ModelRole
from ..upstream.endpoint import UpstreamFailure
from ..upstream.errors import RelayError, UpstreamKind
from .config import CONTEXT_MARGIN

if TYPE_CHECKING:
    from .result import RelayResult


class CueArtifactError(RelayError, ValueError):
    """A cue artifact that cannot be used: missing, malformed, or for another model pair."""

    def __init__(self, where: str, reason: str) -> None:
        super().__init__(f"cue artifact {where}: {reason}")
        self.where = where
        self.reason = reason


class ContextOverflowError(RelayError, ValueError):
    """The prompt does not fit a model's context window with room to write, found before the
    first token. Names every model's prompt tokens and window::

        except ContextOverflowError as exc:
            exc.prompt_tokens   # {"large": 5120, "small": 5188}
            exc.windows         # {"large": 4096, "small": 4096}

    Retrieve less, trim the history, or serve the models with a longer ``--max-model-len``.
    A token budget larger than the window leaves is not an error: the relay writes what fits
    and ends with ``finish_reason`` "length".
    """

    def __init__(self, prompt_tokens: dict[ModelRole, int], windows: dict[ModelRole, int]) -> None:
        over = ", ".join(
            f"{role} model {prompt_tokens[role]} tokens, window {windows[role]}"
            for role in prompt_tokens
        )
        super().__init__(
            f"the prompt does not fit the context window with room to write ({over}; the "
            f"relay keeps {CONTEXT_MARGIN} tokens of margin): shorten the messages, or serve "
            "the models with a longer --max-model-len"
        )
        self.prompt_tokens = prompt_tokens
        self.windows = windows


class DeadlineExceeded(UpstreamFailure):
    """A generation ran out of its recovery deadline (``SwitchPolicy.deadline_seconds``): the
    message says what the time went on (resumes, waits for a server, retries) and the last
    failure. It is the ``__cause__`` of the :class:`EndpointError` the generation raises::

        except EndpointError as exc:
            if isinstance(exc.__cause__, DeadlineExceeded): ...
    """


class EndpointError(RelayError):
    """An upstream endpoint failed (after retries) and the generation could not go on.

    ``partial`` holds everything generated before the failure, so no work is lost; ``kind``
    says how it failed (``relaygen serve`` answers 400, 504 or 502 by it)::

        try:
            result = await switcher.generate(messages)
        except EndpointError as exc:
            print(exc.role, exc.kind, exc.partial.text if exc.partial else "")
    """

    def __init__(
        self,
        role: ModelRole,
        message: str,
        partial: RelayResult | None = None,
        kind: UpstreamKind = "failed",
        reason: str | None = None,
    ) -> None:
        super().__init__(f"{role} endpoint: {message}")
        self.role = role
        self.partial = partial
        self.kind = kind
        self.reason = reason or message
        """Why, in words that name no address (``relaygen serve`` tells its clients this;
        the message, with the URL, goes to its log)."""
