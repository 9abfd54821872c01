"""The demo's seeds table: one row per `relaygen generate --json` result (file name: the seed).

scripts/demo --seeds 10      # runs the demo on seeds 0-9 and prints this table
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

from relay_integrations.relay import RelayResult


def row(seed: str, result: RelayResult) -> str:
    cues = Counter(s.cue for s in result.segments if s.ended_by == "cue")
    named = ", ".join(f"`{cue}` x{count}" for cue, count in cues.items()) or "-"
    return (
        f"| {seed} | {result.stats.switches} | {named} | {1 - result.stats.large_share:.0%} "
        f"| {result.completion_tokens} | {result.finish_reason} | {result.stats.total_seconds:.0f} |"
    )


def main(paths: list[str]) -> None:
    results = sorted(
        ((Path(p).stem, RelayResult.model_validate_json(Path(p).read_text())) for p in paths),
        key=lambda pair: int(pair[0]),
    )
    print("| seed | switches | after | small model's share | tokens | finish | seconds |")
    print("| ---: | ---: | --- | ---: | ---: | --- | ---: |")
    for seed, result in results:
        print(row(seed, result))
    two = sum(result.stats.switches >= 2 for _, result in results)
    print(f"\n{two} of {len(results)} seeds switch at least twice mid-reasoning.")


if __name__ == "__main__":
    main(sys.argv[1:])
