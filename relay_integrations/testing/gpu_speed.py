"""Served models at GPU speed, from measured step times, for the scripted vLLM.

A :class:`LatencyModel` holds what one model costs on its accelerator: the time of one
decoding step by the number of requests in the batch, and the time to append k new tokens to
a cached context (what a request's uncached prompt costs, with prefix caching). An
:class:`Engine` runs a scripted model on it in real time, as vLLM's scheduler would:
continuous batching, where every running request gets one token a step and a step takes the
measured time for the current batch, a new request's uncached prompt lengthening the step
that writes its first token::

    latency = LatencyModel.from_figures("h200-qwen3-batch-sweep-ctx1k.json", "qwen3-32b")
    latency.step_seconds(16)      # one step of 16 running requests: 0.0243
    latency.prefill_seconds(40)   # what 40 uncached prompt tokens add to their first step
    large = ScriptedModel("large", trace, latency=latency)

On a :class:`VirtualClockLoop` the same engine runs with no time passing but the steps', so
requests that cost nothing between their tokens give the ideal timing of a workload.

The figures file has the shape of the measured H200 figures: ``{"rows": [{"model": ...,
"batch": 1, "decode_ms": 21.9, "extend_8_ms": 25.2, "extend_32_ms": ..., ...}, ...]}``, one
row per model and batch size, the ``extend_<k>_ms`` columns (k tokens appended at batch 1)
on the batch-1 rows. They are kernel times: vLLM adds its scheduler's CPU time per step
(``step_overhead_ms``).
"""

from __future__ import annotations

import asyncio
import bisect
import json
import re
import selectors
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

_EXTEND = re.compile(r"extend_(\d+)_ms")
T = TypeVar("T")


class LatencyModel(BaseModel):
    """One model's time per decoding step by batch size, and per appended prompt tokens."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    decode_ms: dict[int, float] = Field(
        description="Milliseconds of one decoding step, by the number of running requests"
    )
    append_ms: dict[int, float] = Field(
        default_factory=dict,
        description="Milliseconds to append k tokens to a cached context at batch 1, by k",
    )
    step_overhead_ms: float = Field(
        default=0.0, ge=0, description="Fixed time added to every step (a scheduler's CPU)"
    )

    @field_validator("decode_ms")
    @classmethod
    def _some_batch(cls, decode: dict[int, float]) -> dict[int, float]:
        if not decode:
            raise ValueError("decode_ms needs the step time of at least one batch size")
        if min(decode) < 1 or min(decode.values()) <= 0:
            raise ValueError("decode_ms maps batch sizes (>= 1) to positive milliseconds")
        return decode

    @classmethod
    def from_figures(
        cls, path: str | Path, model: str, *, step_overhead_ms: float = 0.0
    ) -> LatencyModel:
        """The latency of `model` in a figures file (see the module docstring)."""
        rows = [row for row in json.loads(Path(path).read_text())["rows"] if row["model"] == model]
        if not rows:
            raise ValueError(f"{path} has no rows for model {model!r}")
        append = {
            int(match[1]): float(value)
            for row in rows
            if row["batch"] == 1
            for key, value in row.items()
            if (match := _EXTEND.fullmatch(key))
        }
        return cls(
            decode_ms={int(row["batch"]): float(row["decode_ms"]) for row in rows},
            append_ms=append,
            step_overhead_ms=step_overhead_ms,
        )

    def step_seconds(self, batch: int) -> float:
        """One decoding step of `batch` running requests: the measured time, linear between
        the measured batch sizes and beyond the largest, plus the fixed overhead."""
        return (_interpolate(sorted(self.decode_ms.items()), batch) + self.step_overhead_ms) / 1e3

    def prefill_seconds(self, tokens: int) -> float:
        """What appending `tokens` uncached prompt tokens adds to the step that writes the
        request's first token: the append time beyond a one-token step (appending one token
        is a decoding step), linear between the measured counts and beyond the largest."""
        if tokens <= 1 or not self.append_ms:
            return 0.0
        one_token = _interpolate(sorted(self.decode_ms.items()), 1)
        points = [(1, one_token), *sorted(self.append_ms.items())]
        return max(_interpolate(points, tokens) - one_token, 0.0) / 1e3


def _interpolate(points: Sequence[tuple[int, float]], x: float) -> float:
    """The piecewise-linear function through `points` (sorted by x) at `x`: the first value
    below them, the last segment's slope beyond them."""
    xs = [p[0] for p in points]
    if len(points) == 1 or x <= xs[0]:
        return points[0][1]
    at = min(bisect.bisect_left(xs, x), len(points) - 1)
    (x0, y0), (x1, y1) = points[at - 1], points[at]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


class EngineRequest:
    """One request's place in an :class:`Engine`: the tokens its steps have written."""

    def __init__(self, uncached: int) -> None:
        self.uncached = uncached
        self.written = 0
        self.taken = 0
        self.closed = False
        self.last = False
        self._ready = asyncio.Event()

    async def take_token(self, last: bool = False) -> bool:
        """Wait for this request's next token (the end of the step that writes it); whether
        more are written already (the reader fell behind the engine). `last`: this token
        ends the request (a stop string, its token limit), so the engine leaves it out of
        the next step, as vLLM does with a request it finished."""
        self.last = last
        while self.written == self.taken:
            self._ready.clear()
            await self._ready.wait()
        self.taken += 1
        return self.written > self.taken

    def _wrote(self) -> None:
        self.written += 1
        self.closed = self.last
        self._ready.set()


class Engine:
    """A model's continuous batching in real time, on the running event loop.

    A request joins at the next step after it arrives. A step takes
    :meth:`LatencyModel.step_seconds` for its batch, plus :meth:`LatencyModel.prefill_seconds`
    of each request it starts; at its end every request in it has one more token. Steps follow
    one another on a fixed schedule while requests run, so a step that starts late (this
    process was busy) is shortened to keep to it; ``lag`` records by how much each step
    ended late, which says whether the engine kept up with its model.
    """

    def __init__(self, latency: LatencyModel) -> None:
        self.latency = latency
        self.steps = 0
        self.lag: list[float] = []
        self._running: list[EngineRequest] = []
        self._arrived: list[EngineRequest] = []
        self._work = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def admit(self, uncached: int) -> EngineRequest:
        """A new request with `uncached` prompt tokens to prefill; it runs until closed."""
        request = EngineRequest(uncached)
        self._arrived.append(request)
        self._work.set()
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())
        return request

    @staticmethod
    def close(request: EngineRequest) -> None:
        """The request is done (its last token, a stop string, a closed stream)."""
        request.closed = True

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time()
        while True:
            new = [r for r in self._arrived if not r.closed]
            self._arrived.clear()
            batch = [r for r in self._running if not r.closed] + new
            if not batch:
                self._running = []
                self._work.clear()
                await self._work.wait()
                deadline = loop.time()  # idle until now: the schedule starts again
                continue
            deadline += self.latency.step_seconds(len(batch))
            deadline += sum(self.latency.prefill_seconds(r.uncached) for r in new)
            await asyncio.sleep(deadline - loop.time())
            self.lag.append(max(loop.time() - deadline, 0.0))
            self.steps += 1
            for request in batch:
                if not request.closed:
                    request._wrote()
            self._running = batch


class VirtualClockLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock moves only when it would wait, and then by exactly the wait:
    the time of what runs on it is the time it asks to sleep, whatever this machine does::

        VirtualClockLoop.run(main())   # main()'s loop.time() is virtual seconds
    """

    def __init__(self) -> None:
        self.now = 0.0
        super().__init__(_AdvancingSelector(self))

    def time(self) -> float:
        return self.now

    @classmethod
    def run(cls, main: Coroutine[Any, Any, T]) -> T:
        """Run `main` on a new virtual-clock loop, then close the loop."""
        loop = cls()
        try:
            return loop.run_until_complete(main)
        finally:
            loop.close()


class _AdvancingSelector(selectors.DefaultSelector):
    def __init__(self, loop: VirtualClockLoop) -> None:
        super().__init__()
        self._loop = loop

    def select(self, timeout: float | None = None) -> list[Any]:
        if timeout:
            self._loop.now += timeout
        return super().select(0)
