"""Stream one relay generation and print who wrote what, then the stats.

    python examples/stream_relay.py                      # uses RELAY_* environment variables
    RELAY_LARGE__BASE_URL=http://gpu-a:8000/v1 RELAY_LARGE__MODEL=Qwen/Qwen3-32B \\
    RELAY_SMALL__BASE_URL=http://gpu-b:8001/v1 RELAY_SMALL__MODEL=Qwen/Qwen3-1.7B \\
        python examples/stream_relay.py "How many primes are below 30?"
"""

from __future__ import annotations

import asyncio
import sys

from relay_integrations.relay import RelayConfig, RelayDone, RelaySwitcher, SegmentDone, TextDelta


async def main(question: str) -> None:
    async with RelaySwitcher(RelayConfig.from_env()) as relay:
        async for event in relay.stream([{"role": "user", "content": question}]):
            if isinstance(event, TextDelta):
                print(event.text, end="", flush=True)
            elif isinstance(event, SegmentDone):
                segment = event.segment
                print(f" <{segment.model}: {segment.ended_by}>", end="", flush=True)
            elif isinstance(event, RelayDone):
                result = event.result
                print(f"\n\nanswer: {result.answer}")
                print(
                    f"large-model share {result.stats.large_share:.0%}, "
                    f"{result.stats.switches} switches, {result.stats.total_seconds:.1f} s"
                )


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "What is 12 * 13?"))
