"""The wire to vLLM: one OpenAI-compatible server, its configuration, the prompt rendering
and the ``/v1/completions`` requests. It knows nothing of cues or switching::

    from relay_integrations.upstream import CompletionRequest, Endpoint, EndpointConfig

    endpoint = Endpoint(EndpointConfig(base_url="http://gpu-b:8000/v1", model="Qwen/Qwen3-1.7B"),
                        "small")
    async for piece in endpoint.stream_completion(CompletionRequest(prompt="Hi", max_tokens=8)):
        print(piece.text, end="")
    await endpoint.aclose()

The relay (:mod:`relay_integrations.relay`) drives two of these; a
:class:`RequestObserver` given to an endpoint sees every request it sends (tracing).
"""

from .completion import CompletionRequest, StreamPiece, TokenPrompt
from .config import EndpointConfig, ModelRole, SamplingConfig, SamplingOverrides
from .endpoint import Endpoint
from .errors import InvalidChatError, InvalidHeaderError, InvalidProxyError, RelayError, RenderError
from .observer import RequestObserver
from .rendering import (
    ChatInput,
    JinjaChatTemplate,
    PromptRenderer,
    RenderedIds,
    RenderedPrompt,
    ServerChatTemplate,
    TokenRenderer,
)

__all__ = [
    "ChatInput",
    "CompletionRequest",
    "Endpoint",
    "EndpointConfig",
    "InvalidChatError",
    "InvalidHeaderError",
    "InvalidProxyError",
    "JinjaChatTemplate",
    "ModelRole",
    "PromptRenderer",
    "RelayError",
    "RenderError",
    "RenderedIds",
    "RenderedPrompt",
    "RequestObserver",
    "SamplingConfig",
    "SamplingOverrides",
    "ServerChatTemplate",
    "StreamPiece",
    "TokenPrompt",
    "TokenRenderer",
]
