"""The one ``RelayConfig`` builder of the tests over scripted servers: models "large" and
"small", the cues "Therefore," and "Now", two retries::

    make_config(server, cooldown_tokens=0)                      # policy fields as keywords
    make_config(server, max_retries=0, sampling=SamplingConfig(max_tokens=512))
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from relay_integrations.relay import EndpointConfig, RelayConfig, SamplingConfig, SwitchPolicy
from relay_integrations.testing.scripted_vllm import ScriptedVLLM

CUES = ("Therefore,", "Now")


def make_config(
    server: ScriptedVLLM,
    *,
    max_retries: int = 2,
    cues: Sequence[str] = CUES,
    sampling: SamplingConfig | None = None,
    **policy: Any,
) -> RelayConfig:
    """A relay over `server`'s "large" and "small" (`policy`: SwitchPolicy fields)."""
    return RelayConfig(
        large=EndpointConfig(base_url=server.base_url, model="large", max_retries=max_retries),
        small=EndpointConfig(base_url=server.base_url, model="small", max_retries=max_retries),
        cues=list(cues),
        policy=SwitchPolicy.model_validate(policy),
        sampling=sampling or SamplingConfig(),
    )
