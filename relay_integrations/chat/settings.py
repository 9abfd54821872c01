"""The flat settings both framework adapters declare, written once.

LangChain and LlamaIndex users configure a model with keyword fields (``temperature=0``,
``max_tokens=512``, ``timeout=60``); :class:`RelaySettings` declares them once, with the two
endpoints, the cue set and the policy, and turns them into a :class:`RelayConfig`::

    class RelayChatModel(RelaySettings, BaseChatModel): ...

    llm = RelayChatModel(
        large_url="http://gpu-a:8000/v1", large_model="Qwen/Qwen3-32B",
        small_url="http://gpu-b:8001/v1", small_model="Qwen/Qwen3-1.7B",
        cues="calibration/cues.json", temperature=0.6, max_tokens=8192,
        small={"sampling": {"temperature": 0.3}, "api_key": "key-b"},  # the small model's own
    )

Where a value comes from, first match wins: the keyword field; for one model, its own
``large=``/``small=`` settings over the shared fields; a ``RELAY_*`` environment variable
(``RELAY_LARGE__BASE_URL``, ``RELAY_SAMPLING__TEMPERATURE``, ``RELAY_POLICY__ANSWER_MODEL``,
``RELAY_SMALL__EXTRA_HEADERS``, ..., ``RELAY_API_KEY``: every variable ``RelayConfig.from_env``
reads); the default of the relay's configuration (``SamplingConfig``, ``EndpointConfig``,
``SwitchPolicy``), which the flat fields share. Unknown fields and call arguments are refused
with what to use instead (:mod:`relay_integrations.chat.habits`).

What the object shows is what its requests carry: the relay's configuration is derived from
the fields when a request is made (rebuilt only when one changed), so a model changed after it
was built, however it was changed, sends its new values::

    cool = llm.model_copy(update={"temperature": 0.2})  # validated as the constructor does
    llm.max_tokens = 2048                                # so is an assignment
    llm.temperature = 5                                  # refused; llm keeps its value

Models whose client would be the same (endpoints, cues, policy) share it, and so its
connections (:mod:`._shared_clients`).

Secrets never show, however they were given (``api_key``, ``default_headers``, a proxy's
password, a model's own ``large={"api_key": ...}``, the environment): a model's repr (and so
LangChain's ``dumpd``, which tracers receive) hides them, and a dump (``model_dump``,
LlamaIndex's ``to_dict``/``to_json``) leaves them out, so that a dump loaded again takes them
from the environment, as LangChain's serialized secrets do; errors never echo a value::

    RelayChatModel(..., large={"api_key": "sk-..."})
    # RelayChatModel(..., large={'api_key': SecretStr('**********')}, ...)
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import Any, ClassVar, Self

import aiohttp
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    FieldSerializationInfo,
    ModelWrapValidatorHandler,
    PrivateAttr,
    SecretStr,
    ValidationError,
    field_serializer,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo

from ..relay.config import PromptPath, RelayConfig, RelayEnvironment, RequestHook, SwitchPolicy
from ..relay.cues import CueSet
from ..upstream.config import (
    MODEL_ROLES,
    MODEL_SAMPLING_FIELDS,
    SECRET_ENDPOINT_FIELDS,
    URL_ENDPOINT_FIELDS,
    EndpointConfig,
    MinP,
    Penalty,
    RepetitionPenalty,
    SamplingConfig,
    Seed,
    Temperature,
    TopK,
    TopP,
    dumped_endpoint_fields,
    shown_endpoint_field,
)
from ..upstream.rendering import PromptRenderer
from ..upstream.reserved_fields import check_extra_body
from ._shared_clients import ClientLease, client_key, lease_client
from .client import RelayClient
from .exchange import ChatRequest, Message
from .habits import FIELD_ALIASES, unknown_names_message

SAMPLING_ARGUMENTS = (*MODEL_SAMPLING_FIELDS, "max_tokens")
CALL_ARGUMENTS = frozenset({*SAMPLING_ARGUMENTS, "stop", "chat_template_kwargs", "extra_body"})
"""Keyword arguments every adapter call accepts."""

_SHARED_ENDPOINT_FIELDS = {
    "api_key": "api_key",
    "timeout": "read_timeout",
    "connect_timeout": "connect_timeout",
    "max_retries": "max_retries",
    "max_concurrency": "max_concurrency",
    "probe_interval": "probe_interval",
    "failures_to_open": "failures_to_open",
    "default_headers": "extra_headers",
    "extra_body": "extra_body",
    "verify": "verify",
    "cert": "cert",
    "proxy": "proxy",
    "trust_env": "trust_env",
    "session_factory": "session_factory",
}
"""Flat fields that set both endpoints (a model's own ``large=``/``small=`` wins)."""

_ROLE_FIELDS = {
    "large_url": ("large", "base_url"),
    "large_model": ("large", "model"),
    "small_url": ("small", "base_url"),
    "small_model": ("small", "model"),
}
_TOP_FIELDS = ("cues", "allow_model_mismatch", "policy", "prompt_path")
_ENDPOINT_FIELD_OF = {
    **_SHARED_ENDPOINT_FIELDS,
    **{name: key for name, (_, key) in _ROLE_FIELDS.items()},
}
"""Each flat field that sets an endpoint field, and that endpoint field's name."""
_HOLDING_SECRETS = (
    *MODEL_ROLES,
    *(
        name
        for name, key in _ENDPOINT_FIELD_OF.items()
        if key in (*SECRET_ENDPOINT_FIELDS, *URL_ENDPOINT_FIELDS)
    ),
)
"""The fields that may hold a secret: the models' own settings, the key, the headers and the
URLs (whose password is one)."""


def _default(model: type[BaseModel], name: str) -> Any:
    """The relay's default of a field, so that the flat fields have no second copy."""
    return model.model_fields[name].get_default(call_default_factory=True)


def _same_as(model: type[BaseModel], name: str, **changes: Any) -> Any:
    """The relay's field `name` of `model` (default, bounds, description), with `changes`: a
    flat field declared once, in the relay's configuration."""
    return FieldInfo.merge_field_infos(model.model_fields[name], **changes)


class RelaySettings(BaseModel):
    """Endpoints, cue set, policy and sampling of a relay model (a mixin for the adapters)."""

    model_config = ConfigDict(
        extra="forbid", arbitrary_types_allowed=True, hide_input_in_errors=True
    )
    """Errors name the field and the reason, never the value: a key may be one (or sit in
    the dict of a model's own settings beside the value refused)."""

    refused_fields: ClassVar[Mapping[str, str]] = {}
    """The adapter's own refusals (field -> what to use instead), over the shared ones."""
    field_aliases: ClassVar[Mapping[str, str]] = FIELD_ALIASES
    """Names other clients use for this adapter's fields."""
    implied_fields: ClassVar[Mapping[str, Any]] = {}
    """Other clients' fields that state what this adapter always is (``is_chat_model=True``):
    that value is accepted, any other refused."""

    large_url: str = Field(description="OpenAI base URL of the large model's vLLM server")
    large_model: str = Field(description="Served name of the large (reasoning) model")
    small_url: str = Field(description="OpenAI base URL of the small model's vLLM server")
    small_model: str = Field(description="Served name of the small model")
    large: dict[str, Any] = Field(
        default_factory=dict,
        description="The large model's own EndpointConfig fields (api_key, extra_headers, "
        "extra_body, read_timeout, sampling={...}, ...), over the shared fields",
    )
    small: dict[str, Any] = Field(
        default_factory=dict, description="The small model's own EndpointConfig fields"
    )
    api_key: SecretStr | None = Field(
        default=None, description="Bearer key of both servers (RELAY_API_KEY)"
    )
    default_headers: dict[str, str] = Field(
        default_factory=dict, description="HTTP headers sent to both servers"
    )
    extra_body: dict[str, Any] = Field(
        default_factory=dict,
        description="vLLM request fields for both models (alias model_kwargs, additional_kwargs)",
    )
    verify: bool | str | None = _same_as(EndpointConfig, "verify", default=None)
    """Both endpoints' TLS check: True, a CA bundle's path, or False (None: the endpoints')."""
    cert: str | tuple[str, str] | None = _same_as(EndpointConfig, "cert")
    proxy: str | None = _same_as(EndpointConfig, "proxy")
    """Both endpoints' HTTP proxy (alias ``openai_proxy``)."""
    trust_env: bool | None = _same_as(EndpointConfig, "trust_env", default=None)
    """Proxies from the environment for both endpoints (None: the endpoints', true)."""
    session_factory: Callable[[], aiohttp.ClientSession] | None = _same_as(
        EndpointConfig, "session_factory"
    )
    timeout: float | None = _same_as(EndpointConfig, "read_timeout", default=None)
    """Both endpoints' ``read_timeout`` (alias ``request_timeout``; None: the endpoints')."""
    connect_timeout: float = _same_as(EndpointConfig, "connect_timeout")
    max_retries: int = _same_as(EndpointConfig, "max_retries")
    max_concurrency: int = _same_as(EndpointConfig, "max_concurrency")
    probe_interval: float = _same_as(EndpointConfig, "probe_interval")
    failures_to_open: int = _same_as(EndpointConfig, "failures_to_open")
    cues: str | list[str] = Field(
        default=_default(RelayConfig, "cues"),
        description="Cue artifact path (relaygen calibrate), 'builtin:NAME', or a list of cues",
    )
    allow_model_mismatch: bool = _same_as(RelayConfig, "allow_model_mismatch")
    policy: SwitchPolicy = Field(default_factory=SwitchPolicy)
    prompt_path: PromptPath = _same_as(RelayConfig, "prompt_path")
    temperature: Temperature = _default(SamplingConfig, "temperature")
    top_p: TopP = _default(SamplingConfig, "top_p")
    top_k: TopK | None = _default(SamplingConfig, "top_k")
    min_p: MinP | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    repetition_penalty: RepetitionPenalty | None = None
    seed: Seed | None = None
    max_tokens: int = _same_as(SamplingConfig, "max_tokens")
    """Alias ``max_completion_tokens``."""
    stop: list[str] | None = Field(default=None, description="Stop sequences of the answer")
    chat_template_kwargs: dict[str, Any] = Field(
        default_factory=dict, description='e.g. {"enable_thinking": False}'
    )
    renderer: PromptRenderer | None = Field(
        default=None,
        exclude=True,
        description="How prompts are rendered (default: the servers' own chat templates via "
        "POST /tokenize; relay_integrations.upstream.JinjaChatTemplate for servers without)",
    )
    request_hook: RequestHook | None = Field(
        default=None,
        exclude=True,
        description="Extra vLLM fields per upstream request, given to the relay built for this "
        "model; tests and benchmarks force known outputs with relay_integrations.testing.forcing",
    )

    _environment: RelayEnvironment = PrivateAttr()
    _configured_as: tuple[Hashable, RelayConfig, str] | None = PrivateAttr(default=None)
    _lease: ClientLease | None = PrivateAttr(default=None)

    @model_validator(mode="wrap")
    @classmethod
    def _configured(cls, data: Any, handler: ModelWrapValidatorHandler[Self]) -> Self:
        """The environment, read once, fills the unset fields (so that they read true) and
        lies under them in the relay's configuration; then the configuration is checked and
        the cue set loaded (a bad artifact or a bad field fails here, with its reason)."""
        if not isinstance(data, dict):
            return handler(data)
        env = RelayEnvironment.read()
        settings = handler(cls._from_user(data, env))
        settings._environment = env
        _ = settings._client
        return settings

    # -- secrets: shown hidden, dumped without --------------------------------------------

    def __repr_args__(self) -> Iterable[tuple[str | None, Any]]:
        """The fields as pydantic (and the framework) shows them, with the secrets hidden:
        this is also LangChain's ``dumpd`` of the model, which tracers receive."""
        for name, value in super().__repr_args__():
            yield name, value if name is None else _shown(name, value)

    @field_serializer(*_HOLDING_SECRETS)
    def _dumped_without_secrets(self, value: Any, info: FieldSerializationInfo) -> Any:
        """A dump leaves the secrets out (the key and headers dump as their defaults, a URL's
        password is hidden): loaded again, the model takes them from the environment."""
        name = info.field_name
        if name in MODEL_ROLES:
            return dumped_endpoint_fields(value)
        if _ENDPOINT_FIELD_OF[name] in SECRET_ENDPOINT_FIELDS:
            return type(self).model_fields[name].get_default(call_default_factory=True)
        return _shown(name, value)

    # -- one truth: what the object shows is what its requests carry ----------------------

    def __setattr__(self, name: str, value: Any) -> None:
        """A relay field assigned is validated, and the relay's configuration follows it; a
        value the relay cannot honour is refused and the field keeps its value."""
        if name.startswith("_") or (
            name in type(self).model_fields and name not in RelaySettings.model_fields
        ):  # private attributes and the framework's own fields, as the framework has them
            super().__setattr__(name, value)
        else:
            self._change({name: value})

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """A copy, with `update` validated as the constructor validates it (pydantic's own
        ``model_copy`` sets the values unchecked); the copy's requests carry its values, over
        the connections of the same endpoints."""
        copied = super().model_copy(deep=deep)
        if update:
            copied._change(update)
        return copied

    def _change(self, update: Mapping[str, Any]) -> None:
        """Validate and set fields (aliases renamed, unknown names refused with what to use
        instead), then derive the relay from them; on failure nothing changes."""
        renamed = self._renamed(update)
        self._refuse_unknown(renamed)
        saved = (dict(self.__dict__), set(self.model_fields_set))
        try:
            for name, value in renamed.items():
                self.__pydantic_validator__.validate_assignment(self, name, value)
            _ = self._client
        except BaseException:
            object.__setattr__(self, "__dict__", saved[0])
            object.__setattr__(self, "__pydantic_fields_set__", saved[1])
            raise

    def relay_config(self) -> RelayConfig:
        """The relay configuration these settings stand for now (rebuilt when a field
        changed since it was last built)."""
        return self._derived()[0]

    def _derived(self) -> tuple[RelayConfig, str]:
        """The configuration and the key of its client, rebuilt when a field changed."""
        state = _fingerprint(self, RelaySettings.model_fields)
        if self._configured_as is None or self._configured_as[0] != state:
            config = self._build_config(self._environment)
            key = client_key(config, self.renderer, self.request_hook)
            self._configured_as = (state, config, key)
        return self._configured_as[1:]

    @property
    def _client(self) -> RelayClient:
        """The client of the current configuration, shared with every model whose client
        would be the same (:mod:`._shared_clients`)."""
        config, key = self._derived()
        lease = self._lease if self._lease is not None and self._lease.held_by(self) else None
        if lease is not None and lease.key == key:
            return lease.client
        # the new lease first: a configuration that cannot be served (a cue set that does
        # not load) raises here, and the model keeps the client it had, still leased
        fresh = lease_client(self, key, config, self.renderer, self.request_hook)
        if lease is not None:
            left = lease.release()  # moved to other endpoints: the old ones may close
            if left is not None:
                left.close_later()
        self._lease = fresh
        return fresh.client

    @classmethod
    def _from_user(cls, data: Mapping[str, Any], environment: RelayEnvironment) -> dict[str, Any]:
        """Aliases renamed, habits refused with what to use instead, unset fields from the
        environment."""
        filled = cls._renamed(data)
        cls._refuse_unknown(filled)
        env = environment.values
        for name, (role, key) in _ROLE_FIELDS.items():
            if filled.get(name) is None and key in env.get(role, {}):
                filled[name] = env[role][key]
        for name in SAMPLING_ARGUMENTS:
            if name not in filled and name in env.get("sampling", {}):
                filled[name] = env["sampling"][name]
        for name in _TOP_FIELDS:
            if filled.get(name) is None and name in env:
                filled[name] = env[name]
        if filled.get("api_key") is None and environment.shared_api_key:
            filled["api_key"] = environment.shared_api_key
        return filled

    @classmethod
    def _renamed(cls, data: Mapping[str, Any]) -> dict[str, Any]:
        renamed: dict[str, Any] = {}
        for name, value in data.items():
            if name in cls.implied_fields:
                if value != cls.implied_fields[name]:
                    raise ValueError(
                        f"{name}={value!r}: {cls.__name__} is always "
                        f"{name}={cls.implied_fields[name]!r}; remove it"
                    )
                continue
            target = cls.field_aliases.get(name, name)
            if target in renamed and target == "extra_body" and isinstance(value, Mapping):
                renamed[target] = {**renamed[target], **value}  # model_kwargs and extra_body
            elif target in renamed and target != name:
                raise ValueError(f"{name} and {target} mean the same; give one of them")
            else:
                renamed[target] = value
        if isinstance(renamed.get("stop"), str):
            renamed["stop"] = [renamed["stop"]]  # ChatOpenAI takes one stop string too
        return renamed

    @classmethod
    def _refuse_unknown(cls, data: Mapping[str, Any]) -> None:
        accepted = {*cls.model_fields, *(f.alias for f in cls.model_fields.values() if f.alias)}
        unknown = set(data) - accepted
        if unknown:
            raise ValueError(
                unknown_names_message(
                    cls.__name__, "the fields", unknown, sorted(accepted), cls.refused_fields
                )
            )

    @field_validator("extra_body")
    @classmethod
    def _own_fields_only(cls, body: dict[str, Any]) -> dict[str, Any]:
        check_extra_body(body, "extra_body", MODEL_SAMPLING_FIELDS)
        return body

    @field_validator("large", "small", mode="before")
    @classmethod
    def _endpoint_fields(cls, value: Any) -> Any:
        if isinstance(value, EndpointConfig):
            return value.model_dump(exclude_unset=True)
        return value

    def close(self) -> None:
        """Close the model's connections to both servers (``with model: ...`` does it too);
        connections shared with other open models of the same endpoints stay open for them.
        Using the model again opens new ones."""
        client = self._release()
        if client is not None:
            client.close()

    async def aclose(self) -> None:
        """Close the model's connections (``async with model: ...`` does it too)."""
        client = self._release()
        if client is not None:
            await client.aclose()

    def _release(self) -> RelayClient | None:
        lease, self._lease = self._lease, None
        return lease.release() if lease is not None and lease.held_by(self) else None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

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
        """The shared sampling, with per-call overrides (``temperature=0``, ...); a value out
        of vLLM's range fails here, naming the field."""
        base = self.relay_config().sampling
        given = {k: v for k, v in overrides.items() if v is not None}
        if not given:
            return base
        return SamplingConfig.model_validate({**base.model_dump(exclude_unset=True), **given})

    def chat_request(
        self, messages: Sequence[Message], call: Mapping[str, Any], **fields: Any
    ) -> ChatRequest:
        """A chat turn from a framework call's keyword arguments.

        `call` may hold sampling overrides (``temperature``, ``top_p``, ``top_k``, ``min_p``,
        the penalties, ``seed``, ``max_tokens``), ``stop``, ``chat_template_kwargs`` and
        ``extra_body`` (vLLM fields for both models' requests); anything else is refused with
        what to use instead. `fields` are the request fields the adapter has already
        translated (``tools``, ``tool_choice``, ``parallel_tool_calls``, ``response_format``).
        """
        call = self._renamed(call)
        unknown = set(call) - CALL_ARGUMENTS - set(fields)
        if unknown:
            raise TypeError(
                unknown_names_message(
                    type(self).__name__,
                    "the call arguments",
                    unknown,
                    sorted(CALL_ARGUMENTS | set(fields)),
                    self.refused_fields,
                )
            )
        extra_body = dict(call.get("extra_body") or {})
        check_extra_body(extra_body, "extra_body", MODEL_SAMPLING_FIELDS)
        stop = call.get("stop")
        try:
            sampling = self.sampling(**{k: call.get(k) for k in SAMPLING_ARGUMENTS})
        except ValidationError as invalid:
            raise ValueError(str(invalid)) from None
        return ChatRequest(
            messages=messages,
            stop=stop if stop is not None else (self.stop or ()),
            sampling=sampling,
            chat_template_kwargs={
                **self.chat_template_kwargs,
                **(call.get("chat_template_kwargs") or {}),
            },
            extra_body=extra_body,
            **fields,
        )

    def _build_config(self, environment: RelayEnvironment) -> RelayConfig:
        data = copy.deepcopy(environment.values)  # RELAY_API_KEY under each endpoint there
        given = {name: getattr(self, name) for name in self.model_fields_set}
        if self.api_key is not None and (
            self.api_key.get_secret_value() == environment.shared_api_key
        ):
            del given["api_key"]  # from RELAY_API_KEY: RELAY_LARGE__API_KEY still wins over it
        for role in MODEL_ROLES:
            endpoint = data.setdefault(role, {})
            for name, key in _SHARED_ENDPOINT_FIELDS.items():
                if given.get(name) is not None:
                    endpoint[key] = _merged(endpoint.get(key), given[name])
            for name, (field_role, key) in _ROLE_FIELDS.items():
                if field_role == role and given.get(name) is not None:
                    endpoint[key] = given[name]
            for key, value in getattr(self, role).items():
                endpoint[key] = _merged(endpoint.get(key), value)
        sampling = data.setdefault("sampling", {})
        sampling.update({k: given[k] for k in SAMPLING_ARGUMENTS if k in given})
        for name in _TOP_FIELDS:
            if given.get(name) is not None:
                data[name] = _merged(data.get(name), given[name])  # a policy merges by field
        return RelayConfig.model_validate(data)


def _merged(base: Any, value: Any) -> Any:
    """Dicts (headers, body fields, a model's sampling) merge key by key; other values replace."""
    if isinstance(base, Mapping) and isinstance(value, Mapping):
        return {**base, **value}
    if isinstance(base, Mapping) and isinstance(value, BaseModel):
        return {**base, **value.model_dump(exclude_unset=True)}
    return value


def _shown(name: str, value: Any) -> Any:
    """The value of the field `name` as it may be printed (:func:`shown_endpoint_field`)."""
    if name in MODEL_ROLES and isinstance(value, Mapping):
        return {key: shown_endpoint_field(key, v) for key, v in value.items()}
    if name in _ENDPOINT_FIELD_OF:
        return shown_endpoint_field(_ENDPOINT_FIELD_OF[name], value)
    return value


def _fingerprint(settings: BaseModel, names: Iterable[str]) -> Hashable:
    """The current values of `names` (and which were given), comparable and hashable:
    secrets by value, objects by identity. Cheap enough to take before every request, so
    that a change made in any way (assignment, ``model_copy``, a dict field edited in place)
    reaches the next one."""
    given = settings.model_fields_set
    return tuple((name in given, _comparable(getattr(settings, name))) for name in names)


def _comparable(value: Any) -> Hashable:
    if isinstance(value, SecretStr):
        return ("secret", value.get_secret_value())
    if isinstance(value, BaseModel):
        return (type(value), _comparable(dict(value)))
    if isinstance(value, Mapping):
        return tuple(sorted((str(k), _comparable(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return tuple(_comparable(v) for v in value)
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return ("object", id(value))
