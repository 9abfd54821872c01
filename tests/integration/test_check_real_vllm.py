"""``relaygen check`` against real vLLM servers: the tuned pair passes every item, the stock
server gets the warnings of a vLLM started as it comes, and the cross-family pair's two chat
templates are told apart."""

from __future__ import annotations

from pathlib import Path

import pytest

from relay_integrations.relay import EndpointConfig, RelayConfig, ServerReport, check_servers

from .conftest import Server, pair_options, relaygen

pytestmark = pytest.mark.vllm

CUES = '["Therefore,", "Now"]'
GEMMA_SMOLLM2_CUES = (
    Path(__file__).parents[2] / "examples/calibration-math500-gemma3-smollm2/cues.json"
)


def config(large: Server, small: Server, cues: str | list[str]) -> RelayConfig:
    return RelayConfig(
        large=EndpointConfig(base_url=large.url, model=large.large_model),
        small=EndpointConfig(base_url=small.url, model=small.small_model),
        cues=cues,
    )


def test_the_tuned_pair_is_all_ok(qwen_large: Server, qwen_small: Server) -> None:
    done = relaygen("check", *pair_options(qwen_large, qwen_small), "--cues", CUES, "--json")
    assert done.returncode == 0, done.stderr
    report = ServerReport.model_validate_json(done.stdout)
    assert [i for i in report.items if i.status != "ok"] == []
    # about 500 prompt tokens (its id tokenizes to a varying count): three whole 128-token blocks
    assert " 384 tokens came from the prefix cache" in report.item("prefix_caching", "large").found
    printed = relaygen("check", *pair_options(qwen_large, qwen_small), "--cues", CUES)
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout.rstrip().endswith("nothing would break the relay (0 warnings, 0 unknown)")


async def test_a_stock_server_warns_of_its_stop_limit_and_cannot_tell_of_caching(
    stock: Server,
) -> None:
    report = await check_servers(config(stock, stock, ["Therefore,", "Now"]))
    assert not report.breaks_relay
    for role in ("large", "small"):
        stops = report.item("stop_strings", role)
        assert stops.status == "warning"
        assert stops.found.startswith("the server takes 4 of the")
        assert "VLLM_MAX_STOP_STRINGS=1024" in (stops.fix or "")
        cached = report.item("cached_tokens", role)
        assert cached.status == "warning"
        assert "--enable-prompt-tokens-details" in (cached.fix or "")
        assert report.item("prefix_caching", role).status == "unknown"
    assert report.item("chat_templates").status == "ok"  # one model under two names
    assert report.item("continuation", "small").status == "ok"


async def test_the_cross_family_pair_has_two_chat_templates(gemma: Server, smollm2: Server) -> None:
    report = await check_servers(config(gemma, smollm2, str(GEMMA_SMOLLM2_CUES)))
    assert not report.breaks_relay
    templates = report.item("chat_templates")
    assert templates.status == "warning"
    assert templates.found.startswith("the same messages render differently from character 1")
    assert "large '<bos>You are a careful assistant." in templates.found
    assert "small '<|im_start|>system" in templates.found
    assert report.item("cue_artifact").status == "ok"  # calibrated for this pair
    others = {i.title: i.status for i in report.items if i.check != "chat_templates"}
    assert set(others.values()) == {"ok"}, others
