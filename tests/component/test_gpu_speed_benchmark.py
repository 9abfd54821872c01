"""``python -m benchmarks gpu-speed`` end to end, at its smallest: two short traces, two
generations at once, every approach (its upstream processes and ``relaygen serve`` too)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks.gpu_speed.traces import Traces
from relay_integrations.testing.qwen3_template import render_chat, tokenize

TRACE = (
    "<think>\nLet me see what is asked. Therefore, the sum is four. Now we check it once "
    "more. It is right.\n</think>\n\nThe answer is 4."
)


def benchmark(tmp_path: Path, *options: str) -> tuple[str, dict[str, Any]]:
    """The benchmark's output and its first level, at two generations at once."""
    traces = tmp_path / "traces.jsonl"
    traces.write_text("".join(json.dumps({"problem": q, "text": TRACE}) + "\n" for q in "ab"))
    out = tmp_path / "figures.json"
    done = subprocess.run(
        [
            *(sys.executable, "-m", "benchmarks", "gpu-speed", "--traces", str(traces)),
            *("--trace-count", "2", "--min-tokens", "10", "--concurrency", "2"),
            *("--generations", "2", "--json", str(out), *options),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return done.stdout, json.loads(out.read_text())["levels"][0]


def test_the_benchmark_prints_its_table_and_writes_its_figures(tmp_path: Path) -> None:
    stdout, level = benchmark(tmp_path)
    assert "| 2 |" in stdout and "relay / ideal" in stdout
    assert "machine speed: the reference workload (benchmarks/machine.py) took " in stdout
    # token ids: a generation renders each model's chat once, then its first completion
    assert level["start_requests"] == 3.0 and "/detokenize" not in level["requests"]
    assert "2 at once: a generation sends /tokenize " in stdout
    assert level["concurrency"] == 2 and level["switches"] == 1.0  # at "Therefore,"
    # the large model alone keeps to its model: prefill and a 22 ms step a token, within 5%
    assert 0.95 < level["large_alone_over_ideal"] < 1.05
    assert level["large_alone_s"] > len(tokenize(TRACE)) * 0.0218
    assert 0.9 < level["relay_over_ideal"] < 1.5 and level["serve_s"] > 0


def test_on_the_text_path_a_generation_starts_with_five_requests(tmp_path: Path) -> None:
    """Each chat rendered (/tokenize) and detokenized, then the first completion."""
    _, level = benchmark(tmp_path, "--prompt-path", "text", "--skip-serve")
    assert level["start_requests"] == 5.0
    assert level["requests"]["/detokenize"] == level["requests"]["/tokenize"] == 2.0
    assert level["serve_s"] is None


def test_the_traces_upstream_writes_the_rest_of_the_trace_and_nothing_past_it() -> None:
    """A prompt on the trace gets the rest of it; one a cue's comma past it (a hand-off
    opened ahead that the trace does not make) gets nothing; one further off is an error."""
    traces = Traces(questions=["What is 2 + 2?"], texts=[TRACE])
    (message,) = traces.messages(0)
    prompt = render_chat([message]) + "<think>\nLet me see what is asked."
    assert traces.respond(prompt, {}) == TRACE[len("<think>\nLet me see what is asked.") :]
    assert (
        traces.respond(render_chat([message]) + "<think>\nLet me see what is asked. So,", {}) == ""
    )
    with pytest.raises(ValueError, match="left the trace after 24 characters"):
        traces.respond(render_chat([message]) + "<think>\nLet me see what was said, and then", {})
