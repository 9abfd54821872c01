"""The fit ``cpu = a·tokens + b·switches + c·generations`` of the client's CPU time::

    fit, cells = await cpu_fit(url, rounds=3, per_cell=15)               # stops at the server
    fit, cells = await cpu_fit(url, rounds=3, per_cell=15, stop_limit=1)  # found in the stream
    fit.cpu_per_token_us, fit.cpu_per_switch_ms, fit.cpu_per_generation_ms

`url` is the scripted upstream of :mod:`benchmarks.upstream`, whose answer restates the
question, so a longer question makes a longer generation. A cell's generations are the same in
every round (same tokens, same switches); the fit takes each cell's least CPU a generation over
the rounds, since on a shared machine other processes only ever add to a round's time.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from pydantic import BaseModel

from benchmarks.upstream import CUES
from relay_integrations.relay import (
    EndpointConfig,
    RelayConfig,
    RelayResult,
    RelaySwitcher,
    SwitchPolicy,
)

# plain words, no cue: the scripted answer restates the sentence, so it grows with the question
WORDS = [
    *("apple", "river", "stone", "cloud", "maple", "garden", "silver", "window", "candle"),
    *("harbor", "meadow", "pencil", "ribbon", "forest", "lantern", "marble", "orchard"),
    *("pebble", "saddle", "thistle", "valley", "willow", "anchor", "basket", "copper"),
]
CUE_SETS = {2: CUES, 1: ["Now"], 0: ["Zebra"]}  # by the switches they make a generation
LENGTHS = [4, 100, 300]  # words of the question


def question(words: int) -> str:
    body = " ".join(WORDS[i % len(WORDS)] for i in range(words))
    return f"Please describe the list {body}."


def fake_switcher(url: str, cues: list[str], stop_limit: int | None = None) -> RelaySwitcher:
    """A relay over the scripted upstream; `stop_limit`: the endpoints' max_stop_strings
    (the stop strings past it are found in the stream)."""
    return RelaySwitcher(
        RelayConfig(
            large=EndpointConfig(base_url=url, model="large", max_stop_strings=stop_limit),
            small=EndpointConfig(base_url=url, model="small", max_stop_strings=stop_limit),
            cues=cues,
            policy=SwitchPolicy(cooldown_tokens=0),
        )
    )


class Fit(BaseModel):
    """cpu = a*tokens + b*switches + c*generations, fitted by least squares (cpu: each cell's
    least over the rounds)."""

    cpu_per_token_us: float
    cpu_per_switch_ms: float
    cpu_per_generation_ms: float
    r_squared: float
    max_relative_residual: float


@dataclass
class Cell:
    """One cell of the fit (a cue set and a question length): its generations' sums."""

    cpu: float = 0.0
    wall: float = 0.0
    tokens: int = 0
    switches: int = 0
    gens: int = 0
    reqs: int = 0
    round_cpu: list[float] = field(default_factory=list)
    """CPU seconds a generation, in each round."""

    @property
    def least_cpu(self) -> float:
        """The CPU of the cell's generations at the least a generation of any round."""
        return min(self.round_cpu) * self.gens

    def add(self, cpu: float, wall: float, results: Sequence[RelayResult]) -> None:
        self.round_cpu.append(cpu / len(results))
        self.cpu += cpu
        self.wall += wall
        self.tokens += sum(x.completion_tokens for x in results)
        self.switches += sum(x.stats.switches for x in results)
        self.gens += len(results)
        self.reqs += sum(u.requests for x in results for u in x.usage.values())


async def cpu_fit(
    url: str, rounds: int, per_cell: int, stop_limit: int | None = None
) -> tuple[Fit, list[Cell]]:
    """The fit over 9 cells of `per_cell` generations each, every round, after a warm-up."""
    switchers = {k: fake_switcher(url, cues, stop_limit) for k, cues in CUE_SETS.items()}
    cells: dict[tuple[int, int], Cell] = {}
    try:
        for relay in switchers.values():  # warm-up: imports, connections, pydantic
            for words in LENGTHS:
                await relay.generate([{"role": "user", "content": question(words)}])
        for r in range(rounds):
            print(f"  round {r + 1}/{rounds}", file=sys.stderr, flush=True)
            for k, relay in switchers.items():
                for words in LENGTHS:
                    chat = [{"role": "user", "content": question(words)}]
                    cpu0, wall0 = time.process_time(), time.perf_counter()
                    results = [await relay.generate(chat) for _ in range(per_cell)]
                    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
                    cells.setdefault((k, words), Cell()).add(cpu, wall, results)
    finally:
        await asyncio.gather(*(s.aclose() for s in switchers.values()))
    return least_squares(list(cells.values())), list(cells.values())


def least_squares(rows: Sequence[Cell]) -> Fit:
    design = np.array([[c.tokens, c.switches, c.gens] for c in rows], dtype=float)
    target = np.array([c.least_cpu for c in rows], dtype=float)
    coef, *_ = np.linalg.lstsq(design, target, rcond=None)
    fitted = design @ coef
    ss_res = float(np.sum((target - fitted) ** 2))
    ss_tot = float(np.sum((target - target.mean()) ** 2))
    return Fit(
        cpu_per_token_us=float(coef[0]) * 1e6,
        cpu_per_switch_ms=float(coef[1]) * 1e3,
        cpu_per_generation_ms=float(coef[2]) * 1e3,
        r_squared=1 - ss_res / ss_tot if ss_tot else float("nan"),
        max_relative_residual=float(np.max(np.abs(target - fitted) / target)),
    )
