"""The environment of a ``relaygen serve`` process over a scripted upstream."""

from __future__ import annotations

import json
import os

from relay_integrations.testing.scripted_vllm import ScriptedVLLM
from tests.fakes.capable_model import CAPABLE_CUES


def relay_server_env(upstream: ScriptedVLLM, port: int) -> dict[str, str]:
    """This process's environment, with the relay's endpoints on `upstream` (models "large"
    and "small", the capable model's cues, no cooldown) and its port."""
    return {
        **os.environ,
        "RELAY_LARGE__BASE_URL": upstream.base_url,
        "RELAY_LARGE__MODEL": "large",
        "RELAY_SMALL__BASE_URL": upstream.base_url,
        "RELAY_SMALL__MODEL": "small",
        "RELAY_CUES": json.dumps(CAPABLE_CUES),
        "RELAY_POLICY__COOLDOWN_TOKENS": "0",
        "RELAY_SERVER_PORT": str(port),
    }
