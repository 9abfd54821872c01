"""Trace writing against the scripted fake server: a failing endpoint loses no finished trace."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from relay_integrations.calibration import ProblemSet, TraceFile, write_traces
from relay_integrations.relay import EndpointConfig, SamplingConfig
from relay_integrations.testing.scripted_vllm import Fault, ScriptedModel, ScriptedVLLM
from relay_integrations.upstream.endpoint import Endpoint, UpstreamFailure
from relay_integrations.upstream.rendering import ServerChatTemplate

TRACE = "<think>\nSome reasoning. Therefore, done.\n</think>\n\nAnswer."


async def test_a_failing_endpoint_keeps_the_finished_traces_and_the_rerun_resumes(
    tmp_path: Path,
) -> None:
    path = tmp_path / "problems.jsonl"
    path.write_text("".join(json.dumps({"problem": f"q{i}"}) + "\n" for i in range(3)))
    problems = ProblemSet.load(path)
    out = TraceFile(tmp_path / "traces.jsonl")
    large = ScriptedModel("large", TRACE, faults=[Fault(), Fault(status=400)])
    async with ScriptedVLLM(large) as server:
        endpoint = Endpoint(EndpointConfig(base_url=server.base_url, model="large"), "large")
        options = {
            "samples": 1,
            "sampling": SamplingConfig(max_tokens=64),
            "concurrency": 1,
        }
        with pytest.raises(UpstreamFailure, match="large endpoint failed"):
            await write_traces(endpoint, ServerChatTemplate(), problems, out, **options)  # type: ignore[arg-type]
        assert [t.id for t in out.read()] == ["0/0"]
        assert out.read()[0].reasoning == "Some reasoning. Therefore, done."
        assert len(large.requests) == 2

        traces = await write_traces(endpoint, ServerChatTemplate(), problems, out, **options)  # type: ignore[arg-type]
        await endpoint.aclose()
    assert [t.id for t in traces] == ["0/0", "1/0", "2/0"]
    assert len(large.requests) == 4  # only the two missing traces were asked for
    assert all(r["stop"] == ["</think>"] for r in large.requests)
    assert all(r["max_tokens"] == 64 for r in large.requests)


async def test_each_problem_is_rendered_once_however_many_samples(tmp_path: Path) -> None:
    from relay_integrations.calibration import Calibrator

    path = tmp_path / "problems.jsonl"
    path.write_text("".join(json.dumps({"problem": f"q{i}"}) + "\n" for i in range(2)))
    large, small = ScriptedModel("large", TRACE), ScriptedModel("small", TRACE)
    async with ScriptedVLLM(large, small) as server:
        calibrator = Calibrator(
            large=EndpointConfig(base_url=server.base_url, model="large"),
            small=EndpointConfig(base_url=server.base_url, model="small"),
            sampling=SamplingConfig(max_tokens=64),
            show_progress=False,
        )
        async with calibrator:
            traces = await calibrator.write_traces(
                ProblemSet.load(path), TraceFile(tmp_path / "t.jsonl"), samples=3
            )
    assert len(traces) == 6 and len(large.requests) == 6
    assert large.renders == 2  # one chat-template render per problem, not per sample
