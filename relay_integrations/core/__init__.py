"""The relay core: configuration, cue sets, prompt rendering, endpoints, the switcher, and the
check of a pair of servers.

It knows nothing of LangChain, LlamaIndex or HTTP servers; the adapters translate to and
from the types exported here.
"""

from .artifact import CueArtifact, ModelIdentity, ModelPair, builtin_artifact_names, load_artifact
from .config import (
    EndpointConfig,
    ModelRole,
    ReasoningMarkers,
    RelayConfig,
    SamplingConfig,
    SwitchPolicy,
)
from .cues import CueMatch, CueSet
from .errors import (
    ContextOverflowError,
    CueArtifactError,
    EndpointError,
    InvalidChatError,
    RelayError,
    RenderError,
)
from .reasoning import PromptReasoning, split_reasoning
from .rendering import (
    ChatInput,
    JinjaChatTemplate,
    PromptRenderer,
    RenderedPrompt,
    ServerChatTemplate,
)
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
    "EndpointConfig",
    "EndpointError",
    "InvalidChatError",
    "JinjaChatTemplate",
    "ModelIdentity",
    "ModelPair",
    "ModelRole",
    "ModelUsage",
    "PromptReasoning",
    "PromptRenderer",
    "ReasoningMarkers",
    "RelayConfig",
    "RelayDone",
    "RelayError",
    "RelayEvent",
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
