"""Configuration of a relay: the two endpoints, sampling, the switching policy and the cue set.

Every object is a pydantic model, so a configuration can be written in Python, loaded from
JSON, or read from environment variables::

    from relay_integrations.core import EndpointConfig, RelayConfig

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
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from .habits import check_extra_body

ModelRole = Literal["large", "small"]
Phase = Literal["reasoning", "answer"]

RequestHook = Callable[[ModelRole, Phase, str], Mapping[str, Any]]
"""Extra request fields per request, from (model, phase, transcript so far); e.g. the
forcing hooks of :mod:`relay_integrations.testing`."""

CONTEXT_MARGIN = 16
"""Tokens kept free below a context window: text re-tokenized across models may grow."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


Temperature = Annotated[float, Field(ge=0, le=2, description="vLLM allows [0, 2]")]
TopP = Annotated[float, Field(gt=0, le=1)]
TopK = Annotated[int, Field(ge=-1, description="0 or -1: no top-k cut")]
MinP = Annotated[float, Field(ge=0, le=1)]
Penalty = Annotated[
    float, Field(ge=-2, le=2, description="presence/frequency penalty, vLLM allows [-2, 2]")
]
RepetitionPenalty = Annotated[
    float, Field(gt=0, allow_inf_nan=False, description="1 is none; vLLM allows (0, inf)")
]
Seed = Annotated[int, Field(ge=-(2**63), lt=2**63, description="vLLM's: a 64-bit integer")]


class OptionalSampling(BaseModel):
    """The sampling fields of one request, each optional (None: not set here): the fields of
    :class:`SamplingOverrides` and of ``relaygen serve``'s requests."""

    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: TopK | None = None
    min_p: MinP | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    repetition_penalty: RepetitionPenalty | None = None
    seed: Seed | None = None


MODEL_SAMPLING_FIELDS = tuple(OptionalSampling.model_fields)
"""The sampling fields of one upstream request (the token budget is the generation's)."""


class SamplingOverrides(OptionalSampling, _Frozen):
    """One model's own sampling, over the shared :class:`SamplingConfig` (unset: shared)::

    EndpointConfig(base_url=..., model="Qwen/Qwen3-1.7B",
                   sampling=SamplingOverrides(temperature=0.3, presence_penalty=1.5))
    """


class SamplingConfig(_Frozen):
    """Sampling shared by both models. Defaults are the RelayGen paper's; a field left None is
    not sent, so the server's default (the model's ``generation_config``) applies."""

    temperature: Temperature = Field(default=0.6, description="sampling temperature, [0, 2]")
    top_p: TopP = Field(default=0.95, description="nucleus sampling mass, (0, 1]")
    top_k: TopK | None = Field(default=20, description="top-k cut (0 or -1: none)")
    min_p: MinP | None = Field(default=None, description="min-p cut relative to the top token")
    presence_penalty: Penalty | None = Field(
        default=None,
        description="[-2, 2]; Qwen3's model card suggests up to 1.5 against endless repetition",
    )
    frequency_penalty: Penalty | None = Field(default=None, description="[-2, 2]")
    repetition_penalty: RepetitionPenalty | None = Field(
        default=None, description="vLLM's multiplicative penalty (1: none)"
    )
    seed: Seed | None = Field(default=None, description="seed of both models' sampling")
    max_tokens: int = Field(
        default=32768, ge=1, description="One budget for reasoning plus answer, over all segments"
    )

    def request_fields(self, own: SamplingOverrides | None = None) -> dict[str, Any]:
        """The sampling fields of one model's request: the shared values with the model's own
        over them; unset fields are left out (the server's defaults)."""
        fields = {name: getattr(self, name) for name in MODEL_SAMPLING_FIELDS}
        if own is not None:
            fields.update(own.model_dump(exclude_none=True))
        return {name: value for name, value in fields.items() if value is not None}


class EndpointConfig(_Frozen):
    """One vLLM OpenAI-compatible server and the model it serves."""

    base_url: str = Field(description="OpenAI base URL of the server, e.g. http://host:8000/v1")
    model: str = Field(description="Served model name (vLLM --served-model-name)")
    api_key: SecretStr | None = Field(default=None, description="Bearer key, if the server has one")
    connect_timeout: float = Field(default=10.0, gt=0, description="Seconds to open a connection")
    read_timeout: float = Field(
        default=600.0,
        gt=0,
        description="Seconds to wait for the next streamed chunk; a long reasoning trace is many "
        "chunks, so this bounds a stall, not a whole generation",
    )
    max_retries: int = Field(
        default=3, ge=0, description="Retries of a request that failed before its first token"
    )
    max_concurrency: int = Field(
        default=64, ge=1, description="Requests in flight to this endpoint at once"
    )
    max_stop_strings: int | None = Field(
        default=None,
        ge=0,
        description="Stop strings the server takes per request (vLLM: VLLM_MAX_STOP_STRINGS, "
        "4 unless set); None learns it from the server's first refusal. The relay finds the "
        "stop strings past it in the stream and closes the request there",
    )
    extra_headers: dict[str, str] = Field(default_factory=dict)
    extra_body: dict[str, Any] = Field(
        default_factory=dict, description="Extra vLLM request fields sent with every request"
    )
    sampling: SamplingOverrides = Field(
        default_factory=SamplingOverrides,
        description="This model's own sampling, over the shared values (e.g. a cooler small model)",
    )

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, url: str) -> str:
        """A URL the HTTP client can open; without this, a missing scheme would be tried
        (and retried) as a request, and then blamed on the server."""
        if "://" not in url:
            raise ValueError(f"{url!r} has no scheme: write 'http://{url}'")
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https"):
            raise ValueError(
                f"{url!r} has the scheme {parts.scheme!r}: vLLM is served over http "
                "(https behind a proxy)"
            )
        if not parts.hostname:
            raise ValueError(f"{url!r} names no host: write e.g. 'http://127.0.0.1:8000/v1'")
        return url

    @field_validator("extra_body")
    @classmethod
    def _own_fields_only(cls, body: dict[str, Any]) -> dict[str, Any]:
        # logit_bias is this model's own token ids here, so it means what it says
        check_extra_body(body, "extra_body", MODEL_SAMPLING_FIELDS, allowed=("logit_bias",))
        return body

    @property
    def server_root(self) -> str:
        """The server URL without the `/v1` suffix (where vLLM serves /tokenize)."""
        root = self.base_url.rstrip("/")
        return root[: -len("/v1")] if root.endswith("/v1") else root


class SwitchPolicy(_Frozen):
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


class ReasoningMarkers(_Frozen):
    """The text that opens and closes the reasoning (Qwen3 and DeepSeek-R1 share it)."""

    start: str = "<think>"
    end: str = "</think>"


class RelayConfig(_Frozen):
    """Everything a :class:`~relay_integrations.core.switcher.RelaySwitcher` needs."""

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
            for role in ("large", "small"):
                data.setdefault(role, {}).setdefault("api_key", shared_key)
        return cls(data, shared_key)


def _parse_env_value(raw: str) -> Any:
    stripped = raw.strip()
    if stripped[:1] in ("[", "{"):
        return json.loads(stripped)
    return raw
