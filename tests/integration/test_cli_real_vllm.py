"""`relaygen generate` against the real vLLM servers (the models are random: no text checks)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from relay_integrations.core import RelayResult

from .conftest import Server

pytestmark = pytest.mark.vllm


def relaygen(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "relay_integrations.cli", "generate", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_generate_prints_a_result(qwen_large: Server, qwen_small: Server) -> None:
    done = relaygen(
        "What is 2 + 2?",
        "--json",
        "--max-tokens",
        "40",
        "--seed",
        "1",
        "--large-url",
        qwen_large.url,
        "--large-model",
        qwen_large.large_model,
        "--small-url",
        qwen_small.url,
        "--small-model",
        qwen_small.small_model,
        "--cues",
        '["Therefore", "So "]',
    )
    assert done.returncode == 0, done.stderr
    result = RelayResult.model_validate_json(done.stdout)
    assert result.finish_reason in ("stop", "length")
    assert 0 < result.completion_tokens <= 40
    assert result.usage["large"].requests >= 1


def test_errors_say_what_to_fix(qwen_large: Server) -> None:
    missing = relaygen("hi", "--large-url", qwen_large.url, "--large-model", "x")
    assert missing.returncode == 2 and "--small-url" in missing.stderr
    wrong_pair = relaygen(
        "hi",
        "--large-url",
        qwen_large.url,
        "--large-model",
        qwen_large.large_model,
        "--small-url",
        qwen_large.url,
        "--small-model",
        qwen_large.large_model,
    )
    assert wrong_pair.returncode == 1
    assert "calibrated for large model 'Qwen/Qwen3-32B'" in wrong_pair.stderr
    assert "Traceback" not in wrong_pair.stderr
