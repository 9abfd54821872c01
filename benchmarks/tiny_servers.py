"""Figures of the tiny test servers: decode speed of each model, and the prompt and cached
tokens of every segment of one forced relay generation.

    eval "$(scripts/vllm_servers.sh env)" && .venv/bin/python -m benchmarks tiny-servers
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
import uuid
from collections.abc import Sequence

import openai

from relay_integrations.jobs.statistics import median
from relay_integrations.relay import EndpointConfig, RelayConfig, RelaySwitcher, SamplingConfig
from relay_integrations.relay.config import SwitchPolicy
from relay_integrations.testing import forcing

ENVIRONMENT = (
    *("RELAY_TEST_QWEN_LARGE_URL", "RELAY_TEST_QWEN_LARGE_MODEL"),
    *("RELAY_TEST_QWEN_SMALL_URL", "RELAY_TEST_QWEN_SMALL_MODEL"),
    *("RELAY_TEST_R1_URL", "RELAY_TEST_R1_LARGE_MODEL"),
)

TRACE = (
    "<think>\nLet me compute the total. Therefore, the sum is 12. Now we check e.g. the parts."
    " So the check holds.\n</think>\n\nThe answer is 12."
)


async def tokens_per_second(url: str, model: str, tokens: int = 128, runs: int = 3) -> float:
    client = openai.AsyncOpenAI(base_url=url, api_key="EMPTY")
    rates = []
    for _ in range(runs):
        started = time.perf_counter()
        response = await client.completions.create(
            model=model,
            prompt="Once upon a time",
            max_tokens=tokens,
            temperature=1.0,
            extra_body={"ignore_eos": True, "min_tokens": tokens},
        )
        assert response.usage is not None
        rates.append(response.usage.completion_tokens / (time.perf_counter() - started))
    await client.close()
    return median(rates)


def main(argv: Sequence[str] = ()) -> int:
    argparse.ArgumentParser(
        prog="python -m benchmarks tiny-servers", description=__doc__.split("\n\n")[0]
    ).parse_args(argv)
    missing = [name for name in ENVIRONMENT if name not in os.environ]
    if missing:
        print(
            f"not set: {', '.join(missing)}; start the tiny servers (scripts/vllm_servers.sh "
            'start) and eval "$(scripts/vllm_servers.sh env)"',
            file=sys.stderr,
        )
        return 2
    asyncio.run(measure())
    return 0


async def measure() -> None:
    env = os.environ
    servers = [
        (env["RELAY_TEST_QWEN_LARGE_URL"], env["RELAY_TEST_QWEN_LARGE_MODEL"]),
        (env["RELAY_TEST_QWEN_SMALL_URL"], env["RELAY_TEST_QWEN_SMALL_MODEL"]),
        (env["RELAY_TEST_R1_URL"], env["RELAY_TEST_R1_LARGE_MODEL"]),
    ]
    print("decode speed (128 tokens after a 4-token prompt, median of 3):")
    for url, model in servers:
        print(f"  {model:12} {await tokens_per_second(url, model):7.1f} tokens/s")

    config = RelayConfig(
        large=EndpointConfig(base_url=servers[0][0], model=servers[0][1]),
        small=EndpointConfig(base_url=servers[1][0], model=servers[1][1]),
        cues=["Therefore,", "Now", "So "],
        sampling=SamplingConfig(max_tokens=512, seed=0),
        policy=SwitchPolicy(cooldown_tokens=0),
    )
    system = (
        uuid.uuid4().hex
        + " You are a careful assistant. "
        + " ".join(
            f"Rule {i}: show every step of the work and check each result twice." for i in range(30)
        )
    )
    messages = [
        {"role": "system", "content": system},
        {"role": "user", "content": "What is 5 + 7?"},
    ]
    async with RelaySwitcher(config) as relay:
        result = await relay.generate(messages, request_hook=forcing(TRACE))
    print("\none forced relay generation (a ~500-token system prompt, vLLM cache blocks of 128):")
    print(
        f"  {'segment':>7} {'model':5} {'ended by':16} {'requests':>8} {'prompt':>7} "
        f"{'cached':>7} {'written':>7}"
    )
    for i, s in enumerate(result.segments):
        u = s.usage
        print(
            f"  {i:>7} {s.model:5} {s.ended_by:16} {u.requests:>8} {u.prompt_tokens:>7} "
            f"{u.cached_tokens:>7} {u.completion_tokens:>7}"
        )
    for role, u in result.usage.items():
        share = u.cached_tokens / u.prompt_tokens if u.prompt_tokens else 0.0
        print(f"  {role}: {u.prompt_tokens} prompt tokens, {u.cached_tokens} cached ({share:.0%})")
    print(
        f"  large-model share {result.stats.large_share:.0%}, {result.stats.switches} switches, "
        f"{result.stats.total_seconds:.2f} s"
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
