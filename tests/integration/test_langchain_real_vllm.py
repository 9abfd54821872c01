"""RelayChatModel on the real vLLM servers (tiny random Qwen3 models, outputs forced by
structured outputs): the reasoning/answer split, usage, streaming order, a forced tool call
and a structured answer constrained by the server itself."""

from __future__ import annotations

import asyncio
from typing import Literal

import pytest
from langchain_core.messages import AIMessageChunk
from langchain_core.messages.ai import add_ai_message_chunks
from pydantic import BaseModel

from relay_integrations.langchain import RelayChatModel
from relay_integrations.testing import forcing

from .conftest import Server, qwen_relay_fields

pytestmark = pytest.mark.vllm

REASONING = "Let me add them. Therefore, the sum is 4. Now we check it."
TRACE = f"<think>\n{REASONING}\n</think>\n\nThe answer is 4."


def relay_model(large: Server, small: Server, **fields: object) -> RelayChatModel:
    return RelayChatModel(**qwen_relay_fields(large, small, **fields))


def test_invoke_splits_reasoning_from_the_answer_and_sums_usage(
    qwen_large: Server, qwen_small: Server
) -> None:
    long_question = [  # over one 128-token cache block, so later segments hit the cache
        ("system", "You are a careful assistant who checks every step. " * 20),
        ("user", "What is 2 + 2?"),
    ]
    message = relay_model(qwen_large, qwen_small, request_hook=forcing(TRACE)).invoke(long_question)
    assert message.content == "The answer is 4."
    assert message.additional_kwargs["reasoning_content"] == REASONING
    relay = message.response_metadata["relay"]
    assert relay["switches"] == 2
    assert message.response_metadata["finish_reason"] == "stop"
    assert message.response_metadata["model_name"] == "qwen3-large+qwen3-small"
    usage = message.usage_metadata
    assert usage is not None
    per_model = relay["usage"].values()
    assert usage["output_tokens"] == sum(u["completion_tokens"] for u in per_model)
    assert usage["input_tokens"] == sum(u["prompt_tokens"] for u in per_model)
    assert usage["input_token_details"]["cache_read"] == sum(u["cached_tokens"] for u in per_model)
    assert usage["input_token_details"]["cache_read"] > 0  # later segments reuse the prefix
    assert 0 < usage["output_token_details"]["reasoning"] < usage["output_tokens"]
    assert [b["type"] for b in message.content_blocks] == ["reasoning", "text"]


def test_stream_sends_reasoning_then_answer_then_usage_once(
    qwen_large: Server, qwen_small: Server
) -> None:
    chunks = list(
        relay_model(qwen_large, qwen_small, request_hook=forcing(TRACE)).stream("What is 2 + 2?")
    )
    kinds = []
    for chunk in chunks:
        if chunk.additional_kwargs.get("reasoning_content"):
            kinds.append("reasoning")
        elif chunk.content:
            kinds.append("text")
        elif chunk.usage_metadata:
            kinds.append("usage")
    assert kinds.index("text") > max(i for i, k in enumerate(kinds) if k == "reasoning")
    assert kinds[-1] == "usage" and kinds.count("usage") == 1
    assert all(isinstance(chunk, AIMessageChunk) for chunk in chunks)
    whole = add_ai_message_chunks(chunks[0], *chunks[1:])
    assert whole.content == "The answer is 4."
    assert whole.additional_kwargs["reasoning_content"] == REASONING
    assert [b["type"] for b in whole.content_blocks] == ["reasoning", "text"]


def test_a_forced_tool_call_is_constrained_by_the_server(
    qwen_large: Server, qwen_small: Server
) -> None:
    """Only the reasoning is forced: the call's JSON comes from vLLM structured outputs."""

    def set_light(on: bool) -> str:
        """Switch the light on or off."""
        return "done"

    reasoning_only = forcing(f"<think>\n{REASONING}\n</think>\n\n", answer=False)
    llm = relay_model(qwen_large, qwen_small, request_hook=reasoning_only).bind_tools(
        [set_light], tool_choice="set_light"
    )
    message = llm.invoke("Turn the light on.")
    assert message.invalid_tool_calls == []
    (call,) = message.tool_calls
    assert call["name"] == "set_light"
    assert set(call["args"]) == {"on"} and isinstance(call["args"]["on"], bool)
    assert message.response_metadata["finish_reason"] == "tool_calls"


def test_tool_calls_in_the_answer_are_parsed_and_malformed_ones_kept(
    qwen_large: Server, qwen_small: Server
) -> None:
    def get_weather(city: str) -> str:
        """Weather in a city."""
        return "sunny"

    good = (
        f"<think>\n{REASONING}\n</think>\n\nChecking.\n<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    )
    llm = relay_model(qwen_large, qwen_small, request_hook=forcing(good))
    message = llm.bind_tools([get_weather]).invoke("Weather in Paris?")
    assert message.content == "Checking."
    assert [(c["name"], c["args"]) for c in message.tool_calls] == [
        ("get_weather", {"city": "Paris"})
    ]
    bad = f'<think>\n{REASONING}\n</think>\n\n<tool_call>\n{{"name": "get_weather", "arg\n</tool_call>'
    llm = relay_model(qwen_large, qwen_small, request_hook=forcing(bad))
    message = llm.bind_tools([get_weather]).invoke("Weather in Paris?")
    assert message.tool_calls == []
    (invalid,) = message.invalid_tool_calls
    assert invalid["error"] and invalid["args"] == '{"name": "get_weather", "arg'


class Verdict(BaseModel):
    correct: bool
    grade: Literal["A", "B", "C"]


def test_structured_output_is_valid_by_construction(qwen_large: Server, qwen_small: Server) -> None:
    reasoning_only = forcing(f"<think>\n{REASONING}\n</think>\n\n", answer=False)
    llm = relay_model(qwen_large, qwen_small, request_hook=reasoning_only)
    out = llm.with_structured_output(Verdict, include_raw=True).invoke("Grade it.")
    assert isinstance(out, dict)
    assert out["parsing_error"] is None
    assert isinstance(out["parsed"], Verdict)
    assert out["raw"].additional_kwargs["reasoning_content"] == REASONING


@pytest.mark.blocks_loop  # what it tests: a sync call made inside a running loop
async def test_sync_calls_inside_a_running_event_loop(
    qwen_large: Server, qwen_small: Server
) -> None:
    llm = relay_model(qwen_large, qwen_small, request_hook=forcing(TRACE))
    message = llm.invoke("What is 2 + 2?")  # no clash with the running loop
    assert message.content == "The answer is 4."
    messages = await llm.abatch(["What is 2 + 2?", "And 2 + 2?"])
    assert [m.content for m in messages] == ["The answer is 4."] * 2
    assert await asyncio.to_thread(llm.get_num_tokens, "hello world") == 2


def test_every_streamed_chunk_names_the_model_that_wrote_it(
    qwen_large: Server, qwen_small: Server
) -> None:
    """Runs of chunks by one model are the relay's segments with visible text, and hold the
    whole trace between them."""
    model = relay_model(qwen_large, qwen_small, request_hook=forcing(TRACE))
    chunks = [c for c in model.stream("What is 2 + 2?") if isinstance(c, AIMessageChunk)]
    runs: list[tuple[str, str]] = []
    for chunk in chunks:
        [writer] = chunk.response_metadata["relay_models"]
        text = str(chunk.additional_kwargs.get("reasoning_content", "")) + chunk.text
        if not text:
            continue
        if runs and runs[-1][0] == writer:
            runs[-1] = (writer, runs[-1][1] + text)
        else:
            runs.append((writer, text))
    # the cues hand the small model "the sum is 4." and "we check it."; it writes the answer
    assert [writer for writer, _ in runs] == ["large", "small", "large", "small"]
    assert runs[1][1].strip() == "the sum is 4."
    assert runs[3][1].strip() == "we check it.The answer is 4."  # reasoning, then answer
    assert "".join(text for _, text in runs) == REASONING + "The answer is 4."
    segments = chunks[-1].response_metadata["relay"]["segments"]  # the large model's
    assert [s["model"] for s in segments] == ["large", "small", "large", "small", "large", "small"]
    assert segments[4]["ended_by"] == "end_of_reasoning"  # its "</think>": nothing to show
