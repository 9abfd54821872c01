"""The errors of the wire to vLLM, and the base class of every error of the package."""

from __future__ import annotations

from typing import Literal


class RelayError(Exception):
    """Base class of every error raised by relay_integrations."""


class RenderError(RelayError):
    """The chat messages could not be turned into a prompt."""


class InvalidChatError(RenderError):
    """The server's chat template refused these messages or tools (the caller's to fix)."""


UpstreamKind = Literal["rejected", "timeout", "unavailable", "failed"]
"""How an upstream failed: it refused the request (400), it timed out, it is known down (no
request sent: its circuit breaker is open), or anything else."""


class InvalidHeaderError(RelayError, ValueError):
    """A header the relay will not send (a framing header, a value that is not visible ASCII):
    refused where it is given, naming the header and never its value (it may be a key)."""


class InvalidProxyError(RelayError, ValueError):
    """A proxy URL the relay will not use (the ``proxy`` setting, or the environment's
    ``HTTP_PROXY`` / ``HTTPS_PROXY`` / ``ALL_PROXY``): refused when the endpoint is made,
    before anything is sent, naming where it was given and what to fix, never its password.
    A setting to change, not a server that is out::

        try:
            Endpoint(config, "large")
        except InvalidProxyError as exc:
            print(exc)  # the environment's HTTPS_PROXY: 'http://:3128' is not a proxy URL ...
    """
