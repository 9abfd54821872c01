"""`relaygen generate` against the real vLLM servers (the models are random: no text checks)."""

from __future__ import annotations

import pytest

from relay_integrations.relay import RelayResult

from .conftest import Server, pair_options, relaygen

pytestmark = pytest.mark.vllm


def test_generate_prints_a_result(qwen_large: Server, qwen_small: Server) -> None:
    done = relaygen(
        "generate",
        "What is 2 + 2?",
        "--json",
        "--max-tokens",
        "40",
        "--seed",
        "1",
        *pair_options(qwen_large, qwen_small),
        "--cues",
        '["Therefore", "So "]',
    )
    assert done.returncode == 0, done.stderr
    result = RelayResult.model_validate_json(done.stdout)
    assert result.finish_reason in ("stop", "length")
    assert 0 < result.completion_tokens <= 40
    assert result.usage["large"].requests >= 1


def test_errors_say_what_to_fix(qwen_large: Server) -> None:
    missing = relaygen("generate", "hi", "--large-url", qwen_large.url, "--large-model", "x")
    assert missing.returncode == 2 and "--small-url" in missing.stderr
    same_model_twice = Server(qwen_large.url, "", small_model=qwen_large.large_model)
    wrong_pair = relaygen("generate", "hi", *pair_options(qwen_large, same_model_twice))
    assert wrong_pair.returncode == 1
    assert "calibrated for large model 'Qwen/Qwen3-32B'" in wrong_pair.stderr
    assert "Traceback" not in wrong_pair.stderr
