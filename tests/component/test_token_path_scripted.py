"""The token path is the text path with nothing tokenized twice: over the scripted server,
the same generation sent both ways gives the same result, and every request's ids stand for
exactly the prompt the text path sends, whatever ends the requests (cues, sentence ends,
stops in the stream past a server's cap, a broken stream resumed, the answer's stops)."""

from __future__ import annotations

from typing import Any

import pytest

from relay_integrations.langchain import RelayChatModel
from relay_integrations.llama_index import RelayLLM
from relay_integrations.relay import JinjaChatTemplate, RelayDone, RelaySwitcher
from relay_integrations.relay.config import RelayConfig
from relay_integrations.testing.qwen3_template import render_chat
from relay_integrations.testing.scripted_vllm import Fault, ScriptedModel, ScriptedVLLM, token_id
from relay_integrations.upstream.endpoint import KEPT_TEXT_CHARS
from tests.fakes.relay_config import make_config

TRACE = (
    "<think>\nLet me see. Therefore, the sum is 4. Then we go on. Now we check e.g. the sum. "
    "It is right.\n</think>\n\nThe answer is 4. Done here."
)
MESSAGES = [{"role": "user", "content": "What is 2 + 2?"}]


def other_template(
    messages: list[dict[str, Any]], thinking: bool, tools: list[dict[str, Any]] | None
) -> str:
    """A small model of another family: its chat renders to other ids."""
    return "<|system|>small\n" + render_chat(messages, thinking, tools)


CASES: dict[str, dict[str, Any]] = {
    "one tokenizer": {},
    "two tokenizers": {"small_template": other_template},
    "chunks of 3 tokens": {"tokens_per_chunk": 3},
    "stops past the server's cap": {"max_stop_strings": 1},
    "speculative hand-off": {"speculative_handoff": True},
    "a broken stream resumed": {"faults": [Fault(), Fault(cut_after=3)]},
    "answer stops": {"stop": ["here"]},
    "the small model's cap": {"max_small_tokens": 3},
}


async def run(path: str, case: dict[str, Any]) -> tuple[Any, list[list[dict[str, Any]]], Any]:
    models = [ScriptedModel(name, TRACE) for name in ("large", "small")]
    for model in models:
        model.tokens_per_chunk = case.get("tokens_per_chunk", 1)
        model.max_stop_strings = case.get("max_stop_strings")
    if "small_template" in case:
        models[1].chat_template = case["small_template"]
    models[0].faults = list(case.get("faults", []))
    async with ScriptedVLLM(*models) as server:
        config = make_config(
            server,
            speculative_handoff=case.get("speculative_handoff", False),
            max_small_tokens=case.get("max_small_tokens", 128),
        )
        config = RelayConfig.model_validate({**config.model_dump(), "prompt_path": path})
        async with RelaySwitcher(config) as relay:
            events = [e async for e in relay.stream(MESSAGES, stop=case.get("stop", ()))]
    done = events[-1]
    assert isinstance(done, RelayDone)
    return done.result, [m.requests for m in models], models


@pytest.mark.parametrize("name", CASES)
async def test_the_token_path_sends_what_the_text_path_sends(name: str) -> None:
    case = CASES[name]
    text, text_requests, _ = await run("text", case)
    tokens, token_requests, models = await run("tokens", case)
    assert tokens.text == text.text
    assert [(s.model, s.ended_by, s.text) for s in tokens.segments] == [
        (s.model, s.ended_by, s.text) for s in text.segments
    ]
    assert tokens.finish_reason == text.finish_reason
    for role, sent_as_text, sent_as_ids in zip(
        ("large", "small"), text_requests, token_requests, strict=True
    ):
        # the fake decodes a prompt of ids into the text it stands for
        assert all("prompt_ids" in body for body in sent_as_ids), role
        assert not any("prompt_ids" in body for body in sent_as_text), role
        assert [b["prompt"] for b in sent_as_ids] == [b["prompt"] for b in sent_as_text], role
    for model in models:  # the chat once; after that only text no id stood for yet
        assert model.renders == 1
        assert sum(map(len, model.texts_tokenized)) < len(TRACE)


async def test_one_tokenizer_tokenizes_only_the_last_token_of_a_stop() -> None:
    """Both models render the chat to the same ids: each continues from the other's own
    ids. Only the last piece of a request that a stop string ended is tokenized again
    (vLLM cuts the text at the stop's end, and that piece's token may hold more): the
    comma of the cue "Therefore," and the end of "</think>" (two tokens in the fake's
    tokenizer), besides the markers, once, for the prompt's reasoning mode."""
    _, _, models = await run("tokens", {})
    assert [m.texts_tokenized for m in models] == [["<think>", "</think>"], [",", ">"]]


async def test_short_texts_are_tokenized_once_an_endpoint() -> None:
    """A second generation of one tokenizer's pair asks for no ids: the ends of stops it
    hands off at are those of the first. A text longer than KEPT_TEXT_CHARS (the other
    model's sentence, with two tokenizers) is asked for each time."""
    models = [ScriptedModel(name, TRACE) for name in ("large", "small")]
    async with ScriptedVLLM(*models) as server, RelaySwitcher(make_config(server)) as relay:
        first = await relay.generate(MESSAGES)
        asked = [list(m.texts_tokenized) for m in models]
        second = await relay.generate(MESSAGES)
        assert second.text == first.text == TRACE
        assert [m.texts_tokenized for m in models] == asked
        endpoint, long = relay.endpoints["large"], "x" * (KEPT_TEXT_CHARS + 1)
        assert await endpoint.tokenize_text(long) == await endpoint.tokenize_text(long)
        for _ in range(2):
            assert await endpoint.tokenize_text(",") == [token_id(",")]
    assert models[0].texts_tokenized == [*asked[0], long, long, ","]


async def test_two_tokenizers_tokenize_each_hand_off_once() -> None:
    """Two tokenizers: each hand-off tokenizes the other model's new text, once, on the next
    model's server (with the last token of the stop that ended its own turn)."""
    _, _, (large, small) = await run("tokens", {"small_template": other_template})
    assert large.texts_tokenized == [
        "<think>",
        "</think>",
        ", the sum is 4.",
        " we check e.g. the sum.",
    ]
    assert small.texts_tokenized == [
        "<think>\nLet me see. Therefore,",
        " Then we go on. Now",
        " It is right.\n</think>",
    ]


@pytest.mark.parametrize("path", ["auto", "tokens", "text"])
async def test_a_text_renderer_takes_the_text_path_and_refuses_tokens(path: str) -> None:
    async with ScriptedVLLM(ScriptedModel("large", TRACE), ScriptedModel("small", TRACE)) as up:
        config = RelayConfig.model_validate({**make_config(up).model_dump(), "prompt_path": path})
        renderer = JinjaChatTemplate("{{ messages[0].content }}")
        if path == "tokens":
            with pytest.raises(ValueError, match=r"JinjaChatTemplate renders text\. Use"):
                RelaySwitcher(config, renderer=renderer)
            return
        async with RelaySwitcher(config, renderer=renderer) as relay:
            assert relay.prompt_path == "text"
            result = await relay.generate(MESSAGES)
    assert result.text and not any("prompt_ids" in body for body in up.models["large"].requests)


@pytest.mark.parametrize("adapter", [RelayChatModel, RelayLLM])
@pytest.mark.parametrize("path", ["auto", "text"])
async def test_the_adapters_send_prompts_as_their_prompt_path_says(
    adapter: type[RelayChatModel] | type[RelayLLM], path: str
) -> None:
    async with ScriptedVLLM(ScriptedModel("large", TRACE), ScriptedModel("small", TRACE)) as up:
        fields = {"large_model": "large", "small_model": "small", "cues": ["Therefore,"]}
        model = adapter(large_url=up.base_url, small_url=up.base_url, prompt_path=path, **fields)
        if isinstance(model, RelayChatModel):
            await model.ainvoke("What is 2 + 2?")
        else:
            await model.acomplete("What is 2 + 2?")
        await model.aclose()
    sent = [*up.models["large"].requests, *up.models["small"].requests]
    assert sent and all(("prompt_ids" in body) == (path == "auto") for body in sent)


async def test_only_the_reasoning_asks_for_the_ids_it_writes() -> None:
    """The answer is the last turn: no request continues from its ids, so its pieces carry
    none (each would cost the stream a little, every token)."""
    result, sent, _ = await run("tokens", {})
    large, small = sent
    answer = small[-1]
    assert result.segments[-1].phase == "answer" and result.segments[-1].model == "small"
    assert "return_token_ids" not in answer
    assert all(body["return_token_ids"] is True for body in [*large, *small[:-1]])
