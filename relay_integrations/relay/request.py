"""What one generation asks of the relay, as one value::

    request = RelayRequest(
        [{"role": "user", "content": "What is 7 * 6?"}],
        sampling=SamplingConfig(max_tokens=1024),
        stop=["\\n\\n"],
    )
    async for event in relay.stream_request(request):
        ...
    # the same as: relay.stream(request.messages, sampling=..., stop=["\\n\\n"])

The adapters build one from a chat turn (``ChatRequest.relay_request``) and hand it on whole.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..upstream.config import SamplingConfig
from ..upstream.headers import check_header_value
from ..upstream.rendering import Message


@dataclass(frozen=True)
class RelayRequest:
    """One generation's input and options (see :meth:`RelaySwitcher.stream
    <relay_integrations.relay.switcher.RelaySwitcher.stream>` for each field)."""

    messages: Sequence[Message]
    tools: Sequence[Mapping[str, Any]] = ()
    """OpenAI-format tools, rendered into both models' prompts by their chat templates."""
    chat_template_kwargs: Mapping[str, Any] = field(default_factory=dict)
    sampling: SamplingConfig | None = None
    """None: the configuration's."""
    stop: Sequence[str] = ()
    """Stop sequences of the answer."""
    answer_extra_body: Mapping[str, Any] = field(default_factory=dict)
    """vLLM fields for the answer's requests (a forced JSON answer's ``structured_outputs``)."""
    extra_body: Mapping[str, Any] = field(default_factory=dict)
    """vLLM fields for every request of both models (the endpoints' own under them)."""
    generation_id: str | None = None
    """Unique; default ``relay-<uuid>``. Sent upstream in the session header and, with a
    request number, as ``X-Request-Id``."""

    def __post_init__(self) -> None:
        if self.generation_id is not None:
            check_header_value("generation_id", self.generation_id)  # it goes into headers
