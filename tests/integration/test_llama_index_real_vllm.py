"""RelayLLM on the real vLLM servers (tiny random Qwen3 models, outputs forced by structured
outputs): chat and completion, streaming order, thinking kept out of the content, a forced tool
call, and structured prediction constrained by the server itself."""

from __future__ import annotations

import asyncio
from typing import Literal

import pytest
from llama_index.core.base.llms.types import ChatMessage, TextBlock, ThinkingBlock
from llama_index.core.tools import FunctionTool
from pydantic import BaseModel

from relay_integrations.llama_index import RelayLLM
from relay_integrations.testing import forcing

from .conftest import Server, qwen_relay_fields

pytestmark = pytest.mark.vllm

REASONING = "Let me add them. Therefore, the sum is 4. Now we check it."
TRACE = f"<think>\n{REASONING}\n</think>\n\nThe answer is 4."
QUESTION = [ChatMessage(role="user", content="What is 2 + 2?")]


def relay_llm(large: Server, small: Server, trace: str = TRACE, answer: bool = True) -> RelayLLM:
    return RelayLLM(**qwen_relay_fields(large, small, request_hook=forcing(trace, answer=answer)))


def test_chat_keeps_thinking_out_of_the_content(qwen_large: Server, qwen_small: Server) -> None:
    response = relay_llm(qwen_large, qwen_small).chat(QUESTION)
    assert response.message.content == "The answer is 4."
    thinking, text = response.message.blocks
    assert isinstance(thinking, ThinkingBlock) and thinking.content == REASONING
    assert isinstance(text, TextBlock)
    usage = response.additional_kwargs
    assert usage["completion_tokens"] == sum(
        u["completion_tokens"] for u in usage["relay"]["usage"].values()
    )
    assert 0 < usage["reasoning_tokens"] < usage["completion_tokens"]
    assert usage["relay"]["switches"] == 2


def test_metadata_is_honest(qwen_large: Server, qwen_small: Server) -> None:
    metadata = relay_llm(qwen_large, qwen_small).metadata
    assert metadata.context_window == 4096  # the server's max_model_len
    assert metadata.is_chat_model and metadata.is_function_calling_model
    assert metadata.num_output == 300  # the budget: under half the window
    assert metadata.model_name == "qwen3-large+qwen3-small"


def test_stream_chat_sends_thinking_then_answer_deltas(
    qwen_large: Server, qwen_small: Server
) -> None:
    responses = list(relay_llm(qwen_large, qwen_small).stream_chat(QUESTION))
    thinking = [r.additional_kwargs.get("thinking_delta") for r in responses]
    deltas = [r.delta for r in responses]
    last_thinking = max(i for i, t in enumerate(thinking) if t)
    first_answer = min(i for i, d in enumerate(deltas) if d)
    assert last_thinking < first_answer
    assert "".join(t for t in thinking if t) == REASONING
    assert "".join(d for d in deltas if d) == "The answer is 4."
    assert responses[-1].message.content == "The answer is 4."
    assert responses[-1].additional_kwargs["relay"]["switches"] == 2


@pytest.mark.blocks_loop  # the sync complete() beside the async twins, inside the loop on purpose
async def test_completion_and_async_twins(qwen_large: Server, qwen_small: Server) -> None:
    llm = relay_llm(qwen_large, qwen_small)
    assert (await llm.acomplete("What is 2 + 2?")).text == "The answer is 4."
    assert llm.complete("What is 2 + 2?").text == "The answer is 4."  # inside a running loop
    stream = await llm.astream_complete("What is 2 + 2?")
    assert "".join([r.delta or "" async for r in stream]) == "The answer is 4."
    chats = await asyncio.gather(llm.achat(QUESTION), llm.achat(QUESTION))
    assert [c.message.content for c in chats] == ["The answer is 4."] * 2


def test_a_required_tool_call_is_constrained_by_the_server(
    qwen_large: Server, qwen_small: Server
) -> None:
    def set_light(on: bool) -> str:
        """Switch the light on or off."""
        return "done"

    llm = relay_llm(qwen_large, qwen_small, f"<think>\n{REASONING}\n</think>\n\n", answer=False)
    response = llm.chat_with_tools(
        [FunctionTool.from_defaults(set_light)], user_msg="Turn the light on.", tool_required=True
    )
    (call,) = llm.get_tool_calls_from_response(response)
    assert call.tool_name == "set_light"
    assert set(call.tool_kwargs) == {"on"} and isinstance(call.tool_kwargs["on"], bool)


class Verdict(BaseModel):
    correct: bool
    grade: Literal["A", "B", "C"]


def test_structured_predict_is_valid_by_construction(
    qwen_large: Server, qwen_small: Server
) -> None:
    from llama_index.core.prompts import PromptTemplate

    llm = relay_llm(qwen_large, qwen_small, f"<think>\n{REASONING}\n</think>\n\n", answer=False)
    verdict = llm.structured_predict(Verdict, PromptTemplate("Grade this: {text}"), text="2+2=4")
    assert isinstance(verdict, Verdict)


def _set_fields(partial: BaseModel) -> dict[str, object]:
    return {k: v for k, v in partial.model_dump().items() if v is not None}


def assert_grows_to(partials: list[BaseModel], final: Verdict) -> None:
    """The fields set never fall, never disagree with the final object (the grade, a
    one-letter string, shows whole), and grow from none to both; the last partial is the
    object. (A partial with one field is usual but not certain: vLLM merges the tokens of
    steps its API server has not sent yet into one chunk on a busy machine, and one chunk may
    then complete both fields; the scripted test checks the one-at-a-time growth.)"""
    assert partials[-1] == final and isinstance(partials[-1], Verdict)
    counts = [len(_set_fields(p)) for p in partials]
    assert counts == sorted(counts) and {0, 2} <= set(counts), counts
    for partial in partials:
        fields = _set_fields(partial)
        assert all(fields[k] in ("", getattr(final, k)) for k in fields), fields


@pytest.mark.blocks_loop  # the sync entry points beside the async ones, inside the loop
async def test_streamed_structured_output_grows_to_the_predicted_object(
    qwen_large: Server, qwen_small: Server
) -> None:
    """Greedy decoding (temperature 0) with the reasoning forced: the streamed object, built
    while the server writes the forced call, ends as the non-streamed one."""
    from llama_index.core.prompts import PromptTemplate

    trace = f"<think>\n{REASONING}\n</think>\n\n"
    fields = qwen_relay_fields(
        qwen_large, qwen_small, request_hook=forcing(trace, answer=False), temperature=0.0
    )
    llm = RelayLLM(**fields)
    prompt, text = PromptTemplate("Grade this: {text}"), "2+2=4"
    final = llm.structured_predict(Verdict, prompt, text=text)
    assert_grows_to(list(llm.stream_structured_predict(Verdict, prompt, text=text)), final)
    stream = await llm.astream_structured_predict(Verdict, prompt, text=text)
    assert_grows_to([p async for p in stream], final)
    structured = llm.as_structured_llm(Verdict)
    asked = [ChatMessage(role="user", content="Grade this: 2+2=4")]
    assert_grows_to([r.raw for r in structured.stream_chat(asked)], structured.chat(asked).raw)


@pytest.mark.blocks_loop  # every entry point, the sync ones inside the loop on purpose
async def test_the_token_counter_sees_the_usage_vllm_reported(
    qwen_large: Server, qwen_small: Server
) -> None:
    """For every entry point, LlamaIndex's TokenCountingHandler counts what the two servers
    reported, summed over both models and every request, the reasoning included."""
    from llama_index.core.callbacks import CallbackManager, TokenCountingHandler

    counter = TokenCountingHandler()
    llm = RelayLLM(
        **qwen_relay_fields(
            qwen_large,
            qwen_small,
            request_hook=forcing(TRACE),
            callback_manager=CallbackManager([counter]),
        )
    )
    prompt = "What is 2 + 2?"
    last_responses = [
        llm.chat(QUESTION),
        await llm.achat(QUESTION),
        list(llm.stream_chat(QUESTION))[-1],
        [r async for r in await llm.astream_chat(QUESTION)][-1],
        llm.complete(prompt),
        await llm.acomplete(prompt),
        list(llm.stream_complete(prompt))[-1],
        [r async for r in await llm.astream_complete(prompt)][-1],
    ]
    assert len(counter.llm_token_counts) == len(last_responses)  # one event per call
    for event, response in zip(counter.llm_token_counts, last_responses, strict=True):
        per_model = response.additional_kwargs["relay"]["usage"]  # as vLLM reported each
        assert set(per_model) == {"large", "small"}
        assert event.prompt_token_count == sum(u["prompt_tokens"] for u in per_model.values())
        assert event.completion_token_count == sum(
            u["completion_tokens"] for u in per_model.values()
        )
        assert 0 < response.additional_kwargs["reasoning_tokens"] < event.completion_token_count
