"""The method: a large reasoning model and a small one taking turns inside one generation, on
two vLLM servers (:mod:`relay_integrations.upstream`), with a calibrated cue set::

    from relay_integrations.relay import EndpointConfig, RelayConfig, RelaySwitcher

    config = RelayConfig(
        large=EndpointConfig(base_url="http://gpu-a:8000/v1", model="Qwen/Qwen3-32B"),
        small=EndpointConfig(base_url="http://gpu-b:8000/v1", model="Qwen/Qwen3-1.7B"),
    )
    async with RelaySwitcher(config) as relay:
        result = await relay.generate([{"role": "user", "content": "What is 17 * 23?"}])
    print(result.text, result.stats.switches)

It knows nothing of LangChain, LlamaIndex or HTTP servers; the adapters translate to and
from the types exported here, and :func:`check_servers` tells whether two servers are ready.
"""

from ..upstream.config import EndpointConfig, ModelRole, SamplingConfig
from ..upstream.errors import (
    InvalidChatError,
    InvalidHeaderError,
    InvalidProxyError,
    RelayError,
    RenderError,
)
from ..upstream.rendering import (
    ChatInput,
    JinjaChatTemplate,
    PromptRenderer,
    RenderedPrompt,
    ServerChatTemplate,
)
from .artifact import CueArtifact, ModelIdentity, ModelPair, builtin_artifact_names, load_artifact
from .config import PromptPath, ReasoningMarkers, RelayConfig, SwitchPolicy
from .cues import CueMatch, CueSet
from .errors import ContextOverflowError, CueArtifactError, DeadlineExceeded, EndpointError
from .reasoning import PromptReasoning, split_reasoning
from .request import RelayRequest
from .result import (
    ModelUsage,
    RelayDone,
    RelayEvent,
    RelayResult,
    RelayStats,
    Segment,
    SegmentDone,
    TextDelta,
)
from .sentences import find_sentence_end, is_sentence_end
from .server_check import CheckItem, ServerReport, check_servers, check_servers_sync
from .switcher import RelaySwitcher

__all__ = [
    "ChatInput",
    "CheckItem",
    "ContextOverflowError",
    "CueArtifact",
    "CueArtifactError",
    "CueMatch",
    "CueSet",
    "DeadlineExceeded",
    "EndpointConfig",
    "EndpointError",
    "InvalidChatError",
    "InvalidHeaderError",
    "InvalidProxyError",
    "JinjaChatTemplate",
    "ModelIdentity",
    "ModelPair",
    "ModelRole",
    "ModelUsage",
    "PromptPath",
    "PromptReasoning",
    "PromptRenderer",
    "ReasoningMarkers",
    "RelayConfig",
    "RelayDone",
    "RelayError",
    "RelayEvent",
    "RelayRequest",
    "RelayResult",
    "RelayStats",
    "RelaySwitcher",
    "RenderError",
    "RenderedPrompt",
    "SamplingConfig",
    "Segment",
    "SegmentDone",
    "ServerChatTemplate",
    "ServerReport",
    "SwitchPolicy",
    "TextDelta",
    "builtin_artifact_names",
    "check_servers",
    "check_servers_sync",
    "find_sentence_end",
    "is_sentence_end",
    "load_artifact",
    "split_reasoning",
]
