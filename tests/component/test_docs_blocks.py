"""Every Python block of README.md and docs/*.md runs as written, against the scripted server.

The blocks of one file run top to bottom in one namespace, as a reader would paste them. The
example addresses of the docs are the scripted servers here: ``http://gpu-a:8000/v1`` and
``http://gpu-b:8001/v1`` the two vLLM servers (serving ``Qwen/Qwen3-32B`` and
``Qwen/Qwen3-1.7B``, answering like capable models), ``http://127.0.0.1:9000/v1`` and
``http://127.0.0.1:8000/v1`` a ``relaygen serve`` over them; ``RELAY_*`` variables name the
same servers. A block that cannot run here says why in a comment right above it::

    <!-- not run by the tests: needs two vLLM servers and amc23.jsonl (...) -->
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from relay_integrations.relay import EndpointConfig, RelayConfig, SwitchPolicy
from relay_integrations.server import RelayServer
from relay_integrations.testing.scripted_vllm import ScriptedModel, ScriptedVLLM, serving
from tests.fakes.capable_model import CAPABLE_CUES, capable
from tests.fakes.relay_http import ServedRelay, relay_http

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LARGE, SMALL = "Qwen/Qwen3-32B", "Qwen/Qwen3-1.7B"
_BLOCK = re.compile(
    r"(?:<!-- not run by the tests: (?P<reason>[^\n]+?) -->\n)?^```python\n(?P<code>.*?)^```",
    re.S | re.M,
)


@dataclass(frozen=True)
class Block:
    path: Path
    line: int
    code: str
    not_run_because: str | None


def blocks(path: Path) -> list[Block]:
    text = path.read_text()
    return [
        Block(path, text.count("\n", 0, m.start("code")) + 1, m["code"], m["reason"])
        for m in _BLOCK.finditer(text)
    ]


@pytest.fixture(scope="module")
def upstream() -> Iterator[ScriptedVLLM]:
    scripted = ScriptedVLLM(
        ScriptedModel(LARGE, "", respond=capable), ScriptedModel(SMALL, "", respond=capable)
    )
    with serving(scripted) as running:
        yield running


@pytest.fixture(scope="module")
def relay(upstream: ScriptedVLLM) -> Iterator[ServedRelay]:
    config = RelayConfig(
        large=EndpointConfig(base_url=upstream.base_url, model=LARGE),
        small=EndpointConfig(base_url=upstream.base_url, model=SMALL),
        cues=CAPABLE_CUES,
        policy=SwitchPolicy(cooldown_tokens=0),
    )
    with relay_http(RelayServer(config)) as served:
        yield served


def as_here(code: str, upstream: ScriptedVLLM, relay: ServedRelay) -> str:
    """The block with the docs' example addresses replaced by the servers of this test."""
    for example in ("http://gpu-a:8000/v1", "http://gpu-b:8001/v1"):
        code = code.replace(example, upstream.base_url)
    for example in ("http://127.0.0.1:9000/v1", "http://127.0.0.1:8000/v1"):
        code = code.replace(example, relay.base_url)
    return code


def run_block(block: Block, namespace: dict[str, object], code: str) -> None:
    compiled = compile(
        code, f"{block.path.name}:{block.line}", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
    )
    outcome = eval(compiled, namespace)  # a block with top-level await returns a coroutine
    if inspect.iscoroutine(outcome):
        asyncio.run(outcome)


@pytest.mark.parametrize("path", DOCUMENTS, ids=[p.name for p in DOCUMENTS])
def test_every_python_block_runs(
    path: Path,
    upstream: ScriptedVLLM,
    relay: ServedRelay,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    monkeypatch.setenv("RELAY_LARGE__BASE_URL", upstream.base_url)
    monkeypatch.setenv("RELAY_LARGE__MODEL", LARGE)
    monkeypatch.setenv("RELAY_SMALL__BASE_URL", upstream.base_url)
    monkeypatch.setenv("RELAY_SMALL__MODEL", SMALL)
    monkeypatch.chdir(tmp_path)  # files a block writes stay out of the repository
    namespace: dict[str, object] = {"__name__": "__docs__"}
    ran = 0
    for block in blocks(path):
        if block.not_run_because is not None:
            assert block.not_run_because.strip(), f"{block.path.name}:{block.line}: say why"
            continue
        run_block(block, namespace, as_here(block.code, upstream, relay))
        ran += 1
    assert ran or not blocks(path) or all(b.not_run_because for b in blocks(path))


def test_the_docs_have_python_blocks_to_run() -> None:
    """The pattern finds the blocks (a changed fence style would silently test nothing)."""
    counted = {p.name: len(blocks(p)) for p in DOCUMENTS}
    assert counted["README.md"] >= 4 and sum(counted.values()) >= 10, counted
