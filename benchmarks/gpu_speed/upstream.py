"""One model at GPU speed, in a process of its own: ``python -m benchmarks.gpu_speed.upstream``.

The scripted vLLM serving one model (``--name``) with the measured step times of
``--model`` in ``--figures`` (:class:`~relay_integrations.testing.gpu_speed.LatencyModel`),
writing the traces of ``--traces``. It prints its base URL once it listens, and when
terminated, one JSON line: its engine's steps and how late they ran (``lag_ms``), which says
whether this process kept up with the model it stands for, the requests it answered by route
and the chats it rendered (``/tokenize`` of messages)::

    proc, url = start(UpstreamSpec(...), log)
    ...
    engine = stop(proc)   # {"steps": 1234, "lag_ms": {"p50": 0.1, "p99": 2.3, "max": 9.0},
                          #  "requests": {"/tokenize": 8, "/v1/completions": 24}, "renders": 8}
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from benchmarks.upstream import launch
from benchmarks.upstream import stop as stop_process
from relay_integrations.jobs.statistics import percentile
from relay_integrations.testing.gpu_speed import Engine, LatencyModel
from relay_integrations.testing.scripted_vllm import ScriptedModel, ScriptedVLLM

from .traces import load_traces

WINDOW = 32768
"""The served context window (the traces are far shorter)."""


@dataclass(frozen=True)
class UpstreamSpec:
    """What one upstream process serves."""

    name: str  # the served model name: "large" or "small"
    figures: Path
    model: str  # the figures' model: "qwen3-32b"
    traces: Path
    trace_count: int
    min_tokens: int
    step_overhead_ms: float = 0.0

    def arguments(self) -> list[str]:
        return [
            *("--name", self.name, "--figures", str(self.figures), "--model", self.model),
            *("--traces", str(self.traces), "--trace-count", str(self.trace_count)),
            *("--min-tokens", str(self.min_tokens)),
            *("--step-overhead-ms", str(self.step_overhead_ms)),
        ]


def engine_report(
    engine: Engine | None, requests: Mapping[str, int], renders: int
) -> dict[str, Any]:
    """The engine's steps and lag (ms), the requests by route and the chats rendered, as the
    JSON line printed at exit."""
    lag = [x * 1e3 for x in engine.lag] if engine else []
    return {
        "steps": engine.steps if engine else 0,
        "lag_ms": {
            "p50": round(percentile(lag, 0.5), 3) if lag else 0.0,
            "p99": round(percentile(lag, 0.99), 3) if lag else 0.0,
            "max": round(max(lag), 3) if lag else 0.0,
        },
        "requests": dict(requests),
        "renders": renders,
    }


def serve(spec: UpstreamSpec) -> None:
    traces = load_traces(spec.traces, spec.trace_count, spec.min_tokens)
    latency = LatencyModel.from_figures(
        spec.figures, spec.model, step_overhead_ms=spec.step_overhead_ms
    )
    model = ScriptedModel(
        spec.name, "", respond=traces.respond, latency=latency, max_model_len=WINDOW, memory=0
    )

    async def run() -> None:
        stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, stopping.set)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the benchmark stops it, also on ^C
        async with ScriptedVLLM(model) as server:
            print(server.base_url, flush=True)
            await stopping.wait()
            report = engine_report(server.engines.get(spec.name), server.routes, model.renders)
            print(json.dumps(report), flush=True)

    asyncio.run(run())


def start(spec: UpstreamSpec, log: IO[bytes]) -> tuple[subprocess.Popen[bytes], str]:
    """Run one upstream; its process and base URL once it listens."""
    return launch([sys.executable, "-m", "benchmarks.gpu_speed.upstream", *spec.arguments()], log)


def stop(proc: subprocess.Popen[bytes]) -> dict[str, Any]:
    """Stop the upstream; its engine report."""
    stop_process(proc)
    assert proc.stdout is not None
    lines = proc.stdout.read().decode().strip().splitlines()
    return dict(json.loads(lines[-1])) if lines else engine_report(None, {}, 0)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="one scripted model at GPU speed")
    parser.add_argument("--name", required=True)
    parser.add_argument("--figures", type=Path, required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--traces", type=Path, required=True)
    parser.add_argument("--trace-count", type=int, required=True)
    parser.add_argument("--min-tokens", type=int, required=True)
    parser.add_argument("--step-overhead-ms", type=float, default=0.0)
    args = parser.parse_args(argv)
    serve(
        UpstreamSpec(
            args.name,
            args.figures,
            args.model,
            args.traces,
            args.trace_count,
            args.min_tokens,
            args.step_overhead_ms,
        )
    )


if __name__ == "__main__":
    main()
