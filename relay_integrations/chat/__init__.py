"""What both framework adapters share, written once: their flat settings
(:class:`~.settings.RelaySettings`), the relay as they hold it (:class:`~.client.RelayClient`:
a switcher per event loop, sync calls, closing), one chat exchange on the relay
(:mod:`.exchange`: tools, structured output, deltas), the habits of other clients
(:mod:`.habits`) and tool calls (:mod:`.tool_calls`)::

    class RelayChatModel(RelaySettings, BaseChatModel): ...      # LangChain

    client = RelayClient(settings.relay_config(), settings.load_cues())
    response = await client.respond(ChatRequest(messages))

It sits above the relay (:mod:`relay_integrations.relay`) and knows nothing of either
framework: the adapters translate their messages to OpenAI-format dicts and back.
"""

from .client import RelayClient
from .exchange import ChatRequest, ChatResponse, stream_chat
from .settings import RelaySettings

__all__ = ["ChatRequest", "ChatResponse", "RelayClient", "RelaySettings", "stream_chat"]
