"""Real vLLM servers for the integration tests.

``scripts/vllm_servers.sh start`` starts them and ``scripts/vllm_servers.sh env`` prints the
variables read here (``scripts/demo_server.sh start`` and ``env`` for the Gemma-SmolLM2 pair).
Without them these tests skip, unless ``RELAY_REQUIRE_VLLM=1`` (as in ``scripts/test`` and
CI), where a missing server is a failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from tests.fakes.canary import (  # noqa: F401  (autouse: every test carries the canary)
    canary_environment,
    canary_everywhere,
    pytest_runtest_makereport,
)
from tests.fakes.clients import off_loop
from tests.fakes.loop_stalls import loop_monitor, no_loop_stalls  # noqa: F401  (autouse)
from tests.fakes.spans import spans  # noqa: F401  (a tracer provider for the tests that ask)
from tests.fakes.unclosed import (  # noqa: F401  (autouse)
    no_module_dropped_unclosed,
    nothing_dropped_unclosed,
)

pytestmark = pytest.mark.vllm


@dataclass(frozen=True)
class Server:
    url: str
    large_model: str
    small_model: str

    @property
    def root(self) -> str:
        return self.url.removesuffix("/v1")


def _env(name: str) -> str:
    value = os.environ.get(name)
    if value:
        return value
    message = f"{name} is not set: start the servers with scripts/vllm_servers.sh start"
    if os.environ.get("RELAY_REQUIRE_VLLM") == "1":
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="session")
def qwen_large() -> Server:
    return Server(_env("RELAY_TEST_QWEN_LARGE_URL"), _env("RELAY_TEST_QWEN_LARGE_MODEL"), "")


@pytest.fixture(scope="session")
def qwen_small() -> Server:
    return Server(_env("RELAY_TEST_QWEN_SMALL_URL"), "", _env("RELAY_TEST_QWEN_SMALL_MODEL"))


@pytest.fixture(scope="session")
def r1() -> Server:
    return Server(
        _env("RELAY_TEST_R1_URL"),
        _env("RELAY_TEST_R1_LARGE_MODEL"),
        _env("RELAY_TEST_R1_SMALL_MODEL"),
    )


@pytest.fixture(scope="session")
def stock() -> Server:
    """A vLLM server started as users run theirs: no VLLM_MAX_STOP_STRINGS (4 stop strings a
    request), no --enable-prompt-tokens-details; it serves qwen3-small's model under two names."""
    return Server(
        _env("RELAY_TEST_STOCK_URL"),
        _env("RELAY_TEST_STOCK_LARGE_MODEL"),
        _env("RELAY_TEST_STOCK_SMALL_MODEL"),
    )


@pytest.fixture(scope="session")
def gemma() -> Server:
    """The demo's large model: Gemma 3 270M (base; 262,144-token vocabulary, its own worked-
    example chat template), from ``scripts/demo_server.sh start``."""
    return Server(_env("RELAY_TEST_GEMMA_URL"), _env("RELAY_TEST_GEMMA_MODEL"), "")


@pytest.fixture(scope="session")
def smollm2() -> Server:
    """The demo's small model: SmolLM2-135M-Instruct (Llama architecture, 49,152-token
    vocabulary, ChatML template), from ``scripts/demo_server.sh start``."""
    return Server(_env("RELAY_TEST_SMOLLM2_URL"), "", _env("RELAY_TEST_SMOLLM2_MODEL"))


@dataclass(frozen=True)
class Replica:
    """One of two vLLM servers of the tiny large model behind the routers; `name` is its
    name in scripts/vllm_servers.sh (to kill and restart it)."""

    name: str
    root: str


@pytest.fixture(scope="session")
def replicas() -> tuple[Replica, Replica]:
    """qwen3-large and its second replica qwen3-large-b (``scripts/vllm_servers.sh start
    qwen3-large qwen3-large-b router-hash router-rr``)."""
    first = _env("RELAY_TEST_QWEN_LARGE_URL").removesuffix("/v1")
    second = _env("RELAY_TEST_QWEN_LARGE_B_URL").removesuffix("/v1")
    return Replica("qwen3-large", first), Replica("qwen3-large-b", second)


@pytest.fixture(scope="session")
def router_hash() -> Server:
    """vllm-router with --policy consistent_hash (keys on X-Session-ID) over the replicas."""
    return Server(_env("RELAY_TEST_ROUTER_HASH_URL"), _env("RELAY_TEST_QWEN_LARGE_MODEL"), "")


@pytest.fixture(scope="session")
def router_rr() -> Server:
    """vllm-router with --policy round_robin over the same replicas."""
    return Server(_env("RELAY_TEST_ROUTER_RR_URL"), _env("RELAY_TEST_QWEN_LARGE_MODEL"), "")


@pytest.fixture(scope="session")
def speculative() -> Server:
    """qwen3-large's model with n-gram speculative decoding (up to 3 drafted tokens a step),
    tuned like qwen3-large (``scripts/vllm_servers.sh start qwen3-spec``)."""
    return Server(_env("RELAY_TEST_SPEC_URL"), _env("RELAY_TEST_QWEN_LARGE_MODEL"), "")


# The tests' own reads of a server's /metrics, /health or /tokenize: a loaded CI machine has
# taken longer than httpx's default 5 s to connect to a server on 127.0.0.1.
PATIENT = httpx.Timeout(30)


async def vllm_metric(root: str, name: str) -> float:
    """A vLLM metric from /metrics, summed over its labels (e.g. its model names)."""
    async with await off_loop(httpx.AsyncClient, timeout=PATIENT) as client:
        text = (await client.get(f"{root}/metrics")).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


async def settled_metric(root: str, name: str) -> float:
    """A vLLM counter once it has stopped moving (vLLM updates its counters late)."""
    count = await vllm_metric(root, name)
    for _ in range(20):
        await asyncio.sleep(0.5)
        again = await vllm_metric(root, name)
        if again == count:
            return count
        count = again
    return count


async def running_requests(root: str) -> float:
    """vLLM's gauge of requests being generated."""
    return await vllm_metric(root, "vllm:num_requests_running")


def connections_to(url: str) -> int:
    """This process's open TCP connections to the server of `url` (Linux: /proc)."""
    port = urlsplit(url).port
    own = set()
    for fd in Path("/proc/self/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                own.add(target[len("socket:[") : -1])
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as lines:
            for line in list(lines)[1:]:
                fields = line.split()
                remote_port = int(fields[2].rsplit(":", 1)[1], 16)
                established = fields[3] == "01"
                count += remote_port == port and established and fields[9] in own
    return count


def relaygen(command: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``relaygen COMMAND ARGS...`` in a process of its own; its output, not raised."""
    return subprocess.run(
        [sys.executable, "-m", "relay_integrations.cli", command, *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def pair_options(large: Server, small: Server) -> list[str]:
    """The ``relaygen`` options that name the two servers and models."""
    return [
        *("--large-url", large.url, "--large-model", large.large_model),
        *("--small-url", small.url, "--small-model", small.small_model),
    ]


def qwen_relay_fields(large: Server, small: Server, **fields: object) -> dict[str, object]:
    """Settings of a LangChain or LlamaIndex relay model over the tiny Qwen3 pair."""
    from relay_integrations.relay import SwitchPolicy

    return {
        "large_url": large.url,
        "large_model": large.large_model,
        "small_url": small.url,
        "small_model": small.small_model,
        "cues": ["Therefore,", "Now"],
        "policy": SwitchPolicy(cooldown_tokens=0),
        "max_tokens": 300,
        **fields,
    }
