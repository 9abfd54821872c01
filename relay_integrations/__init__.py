"""RelayGen for LangChain and LlamaIndex: a large reasoning model and a small one, switching
inside one generation over two vLLM OpenAI-compatible servers.

The relay itself lives in :mod:`relay_integrations.relay` and needs neither framework; each
adapter is an extra::

    pip install relay-integrations                 # the core, relaygen generate and calibrate
    pip install 'relay-integrations[langchain]'    # relay_integrations.langchain.RelayChatModel
    pip install 'relay-integrations[llama-index]'  # relay_integrations.llama_index.RelayLLM
"""

from .relay import (
    EndpointConfig,
    RelayConfig,
    RelayResult,
    RelaySwitcher,
    SamplingConfig,
    SwitchPolicy,
)

# The one place the version is written: setuptools reads it (pyproject.toml, dynamic version).
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
