"""A machine-speed reference measured in the same run as the figures::

    seconds = reference_seconds()  # the best of 5 runs of a fixed pure-Python workload

The API servers' CPU figures are pure-Python work for a good part (HTTP, JSON, the tokenizer's
Python side); the same workload timed at the start and the end of a run says how fast this
machine ran Python then (a shared machine, another CPU), so runs on different machines or
under different load can be set side by side.
"""

from __future__ import annotations

import json
import time

_RECORD = {"prompt": list(range(64)), "text": "Therefore, the radius is three." * 4}


def workload() -> int:
    """Fixed work: integer arithmetic, string building and JSON, ~30 ms on a recent core."""
    total = 0
    for i in range(200_000):
        total = (total * 31 + i * i) % 1_000_003
    for i in range(3_000):
        total += len(json.dumps({**_RECORD, "n": i})) + len(f"{i:08d}".join("abc"))
    return total


def reference_seconds(runs: int = 5) -> float:
    """The fastest of `runs` timings of :func:`workload` (the least disturbed by others)."""
    best = float("inf")
    for _ in range(runs):
        started = time.perf_counter()
        workload()
        best = min(best, time.perf_counter() - started)
    return best
