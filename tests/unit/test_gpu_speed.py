"""The GPU-speed latency model and its engine, against timings computed by hand.

The engine runs on an event loop whose clock is virtual (each wait advances it by exactly the
time asked), so every token's time is exact and the test does not depend on this machine.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest

from benchmarks.gpu_speed.ideal import Turn, ideal_walls
from relay_integrations.testing.gpu_speed import (
    Engine,
    EngineRequest,
    LatencyModel,
    VirtualClockLoop,
)
from relay_integrations.testing.scripted_vllm import CACHE_BLOCK, ScriptedModel

T = TypeVar("T")

# a step of 1 request 10 ms, of 4 requests 16 ms; appending 8 tokens 14 ms, 32 tokens 20 ms
LATENCY = LatencyModel(decode_ms={1: 10.0, 4: 16.0}, append_ms={8: 14.0, 32: 20.0})


def on_virtual_clock(main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    return VirtualClockLoop.run(main())


async def token_times(request: EngineRequest, tokens: int) -> list[float]:
    """The clock (ms) at each of the request's next `tokens` tokens, the last one ending it."""
    loop = asyncio.get_running_loop()
    times = []
    for index in range(tokens):
        await request.take_token(last=index == tokens - 1)
        times.append(round(loop.time() * 1e3, 6))
    return times


def test_step_and_prefill_times_interpolate_the_measured_figures() -> None:
    assert LATENCY.step_seconds(1) == pytest.approx(0.010)
    assert LATENCY.step_seconds(2) == pytest.approx(0.012)  # a third of the way to 16
    assert LATENCY.step_seconds(7) == pytest.approx(0.022)  # the last slope, 2 ms a request
    assert LATENCY.prefill_seconds(1) == 0.0  # one new token is a decoding step
    assert LATENCY.prefill_seconds(8) == pytest.approx(0.004)  # 14 - 10
    assert LATENCY.prefill_seconds(20) == pytest.approx(0.007)  # 17 - 10
    assert LATENCY.prefill_seconds(40) == pytest.approx(0.012)  # 22 - 10: 0.25 ms a token on
    overhead = LATENCY.model_copy(update={"step_overhead_ms": 1.5})
    assert overhead.step_seconds(1) == pytest.approx(0.0115)


def test_one_request_pays_its_prefill_once_then_a_step_a_token() -> None:
    async def main() -> list[float]:
        engine = Engine(LATENCY)
        times = await token_times(engine.admit(uncached=40), tokens=4)
        await engine.aclose()
        return times

    assert on_virtual_clock(main) == [22.0, 32.0, 42.0, 52.0]  # 10 + 12 of prefill, then 10


def test_requests_in_one_batch_share_each_step_and_a_newcomer_joins_the_next() -> None:
    async def main() -> tuple[list[float], list[float], list[float]]:
        engine = Engine(LATENCY)
        first = asyncio.create_task(token_times(engine.admit(uncached=1), tokens=4))
        second = asyncio.create_task(token_times(engine.admit(uncached=1), tokens=2))
        await asyncio.sleep(0.005)  # mid-step: the third request waits for the next step
        third = asyncio.create_task(token_times(engine.admit(uncached=8), tokens=2))
        times = await asyncio.gather(first, second, third)
        await engine.aclose()
        return times

    first, second, third = on_virtual_clock(main)
    # steps: 2 requests 12 ms (0-12); 3 requests 14 ms + 4 ms of prefill (12-30); then the
    # second has left: 2 requests, 12 ms (30-42); then the third has left: 1 request, 10 ms
    assert second == [12.0, 30.0]
    assert third == [30.0, 42.0]
    assert first == [12.0, 30.0, 42.0, 52.0]


def test_an_engine_that_runs_late_keeps_to_its_schedule() -> None:
    """Steps that start late (the process was busy) are shortened: the tokens catch up, and
    the engine's lag says by how much it was behind."""

    async def main() -> tuple[list[float], list[float]]:
        engine = Engine(LATENCY)
        request = engine.admit(uncached=1)
        await request.take_token()  # at 10 ms
        loop = asyncio.get_running_loop()
        assert isinstance(loop, VirtualClockLoop)
        loop.now += 0.025  # busy for 25 ms: the steps due at 20 and 30 ms run at 35
        times = await token_times(request, tokens=3)
        await engine.aclose()
        return times, engine.lag

    times, lag = on_virtual_clock(main)
    assert times == [35.0, 35.0, 40.0]
    assert [round(x * 1e3, 6) for x in lag] == [0.0, 15.0, 5.0, 0.0]


def test_a_reader_behind_its_engine_finds_its_tokens_waiting() -> None:
    """The scripted server merges such tokens into one chunk, as vLLM does for a slow client."""

    async def main() -> list[bool]:
        engine = Engine(LATENCY)
        request = engine.admit(uncached=1)
        await request.take_token()  # at 10 ms
        await asyncio.sleep(0.025)  # the reader is busy; the engine writes at 20 and 30 ms
        behind = [await request.take_token(), await request.take_token(last=True)]
        await engine.aclose()
        return behind

    assert on_virtual_clock(main) == [True, False]


def test_figures_load_from_the_measured_shape(tmp_path: Path) -> None:
    figures = tmp_path / "figures.json"
    rows = [
        {"model": "big", "batch": 1, "decode_ms": 20.0, "extend_8_ms": 24.0, "extend_32_ms": 26},
        {"model": "big", "batch": 16, "decode_ms": 25.0},
        {"model": "tiny", "batch": 1, "decode_ms": 3.0},
    ]
    figures.write_text(json.dumps({"info": {"device": "X"}, "rows": rows}))
    big = LatencyModel.from_figures(figures, "big", step_overhead_ms=1.0)
    assert big.decode_ms == {1: 20.0, 16: 25.0} and big.append_ms == {8: 24.0, 32: 26.0}
    assert big.step_seconds(16) == pytest.approx(0.026)
    assert LatencyModel.from_figures(figures, "tiny").prefill_seconds(100) == 0.0
    with pytest.raises(ValueError, match="has no rows for model 'huge'"):
        LatencyModel.from_figures(figures, "huge")
    with pytest.raises(ValueError, match="at least one batch size"):
        LatencyModel(decode_ms={})


def test_a_prompt_that_extends_a_seen_one_is_cached_up_to_its_new_tokens() -> None:
    """Prompt and output are cached, in whole blocks: the next request of a generation pays
    only for the text this model has not seen (its engine's prefill gets that count)."""
    model = ScriptedModel("large", "", latency=LATENCY)
    prompt = [f"p{i}" for i in range(40)]
    output = [f"o{i}" for i in range(30)]
    assert model.cached_tokens(prompt) == 0
    model.remember(prompt + output)
    handed_back = prompt + output + [f"s{i}" for i in range(12)]  # the other model's sentence
    cached = model.cached_tokens(handed_back)
    assert cached == 64 == (40 + 30) // CACHE_BLOCK * CACHE_BLOCK
    assert len(handed_back) - cached == 18
    assert model.cached_tokens(["x", *handed_back]) == 0  # a prefix cache: from the start


def test_the_ideal_of_a_workload_is_its_turns_on_the_engines_with_no_client() -> None:
    """The benchmark's ideal: each turn arrives as the previous one ends."""
    small = LatencyModel(decode_ms={1: 2.0, 4: 2.6})
    relay = [Turn("large", 40, 3), Turn("small", 8, 2), Turn("large", 1, 1)]
    alone = [Turn("large", 40, 6)]
    # large: 22 + 10 + 10 (prefill 12 ms, then 10 a step); small: 2 + 2 (no append figures);
    # large again: 10
    assert ideal_walls({"large": LATENCY, "small": small}, [relay], 1) == pytest.approx([0.056])
    # two at a time share the steps: 12 ms a step of 2, the first with both prefills (36 ms);
    # one at a time, each alone
    assert ideal_walls({"large": LATENCY}, [alone, alone], 2) == pytest.approx([0.096] * 2)
    assert ideal_walls({"large": LATENCY}, [alone, alone], 1) == pytest.approx([0.072] * 2)
