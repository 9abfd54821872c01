"""LangChain: :class:`RelayChatModel`, a ``BaseChatModel`` over the relay.

Needs the ``langchain`` extra: ``pip install 'relay-integrations[langchain]'``.
"""

try:
    import langchain_core  # noqa: F401
except ImportError as missing:
    raise ImportError(
        "relay_integrations.langchain needs langchain-core: "
        "pip install 'relay-integrations[langchain]'",
        name=missing.name,
    ) from missing

from .chat_model import RelayChatModel

__all__ = ["RelayChatModel"]
