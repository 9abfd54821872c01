"""LlamaIndex: :class:`RelayLLM`, a ``FunctionCallingLLM`` over the relay.

Needs the ``llama-index`` extra: ``pip install 'relay-integrations[llama-index]'``.
"""

try:
    import llama_index.core  # noqa: F401
except ImportError as missing:
    raise ImportError(
        "relay_integrations.llama_index needs llama-index-core: "
        "pip install 'relay-integrations[llama-index]'",
        name=missing.name,
    ) from missing

from .llm import RelayLLM

__all__ = ["RelayLLM"]
