"""LangChain: :class:`RelayChatModel`, a ``BaseChatModel`` over the relay core."""

from .chat_model import RelayChatModel

__all__ = ["RelayChatModel"]
