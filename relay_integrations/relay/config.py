"""Configuration of a relay: the two endpoints, sampling, the switching policy and the cue set.

Every object is a pydantic model, so a configuration can be written in Python, loaded from
JSON, or read from environment variables::

    from relay_integrations.relay import EndpointConfig, RelayConfig

    config = RelayConfig(
        large=EndpointConfig(base_url="http://gpu-a:8000/v1", model="Qwen/Qwen3-32B"),
        small=EndpointConfig(base_url="http://gpu-b:8000/v1", model="Qwen/Qwen3-1.7B"),
        cues="builtin:qwen3-32b--qwen3-1.7b",
    )
    config = RelayConfig.from_env()  # RELAY_LARGE__BASE_URL, RELAY_SMALL__MODEL, RELAY_CUES, ...
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from ..upstream.config import MODEL_ROLES, EndpointConfig, Frozen, ModelRole, SamplingConfig
from ..upstream.headers import check_header_name

Phase = Literal["reasoning", "answer"]

RequestHook = Callable[[ModelRole, Phase, str], Mapping[str, Any]]
"""Extra request fields per request, from (model, phase, transcript so far); e.g. the
forcing hooks of :mod:`relay_integrations.testing`."""

CONTEXT_MARGIN = 16
"""Tokens kept free below a context window: text re-tokenized across models may grow."""


class SwitchPolicy(Frozen):
    """When control passes between the models, and what happens when something goes wrong."""

    cooldown_tokens: int = Field(
        default=5,
        ge=0,
        description="Tokens the large model writes after taking control before a cue may fire "
        "(stops 'So'-loops; the end of reasoning is never held back)",
    )
    max_small_tokens: int = Field(
        default=128, ge=1, description="Most tokens one small segment may write"
    )
    answer_model: ModelRole = Field(
        default="small", description="Who writes the answer after the end of reasoning"
    )
    no_reasoning_model: ModelRole = Field(
        default="large",
        description="Who writes the reply when the prompt has no reasoning stage "
        "(e.g. enable_thinking=false)",
    )
    small_may_end_reasoning: bool = Field(
        default=False,
        description="Let the small model end the reasoning; otherwise its end-of-reasoning "
        "marker is dropped and the large model resumes",
    )
    max_reasoning_tokens: int | None = Field(
        default=None,
        ge=1,
        description="Close the reasoning after this many tokens and let the answer model "
        "answer with what is left of the budget (None: the reasoning may use all of it)",
    )
    answer_reserve_tokens: int = Field(
        default=1024,
        ge=0,
        description="Budget kept for the answer: the reasoning is closed when only this many "
        "tokens (at most a quarter of max_tokens) remain, so it cannot leave the answer empty",
    )
    on_small_failure: Literal["use_large", "raise"] = Field(
        default="use_large",
        description="When the small endpoint fails: the large model writes the rest, or raise",
    )
    max_resumes: int = Field(
        default=2, ge=0, description="Resumptions of a segment whose stream broke mid-way"
    )
    resume_wait_seconds: float = Field(
        default=120.0,
        ge=0,
        description="Most seconds one generation waits, in all, for a server it cannot go "
        "around (the large model's; the small model's too with on_small_failure='raise') to "
        "come back after it went out mid-generation: a restart within it loses no text, past "
        "it the generation fails with its partial result. A generation that has written "
        "nothing yet fails at once (0: always at once)",
    )
    speculative_handoff: bool = Field(
        default=True,
        description="Open the next model's request when the text reaches a hand-off that waits "
        "only for its confirming token (' Now' before ' Now ', a sentence mark before its "
        "space), so its prefill overlaps that token; closed unused when the token continues "
        "the word or sentence. The text is the same either way",
    )
    warm_small_prompt: bool = Field(
        default=False,
        description="When a generation starts, send the small model its prompt (one token, "
        "kept out of the usage) so that its server's prefix cache holds it by the small "
        "model's first turn, which then prefills only what the large model wrote. For long "
        "prompts on a small server with capacity to spare; on a machine where the two "
        "servers share CPU cores it measured slower. Needs the two models on two servers "
        "(refused for one: one cache). The text is the same either way",
    )


class ReasoningMarkers(Frozen):
    """The text that opens and closes the reasoning (Qwen3 and DeepSeek-R1 share it)."""

    start: str = "<think>"
    end: str = "</think>"


class RelayConfig(Frozen):
    """Everything a :class:`~relay_integrations.relay.switcher.RelaySwitcher` needs."""

    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)
    """Errors name the field and the reason, never the value: an endpoint's key may be one."""

    large: EndpointConfig
    small: EndpointConfig
    cues: str | list[str] = Field(
        default="builtin:qwen3-32b--qwen3-1.7b",
        description="A calibration artifact path, 'builtin:NAME', or an inline list of cues",
    )
    allow_model_mismatch: bool = Field(
        default=False,
        description="Load a cue artifact even if it was calibrated for another model pair",
    )
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    policy: SwitchPolicy = Field(default_factory=SwitchPolicy)
    markers: ReasoningMarkers = Field(default_factory=ReasoningMarkers)
    session_header: str = Field(
        default="x-session-id",
        description="Header carrying the generation id on every upstream request, so that a "
        "prefix-cache-aware router keeps one generation on one replica",
    )

    @field_validator("session_header")
    @classmethod
    def _header_name(cls, name: str) -> str:
        check_header_name("session_header", name)
        return name

    @model_validator(mode="after")
    def _warm_up_needs_two_servers(self) -> RelayConfig:
        """Refuse a setting that could do nothing: one server has one prefix cache, which
        the large model's first request fills with the prompt anyway."""
        if self.policy.warm_small_prompt and self.large.server_root == self.small.server_root:
            raise ValueError(
                "policy.warm_small_prompt needs the small model on a server of its own: "
                f"{self.large.server_root} serves both models, and the large model's first "
                "request already puts the prompt in its one prefix cache. Leave it off."
            )
        return self

    def endpoint(self, role: ModelRole) -> EndpointConfig:
        """The endpoint of `role`."""
        return self.large if role == "large" else self.small

    @classmethod
    def from_env(
        cls, prefix: str = "RELAY_", environ: Mapping[str, str] | None = None, **overrides: Any
    ) -> RelayConfig:
        """Read the configuration from environment variables.

        Nested fields use a double underscore: ``RELAY_LARGE__BASE_URL``,
        ``RELAY_SMALL__MODEL``, ``RELAY_SAMPLING__MAX_TOKENS``, ``RELAY_POLICY__ANSWER_MODEL``.
        Values that are lists or dicts are JSON (``RELAY_LARGE__EXTRA_HEADERS='{"a": "b"}'``);
        ``RELAY_CUES`` may also be a JSON list of cues; ``RELAY_API_KEY`` is the key of both
        servers unless ``RELAY_LARGE__API_KEY`` / ``RELAY_SMALL__API_KEY`` say otherwise.
        Keyword overrides win over the environment.
        """
        return cls.model_validate({**cls.env_values(prefix, environ), **overrides})

    @classmethod
    def env_values(
        cls, prefix: str = "RELAY_", environ: Mapping[str, str] | None = None
    ) -> dict[str, Any]:
        """The raw, not yet validated, nested values that :meth:`from_env` reads."""
        return RelayEnvironment.read(prefix, environ).values


@dataclass(frozen=True)
class RelayEnvironment:
    """The ``RELAY_*`` variables, read once (the one place the environment is read): the
    nested values :meth:`RelayConfig.from_env` validates, ``RELAY_API_KEY`` already under
    each endpoint that has no key of its own, and ``RELAY_API_KEY`` itself::

        env = RelayEnvironment.read()
        env.values["large"]["base_url"]  # RELAY_LARGE__BASE_URL
    """

    values: dict[str, Any]
    shared_api_key: str | None

    @classmethod
    def read(
        cls, prefix: str = "RELAY_", environ: Mapping[str, str] | None = None
    ) -> RelayEnvironment:
        env = os.environ if environ is None else environ
        data: dict[str, Any] = {}
        for key, raw in env.items():
            if not key.startswith(prefix):
                continue
            path = key[len(prefix) :].lower().split("__")
            if path[0] not in RelayConfig.model_fields:
                continue  # RELAY_* variables of other tools are not ours
            target = data
            for part in path[:-1]:
                target = target.setdefault(part, {})
            target[path[-1]] = _parse_env_value(raw)
        shared_key = env.get(prefix + "API_KEY") or None
        if shared_key:
            for role in MODEL_ROLES:
                data.setdefault(role, {}).setdefault("api_key", shared_key)
        return cls(data, shared_key)


def _parse_env_value(raw: str) -> Any:
    stripped = raw.strip()
    if stripped[:1] in ("[", "{"):
        return json.loads(stripped)
    return raw
