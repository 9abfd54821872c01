"""``relaygen check`` and ``check_servers`` against scripted vLLM servers: each way a server can
fall short of what the relay wants gives its item, its message and fix, and the exit status."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from relay_integrations.cli import main
from relay_integrations.relay import (
    CheckItem,
    EndpointConfig,
    JinjaChatTemplate,
    PromptRenderer,
    RelayConfig,
    ServerReport,
    check_servers,
    check_servers_sync,
)
from relay_integrations.relay.artifact import CueArtifact, ModelIdentity, ModelPair, save_artifact
from relay_integrations.testing.qwen3_template import render_chat
from relay_integrations.testing.scripted_vllm import Fault, ScriptedModel, ScriptedVLLM, serving

TRACE = "<think>\nLet me see. Therefore, it is 4.\n</think>\n\nIt is 4."
CUES = '["Therefore,", "Now"]'


def pair(large: ScriptedModel | None = None, small: ScriptedModel | None = None) -> ScriptedVLLM:
    return ScriptedVLLM(
        large or ScriptedModel("large", TRACE), small or ScriptedModel("small", TRACE)
    )


@pytest.fixture
def tuned() -> Iterator[ScriptedVLLM]:
    with serving(pair()) as vllm:
        yield vllm


def check(url: str, *options: str, small_url: str | None = None) -> list[str]:
    return [
        "check",
        *("--large-url", url, "--large-model", "large"),
        *("--small-url", small_url or url, "--small-model", "small"),
        *options,
    ]


def report_of(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, ServerReport]:
    code = main([*argv, "--json"])
    return code, ServerReport.model_validate_json(capsys.readouterr().out)


def statuses(report: ServerReport) -> dict[str, str]:
    return {item.title: item.status for item in report.items}


def test_a_tuned_pair_is_all_ok_and_printed_as_a_checklist(
    tuned: ScriptedVLLM, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(check(tuned.base_url, "--cues", CUES)) == 0
    printed = capsys.readouterr().out
    code, report = report_of(capsys, check(tuned.base_url, "--cues", CUES))
    assert code == 0 and not report.breaks_relay
    assert statuses(report) == {
        "large server": "ok",
        "small server": "ok",
        "large stop strings": "ok",
        "small stop strings": "ok",
        "large cached tokens": "ok",
        "small cached tokens": "ok",
        "context windows": "ok",
        "chat templates": "ok",
        "cue artifact": "ok",
        "small continuation": "ok",
        "large prefix caching": "ok",
        "small prefix caching": "ok",
        "prompt path": "ok",
    }
    assert "(one tokenizer)" in report.item("prompt_path").found
    assert "takes all 13 stop strings of a large turn" in report.item("stop_strings", "large").found
    caching = report.item("prefix_caching", "small").found
    assert "came from the prefix cache the second time" in caching
    assert "continued 'Counting from one" in report.item("continuation", "small").found
    assert "ok       large stop strings    takes all 13" in printed
    assert printed.rstrip().endswith("nothing would break the relay (0 warnings, 0 unknown)")


def test_an_unreachable_server_is_a_problem_and_its_other_items_unknown(
    tuned: ScriptedVLLM, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RELAY_SMALL__MAX_RETRIES", "0")
    code, report = report_of(
        capsys, check(tuned.base_url, "--cues", CUES, small_url="http://127.0.0.1:9/v1")
    )
    assert code == 1 and report.breaks_relay
    server = report.item("server", "small")
    assert server.status == "problem"
    assert "cannot reach http://127.0.0.1:9/v1 (connection refused" in server.found
    assert (
        server.fix == "start the small vLLM server, or correct its URL or key as the message says"
    )
    assert report.item("stop_strings", "large").status == "ok"
    not_checked = {i.title for i in report.items if i.status == "unknown"}
    assert not_checked == {
        "small stop strings",
        "small cached tokens",
        "context windows",
        "chat templates",
        "small continuation",
        "small prefix caching",
        "prompt path",
    }
    assert report.item("continuation", "small").found == (
        "not checked: the small server did not answer"
    )


def test_a_wrong_model_name_lists_the_served_ones(
    tuned: ScriptedVLLM, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = check(tuned.base_url, "--cues", CUES)
    argv[argv.index("large")] = "Qwen/Qwen3-32B"
    code, report = report_of(capsys, argv)
    assert code == 1
    server = report.item("server", "large")
    assert server.status == "problem"
    assert "does not serve model 'Qwen/Qwen3-32B'; it serves ['large', 'small']" in server.found
    assert "name one of the served models" in (server.fix or "")


def test_a_stock_server_warns_of_its_stop_limit_and_missing_cached_tokens(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """vLLM as it starts: 4 stop strings a request, no prompt_tokens_details in the usage."""
    large, small = (
        ScriptedModel(name, TRACE, max_stop_strings=4, reports_cached_tokens=False)
        for name in ("large", "small")
    )
    servers = pair(large, small)
    with serving(servers) as vllm:
        code, report = report_of(capsys, check(vllm.base_url, "--cues", CUES))
    assert code == 0 and not report.breaks_relay
    stops = report.item("stop_strings", "large")
    assert stops.status == "warning"
    assert stops.found.startswith("the server takes 4 of the 13 stop strings of a large turn")
    assert stops.fix == "start the vLLM server with VLLM_MAX_STOP_STRINGS=1024 in its environment"
    assert report.item("stop_strings", "small").found.startswith("the server takes 4 of the 8")
    cached = report.item("cached_tokens", "small")
    assert cached.status == "warning"
    assert cached.fix == "start the vLLM server with --enable-prompt-tokens-details"
    caching = report.item("prefix_caching", "large")
    assert caching.status == "unknown"
    assert caching.found == "cannot tell: the server does not report cached prompt tokens"


async def test_a_configured_stop_limit_is_named_in_the_warning() -> None:
    async with pair() as vllm:
        config = RelayConfig(
            large=EndpointConfig(base_url=vllm.base_url, model="large", max_stop_strings=4),
            small=EndpointConfig(base_url=vllm.base_url, model="small"),
            cues=["Now"],
        )
        report = await check_servers(config)
    stops = report.item("stop_strings", "large")
    assert stops.status == "warning"
    assert stops.found.startswith("max_stop_strings=4 is configured of the 11 stop strings")
    assert "raise the large endpoint's max_stop_strings" in (stops.fix or "")


async def test_prefix_caching_off_and_a_shorter_small_window_are_warnings() -> None:
    small = ScriptedModel("small", TRACE, prefix_caching=False, max_model_len=2048)
    async with pair(small=small) as vllm:
        config = RelayConfig(
            large=EndpointConfig(base_url=vllm.base_url, model="large"),
            small=EndpointConfig(base_url=vllm.base_url, model="small"),
            cues=["Therefore,"],
        )
        report = await check_servers(config)
    assert not report.breaks_relay
    caching = report.item("prefix_caching", "small")
    assert caching.status == "warning"
    assert " 0 tokens cached the second time" in caching.found
    assert "drop --no-enable-prefix-caching" in (caching.fix or "")
    assert report.item("prefix_caching", "large").status == "ok"
    windows = report.item("context_windows")
    assert windows.status == "warning"
    assert windows.found.startswith("large 4096 tokens, small 2048 tokens: the small model")
    assert windows.fix == "serve the small model with --max-model-len 4096 (or more)"


def gemma_like(messages: list[dict[str, Any]], thinking: bool, tools: Any) -> str:
    """A template of another family: a plain preamble, and the reasoning opened in the prompt."""
    system = "".join(m["content"] + "\n\n" for m in messages if m["role"] == "system")
    users = "".join(f"Question: {m['content']}\n" for m in messages if m["role"] == "user")
    return f"<bos>{system}{users}Let's think step by step.\n<think>\n"


def test_two_chat_templates_are_reported_with_where_they_differ(
    capsys: pytest.CaptureFixture[str],
) -> None:
    servers = pair(large=ScriptedModel("large", TRACE, chat_template=gemma_like))
    with serving(servers) as vllm:
        code, report = report_of(capsys, check(vllm.base_url, "--cues", CUES))
    assert code == 0
    templates = report.item("chat_templates")
    assert templates.status == "warning"
    assert templates.found == (
        "the same messages render differently from character 1: large '<bos>You are a careful "
        "assistant.\\n\\nQuest'..., small '<|im_start|>system\\nYou are a careful ass'...; "
        "the large prompt opens the reasoning itself, the small one leaves the reasoning to "
        "the model to open"
    )
    assert (templates.fix or "").startswith("none for a pair from two model families")


def write_artifact(path: Any, large: str, small: str) -> str:
    artifact = CueArtifact(
        model_pair=ModelPair(large=ModelIdentity(model=large), small=ModelIdentity(model=small)),
        cues=["Therefore,"],
        source="test",
    )
    return str(save_artifact(artifact, path / "cues.json"))


def test_an_artifact_of_another_pair_is_refused_unless_allowed(
    tuned: ScriptedVLLM, capsys: pytest.CaptureFixture[str], tmp_path: Any
) -> None:
    other = write_artifact(tmp_path, "Qwen/Qwen3-32B", "small")
    code, report = report_of(capsys, check(tuned.base_url, "--cues", other))
    assert code == 1
    refused = report.item("cue_artifact")
    assert refused.status == "problem"
    assert refused.found == (
        f"{other}: calibrated for large model 'Qwen/Qwen3-32B', but the large endpoint serves "
        "'/models/large': the relay refuses it"
    )
    assert refused.fix == (
        "calibrate this pair (relaygen calibrate) and use its artifact, or use this one anyway "
        "(--allow-model-mismatch, allow_model_mismatch=True)"
    )
    code, report = report_of(
        capsys, check(tuned.base_url, "--cues", other, "--allow-model-mismatch")
    )
    allowed = report.item("cue_artifact")
    assert code == 0 and allowed.status == "warning"
    assert allowed.found.endswith(
        "'/models/large': the relay uses it anyway (allow_model_mismatch)"
    )
    ours = write_artifact(tmp_path, "/models/large", "small")
    code, report = report_of(capsys, check(tuned.base_url, "--cues", ours))
    assert code == 0
    assert report.item("cue_artifact").found == f"{ours} was calibrated for /models/large and small"


def test_failing_completions_are_problems(capsys: pytest.CaptureFixture[str]) -> None:
    """The small server lists its model and renders chats, but every completion fails."""
    small = ScriptedModel("small", TRACE, faults=[Fault(status=500) for _ in range(8)])
    with serving(pair(small=small)) as vllm:
        config = RelayConfig(
            large=EndpointConfig(base_url=vllm.base_url, model="large"),
            small=EndpointConfig(base_url=vllm.base_url, model="small", max_retries=0),
            cues=["Therefore,"],
        )
        report = check_servers_sync(config)
    assert report.breaks_relay
    continuation = report.item("continuation", "small")
    assert continuation.status == "problem"
    assert continuation.found.startswith("a /v1/completions request failed: POST http://")
    assert "answered 500" in continuation.found
    assert continuation.fix == (
        "read the small vLLM server's log: the relay sends every small turn as such a request"
    )
    assert report.item("stop_strings", "small").status == "problem"
    assert report.item("prefix_caching", "small").found == "not checked: its requests failed"
    assert report.item("stop_strings", "large").status == "ok"


def test_bad_arguments_exit_with_2(
    tuned: ScriptedVLLM, capsys: pytest.CaptureFixture[str], tmp_path: Any
) -> None:
    assert main(["check", "--large-url", tuned.base_url, "--large-model", "large"]) == 2
    assert "no small endpoint: pass --small-url and --small-model" in capsys.readouterr().err
    missing = str(tmp_path / "missing.json")
    assert main(check(tuned.base_url, "--cues", missing)) == 2
    assert f"cue artifact {missing}: file not found" in capsys.readouterr().err
    assert main(check(tuned.base_url, "--cues", "[not json")) == 2
    assert "configuration error" in capsys.readouterr().err


def test_the_json_report_says_whether_something_breaks_the_relay(
    tuned: ScriptedVLLM, capsys: pytest.CaptureFixture[str]
) -> None:
    main([*check(tuned.base_url, "--cues", CUES), "--json"])
    printed = json.loads(capsys.readouterr().out)
    assert printed["breaks_relay"] is False
    assert printed["items"][0] == {
        "check": "server",
        "role": "large",
        "status": "ok",
        "found": f"{tuned.base_url} serves large (/models/large)",
        "fix": None,
    }


def no_template(messages: list[dict[str, Any]], thinking: bool, tools: Any) -> str:
    raise ValueError("this model has no chat template")


async def test_a_template_that_fails_is_a_problem_and_an_empty_continuation_a_warning() -> None:
    small = ScriptedModel("small", "", chat_template=no_template)  # writes nothing
    async with pair(small=small) as vllm:
        config = RelayConfig(
            large=EndpointConfig(base_url=vllm.base_url, model="large"),
            small=EndpointConfig(base_url=vllm.base_url, model="small", max_retries=0),
            cues=["Therefore,"],
        )
        report = await check_servers(config)
    templates = report.item("chat_templates")
    assert templates.status == "problem" and report.breaks_relay
    assert templates.found.startswith("the conversation could not be rendered (small: ")
    assert "answered 500" in templates.found
    assert "vLLM --chat-template" in (templates.fix or "")
    continuation = report.item("continuation", "small")
    assert continuation.status == "warning"
    assert continuation.found.startswith(
        "wrote nothing after 'Counting from one to ten: one, two, three, four,' (finish reason "
        "stop)"
    )


# -- the prompt path --------------------------------------------------------------------------


def other_template(
    messages: list[dict[str, Any]], thinking: bool, tools: list[dict[str, Any]] | None
) -> str:
    """A small model of another family: its chat renders to other ids."""
    return "<|system|>small\n" + render_chat(messages, thinking, tools)


def relay_config(url: str, **fields: Any) -> RelayConfig:
    return RelayConfig(
        large=EndpointConfig(base_url=url, model="large", max_retries=0),
        small=EndpointConfig(base_url=url, model="small", max_retries=0),
        cues=["Therefore,"],
        **fields,
    )


async def prompt_path_of(
    vllm: ScriptedVLLM, renderer: PromptRenderer | None = None, **fields: Any
) -> CheckItem:
    report = await check_servers(relay_config(vllm.base_url, **fields), renderer=renderer)
    return report.item("prompt_path")


async def test_two_tokenizers_take_token_ids_each_on_its_own_server() -> None:
    small = ScriptedModel("small", TRACE, chat_template=other_template)
    async with pair(small=small) as vllm:
        item = await prompt_path_of(vllm)
    assert item.status == "ok"
    assert "(two tokenizers): each hand-off tokenizes the other model's new text" in item.found


async def test_prompts_as_text_are_ok_when_configured_and_a_warning_from_a_text_renderer() -> None:
    async with pair() as vllm:
        configured = await prompt_path_of(vllm, prompt_path="text")
        jinja = await prompt_path_of(vllm, renderer=JinjaChatTemplate("{{ messages[0].content }}"))
    assert (configured.status, configured.found) == ("ok", "text, as configured (prompt_path)")
    assert jinja.status == "warning"
    assert jinja.found.startswith("text: the renderer (JinjaChatTemplate) renders text")
    assert "keep the default renderer" in (jinja.fix or "")


async def test_a_server_that_returns_no_token_ids_is_a_warning() -> None:
    """The relay still works there: what each model wrote is tokenized again."""
    async with pair(small=ScriptedModel("small", TRACE, returns_token_ids=False)) as vllm:
        item = await prompt_path_of(vllm)
    assert item.status == "warning"
    assert "small: its pieces do not carry the ids they wrote (return_token_ids)" in item.found


async def test_a_server_that_refuses_a_prompt_of_ids_is_a_problem() -> None:
    async with pair() as vllm:  # where the check's prompt of ids comes among its requests
        await prompt_path_of(vllm)
        before = next(i for i, b in enumerate(vllm.models["large"].requests) if "prompt_ids" in b)
    refusing = ScriptedModel("large", TRACE, faults=[Fault()] * before + [Fault(status=400)])
    async with pair(large=refusing) as vllm:
        report = await check_servers(relay_config(vllm.base_url))
    item = report.item("prompt_path")
    assert item.status == "problem" and report.breaks_relay
    assert item.found.startswith("token ids do not work (large: a prompt of token ids failed:")
    assert (item.fix or "").endswith("or set prompt_path='text'")
