"""RelayGen for LangChain and LlamaIndex: a large reasoning model and a small one, switching
inside one generation over two vLLM OpenAI-compatible servers.

The relay itself lives in :mod:`relay_integrations.core`.
"""

from .core import (
    EndpointConfig,
    RelayConfig,
    RelayResult,
    RelaySwitcher,
    SamplingConfig,
    SwitchPolicy,
)

__version__ = "0.1.0"

__all__ = [
    "EndpointConfig",
    "RelayConfig",
    "RelayResult",
    "RelaySwitcher",
    "SamplingConfig",
    "SwitchPolicy",
    "__version__",
]
