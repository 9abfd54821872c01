"""LlamaIndex: :class:`RelayLLM`, a ``FunctionCallingLLM`` over the relay core."""

from .llm import RelayLLM

__all__ = ["RelayLLM"]
