"""LangChain's standard unit tests for chat models, on RelayChatModel (no server needed)."""

from __future__ import annotations

from typing import Any

from langchain_tests.unit_tests import ChatModelUnitTests

from relay_integrations.langchain import RelayChatModel

PARAMS = {
    "large_url": "http://127.0.0.1:9/v1",
    "large_model": "Qwen/Qwen3-32B",
    "small_url": "http://127.0.0.1:9/v1",
    "small_model": "Qwen/Qwen3-1.7B",
}


class RelayCapabilities:
    """What RelayChatModel declares to both standard suites."""

    @property
    def chat_model_class(self) -> type[RelayChatModel]:
        return RelayChatModel

    @property
    def has_tool_choice(self) -> bool:
        return True

    @property
    def supports_json_mode(self) -> bool:
        return True

    @property
    def supports_anthropic_inputs(self) -> bool:
        return True  # convert_to_openai_messages reads Anthropic-style blocks

    @property
    def supports_model_override(self) -> bool:
        return False  # a relay is a fixed pair of models


class TestRelayChatModelUnit(RelayCapabilities, ChatModelUnitTests):
    @property
    def chat_model_params(self) -> dict[str, Any]:
        return PARAMS

    @property
    def init_from_env_params(self) -> tuple[dict[str, str], dict[str, Any], dict[str, Any]]:
        return (
            {
                "RELAY_LARGE__BASE_URL": "http://gpu-a:8000/v1",
                "RELAY_LARGE__MODEL": "Qwen/Qwen3-32B",
                "RELAY_SMALL__BASE_URL": "http://gpu-b:8001/v1",
                "RELAY_SMALL__MODEL": "Qwen/Qwen3-1.7B",
                "RELAY_API_KEY": "secret-key",
            },
            {},
            {
                "large_url": "http://gpu-a:8000/v1",
                "large_model": "Qwen/Qwen3-32B",
                "small_url": "http://gpu-b:8001/v1",
                "small_model": "Qwen/Qwen3-1.7B",
                "api_key": "secret-key",
            },
        )
