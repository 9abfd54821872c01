"""LangChain's standard integration tests for chat models, on RelayChatModel over a scripted
vLLM server whose two models answer like a capable reasoning model (tests/fakes/capable_model):
a tiny random model cannot decide to call the right tool. The same adapter is proven against
real vLLM in tests/integration/test_langchain_real_vllm.py."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from langchain_core.messages import AIMessage
from langchain_tests.integration_tests import ChatModelIntegrationTests

from relay_integrations.testing.scripted_vllm import serving
from tests.fakes.capable_model import capable_server, relay_fields
from tests.unit.test_langchain_standard_unit import RelayCapabilities

_SERVER: dict[str, str] = {}


@pytest.fixture(scope="module", autouse=True)
def running_capable_server() -> Iterator[None]:
    with serving(capable_server()) as server:
        _SERVER["url"] = server.base_url
        yield
    _SERVER.clear()


class TestRelayChatModelStandard(RelayCapabilities, ChatModelIntegrationTests):
    @property
    def chat_model_params(self) -> dict[str, Any]:
        return relay_fields(_SERVER["url"])

    @property
    def supported_usage_metadata_details(self) -> dict[Any, list[Any]]:
        details = ["cache_read_input", "reasoning_output"]
        return {"invoke": details, "stream": details}

    def invoke_with_reasoning_output(self, *, stream: bool = False) -> AIMessage:
        return self._invoke("What is 2 + 2?", stream)

    def invoke_with_cache_read_input(self, *, stream: bool = False) -> AIMessage:
        # a question over several cache blocks, asked twice: the second is served from cache
        question = "Summarise the following notes. " + "The relay hands over at cues. " * 40
        self._invoke(question, stream)
        message = self._invoke(question, stream)
        assert message.usage_metadata is not None
        assert message.usage_metadata["input_token_details"].get("cache_read", 0) > 0
        return message

    def _invoke(self, question: str, stream: bool) -> AIMessage:
        model = self.chat_model_class(**self.chat_model_params)
        if not stream:
            return model.invoke(question)
        whole: Any = None
        for chunk in model.stream(question):
            whole = chunk if whole is None else whole + chunk
        return AIMessage(**whole.model_dump(exclude={"type", "tool_call_chunks", "chunk_position"}))
