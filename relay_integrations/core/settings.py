"""The flat settings both framework adapters declare, written once.

LangChain and LlamaIndex users configure a model with keyword fields (``temperature=0``,
``max_tokens=512``, ``timeout=60``); :class:`RelaySettings` declares them once, with the two
endpoints, the cue set and the policy, and turns them into a :class:`RelayConfig`. Fields left
unset come from ``RELAY_*`` environment variables (``RELAY_LARGE__BASE_URL``, ...,
``RELAY_API_KEY``), so ``RelayChatModel()`` works in a configured deployment::

    class RelayChatModel(RelaySettings, BaseChatModel): ...

    llm = RelayChatModel(
        large_url="http://gpu-a:8000/v1", large_model="Qwen/Qwen3-32B",
        small_url="http://gpu-b:8001/v1", small_model="Qwen/Qwen3-1.7B",
        cues="calibration/cues.json", temperature=0.6, max_tokens=8192,
    )
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any, Self

from pydantic import BaseModel, Field, PrivateAttr, SecretStr, model_validator

from .chat import ChatRequest, Message
from .client import RelayClient
from .config import EndpointConfig, RelayConfig, SamplingConfig, SwitchPolicy
from .cues import CueSet
from .generation import RequestHook

SAMPLING_ARGUMENTS = ("temperature", "top_p", "top_k", "seed", "max_tokens")
CALL_ARGUMENTS = frozenset({*SAMPLING_ARGUMENTS, "stop", "chat_template_kwargs"})
"""Keyword arguments every adapter call accepts."""

_ENV_FIELDS = {
    "large_url": ("large", "base_url"),
    "large_model": ("large", "model"),
    "small_url": ("small", "base_url"),
    "small_model": ("small", "model"),
}


class RelaySettings(BaseModel):
    """Endpoints, cue set, policy and sampling of a relay model (a mixin for the adapters)."""

    large_url: str = Field(description="OpenAI base URL of the large model's vLLM server")
    large_model: str = Field(description="Served name of the large (reasoning) model")
    small_url: str = Field(description="OpenAI base URL of the small model's vLLM server")
    small_model: str = Field(description="Served name of the small model")
    api_key: SecretStr | None = Field(
        default=None, description="Bearer key of both servers (RELAY_API_KEY)"
    )
    cues: str | list[str] = Field(
        default="builtin:qwen3-32b--qwen3-1.7b",
        description="Cue artifact path (relaygen calibrate), 'builtin:NAME', or a list of cues",
    )
    allow_model_mismatch: bool = Field(
        default=False, description="Use a cue artifact calibrated for another model pair"
    )
    policy: SwitchPolicy = Field(default_factory=SwitchPolicy)
    temperature: float = Field(default=0.6, ge=0)
    top_p: float = Field(default=0.95, gt=0, le=1)
    top_k: int | None = 20
    seed: int | None = None
    max_tokens: int = Field(default=32768, ge=1, description="Budget for reasoning plus answer")
    stop: list[str] | None = Field(default=None, description="Stop sequences of the answer")
    timeout: float | None = Field(
        default=None, description="Seconds to wait for the next streamed chunk (default 600)"
    )
    max_retries: int = Field(default=3, ge=0, description="Retries before the first token")
    max_concurrency: int = Field(default=64, ge=1, description="Requests in flight per endpoint")
    chat_template_kwargs: dict[str, Any] = Field(
        default_factory=dict, description='e.g. {"enable_thinking": False}'
    )
    request_hook: RequestHook | None = Field(
        default=None,
        exclude=True,
        description="Extra vLLM fields per upstream request; tests and benchmarks force known "
        "outputs with relay_integrations.testing.forcing",
    )

    _client: RelayClient = PrivateAttr()

    @model_validator(mode="after")
    def _connect(self) -> Self:
        """Load the cue set (a bad artifact fails here, with its reason); make the client."""
        self._client = RelayClient(self.relay_config(), self.load_cues())
        return self

    @model_validator(mode="before")
    @classmethod
    def _from_environment(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        env = RelayConfig.env_values()
        filled = dict(data)
        for field, (role, key) in _ENV_FIELDS.items():
            if filled.get(field) is None and key in env.get(role, {}):
                filled[field] = env[role][key]
        if filled.get("cues") is None and "cues" in env:
            filled["cues"] = env["cues"]
        if filled.get("api_key") is None and os.environ.get("RELAY_API_KEY"):
            filled["api_key"] = os.environ["RELAY_API_KEY"]
        return filled

    @property
    def model_name(self) -> str:
        """Both models, large first: the name adapters report in responses."""
        return f"{self.large_model}+{self.small_model}"

    @classmethod
    def from_env(cls, **fields: Any) -> Self:
        """A model configured by ``RELAY_*`` variables; keyword fields win over them."""
        return cls.model_validate(fields)

    def load_cues(self) -> CueSet:
        """The cue set; a missing or malformed artifact fails here with the reason."""
        return CueSet.load(self.cues)

    def sampling(self, **overrides: Any) -> SamplingConfig:
        """Sampling from the fields, with per-call overrides (``temperature=0``, ...)."""
        values = {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "seed": self.seed,
            "max_tokens": self.max_tokens,
        }
        values.update({k: v for k, v in overrides.items() if k in values and v is not None})
        return SamplingConfig(**values)

    def chat_request(
        self, messages: Sequence[Message], call: Mapping[str, Any], **fields: Any
    ) -> ChatRequest:
        """A chat turn from a framework call's keyword arguments.

        `call` may hold sampling overrides (``temperature``, ``top_p``, ``top_k``, ``seed``,
        ``max_tokens``), ``stop`` and ``chat_template_kwargs``; anything else is refused with
        the accepted names. `fields` are the request fields the adapter has already
        translated (``tools``, ``tool_choice``, ``parallel_tool_calls``, ``response_format``).
        """
        unknown = set(call) - CALL_ARGUMENTS - set(fields)
        if unknown:
            raise TypeError(
                f"{type(self).__name__} got unsupported arguments {sorted(unknown)}; it takes "
                f"{sorted(CALL_ARGUMENTS | set(fields))}"
            )
        stop = call.get("stop")
        return ChatRequest(
            messages=messages,
            stop=stop if stop is not None else (self.stop or ()),
            sampling=self.sampling(**{k: call.get(k) for k in SAMPLING_ARGUMENTS}),
            chat_template_kwargs={
                **self.chat_template_kwargs,
                **(call.get("chat_template_kwargs") or {}),
            },
            request_hook=self.request_hook,
            **fields,
        )

    def relay_config(self) -> RelayConfig:
        def endpoint(url: str, model: str) -> EndpointConfig:
            return EndpointConfig(
                base_url=url,
                model=model,
                api_key=self.api_key,
                read_timeout=self.timeout or 600.0,
                max_retries=self.max_retries,
                max_concurrency=self.max_concurrency,
            )

        return RelayConfig(
            large=endpoint(self.large_url, self.large_model),
            small=endpoint(self.small_url, self.small_model),
            cues=self.cues,
            allow_model_mismatch=self.allow_model_mismatch,
            sampling=self.sampling(),
            policy=self.policy,
        )
