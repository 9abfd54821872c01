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

import dataclasses
import difflib
import functools
import json
import os
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ..upstream.config import MODEL_ROLES, EndpointConfig, Frozen, ModelRole, SamplingConfig
from ..upstream.headers import check_header_name

Phase = Literal["reasoning", "answer"]
PromptPath = Literal["auto", "tokens", "text"]
"""How a relay sends its prompts (:attr:`RelayConfig.prompt_path`)."""

RequestHook = Callable[[ModelRole, Phase, str], Mapping[str, Any]]
"""Extra request fields per request, from (model, phase, transcript so far); e.g. the
forcing hooks of :mod:`relay_integrations.testing`."""

CONTEXT_MARGIN = 16
"""Tokens kept free below a context window: text re-tokenized across models may grow."""

DEADLINE_MARGIN = 60.0
"""Seconds of the default recovery deadline past ``resume_wait_seconds``: the retries on
either side of a restart (the endpoint honours a ``Retry-After`` of up to a minute)."""


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
        "nothing yet fails at once (0: always at once). Within deadline_seconds",
    )
    deadline_seconds: float | None = Field(
        default=None,
        ge=0,
        description="Most seconds one generation spends recovering from failures, in all: "
        "from a failure it meets (a request failed beyond its retries, a stream that broke) "
        "until a request gives text again, and every retry's wait (backoff, Retry-After). "
        "Past it the generation fails with its partial result, and the error says what the "
        "time went on. None: resume_wait_seconds + 60 (a restart, and a minute for the "
        "retries around it); not less than resume_wait_seconds when both are given",
    )
    speculative_handoff: bool = Field(
        default=True,
        description="Open the next model's request when the text reaches a hand-off that waits "
        "only for its confirming token (' Now' before ' Now ', a sentence mark before its "
        "space), so its prefill overlaps that token; closed unused when the token continues "
        "the word or sentence. The text is the same either way",
    )
    speculative_handoff_max_tokens: int | None = Field(
        default=8192,
        ge=1,
        description="Open a hand-off's request ahead only while the context it carries (the "
        "model's rendered prompt and the tokens written so far) is at most this many tokens; "
        "None: at any length. A request opened ahead and closed unused costs its server a "
        "parse and a prefill step that grow with the context, while one used saves at most "
        "one decoding step of the other model, whatever the length",
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

    @property
    def deadline(self) -> float:
        """The generation's recovery deadline in seconds: ``deadline_seconds``, or by default
        ``resume_wait_seconds`` and a minute (derived here, so that a copy with another
        ``resume_wait_seconds`` cannot keep a stale one)."""
        if self.deadline_seconds is not None:
            return self.deadline_seconds
        return self.resume_wait_seconds + DEADLINE_MARGIN

    @model_validator(mode="after")
    def _waits_within_the_deadline(self) -> SwitchPolicy:
        """Refuse a wait for a server longer than the deadline it is part of, when both are
        given: one of the two is not what was meant."""
        given = self.model_fields_set
        if "resume_wait_seconds" in given and self.deadline < self.resume_wait_seconds:
            raise ValueError(
                f"policy.deadline_seconds ({self.deadline:g}) is shorter than "
                f"policy.resume_wait_seconds ({self.resume_wait_seconds:g}), which it bounds: "
                "the wait for a server is part of the time a generation may spend recovering. "
                "Raise deadline_seconds or lower resume_wait_seconds."
            )
        return self


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
    prompt_path: PromptPath = Field(
        default="auto",
        description="How prompts are sent: 'tokens' (each model's own token ids, and only "
        "text no id stands for yet: the servers tokenize no context twice), 'text' (the "
        "rendered prompt and the transcript as text, which every server tokenizes again), "
        "or 'auto' (tokens where the renderer gives ids: the servers' own chat templates)",
    )
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
        Keyword overrides win over the environment. A variable that does not validate is a
        ``ValueError`` naming it; one that looks meant for the relay but names no field
        (``RELAY_TEMPERATURE``) is a :class:`RelayEnvironmentWarning` naming the close match
        (see :meth:`RelayEnvironment.read`).
        """
        return cls.model_validate({**cls.env_values(prefix, environ), **overrides})

    @classmethod
    def env_values(
        cls, prefix: str = "RELAY_", environ: Mapping[str, str] | None = None
    ) -> dict[str, Any]:
        """The raw, not yet validated, nested values that :meth:`from_env` reads."""
        return RelayEnvironment.read(prefix, environ).values


class RelayEnvironmentWarning(UserWarning):
    """A ``RELAY_*`` variable that looks meant for the relay's configuration but that no field
    reads (``RELAY_TEMPERATURE`` for ``RELAY_SAMPLING__TEMPERATURE``), or a ``RELAY_SERVER_*``
    variable that is none of ``relaygen serve``'s settings (``RELAY_SERVER_MAX_CONECTIONS``
    for ``RELAY_SERVER_MAX_CONNECTIONS``)."""


@dataclass(frozen=True)
class RelayEnvironment:
    """The ``RELAY_*`` variables, read once (the one place the environment is read): the
    nested values :meth:`RelayConfig.from_env` validates, ``RELAY_API_KEY`` already under
    each endpoint that has no key of its own, and ``RELAY_API_KEY`` itself::

        env = RelayEnvironment.read()
        env.values["large"]["base_url"]  # RELAY_LARGE__BASE_URL

    Its repr shows neither: they hold the keys and headers.
    """

    values: dict[str, Any] = dataclasses.field(repr=False)
    shared_api_key: str | None = dataclasses.field(repr=False)

    @classmethod
    def read(
        cls, prefix: str = "RELAY_", environ: Mapping[str, str] | None = None
    ) -> RelayEnvironment:
        """Read and check every variable of the configuration.

        A value that does not validate (not JSON where JSON is needed, a wrong type, out of
        range, a field that does not exist under a known one such as
        ``RELAY_LARGE__BASE_UR``) raises a ``ValueError`` that names each such variable and
        the reason (never the value: it may be a key). Values are checked field by field
        here; whether the whole configuration is complete is for its user to say.

        Other programs' ``RELAY_*`` variables are left alone (the test suite's
        ``RELAY_TEST_*``, ``RELAY_VLLM_*``, ...; ``RELAY_SERVER_*`` belong to ``relaygen
        serve``). An unknown name is warned about (:class:`RelayEnvironmentWarning`, with
        the close match) only when it looks meant for the configuration: it has the nesting
        ``__``, or its name is a field's (``RELAY_TEMPERATURE``, ``RELAY_BASE_URL``), or it is
        one or two letters from a variable's (``RELAY_CUE``).
        """
        env = os.environ if environ is None else environ
        data: dict[str, Any] = {}
        sources: dict[tuple[str, ...], str] = {}
        problems: list[str] = []
        # a whole object first (RELAY_LARGE='{...}'), so that the nested ones go into it
        for key, raw in sorted(env.items(), key=lambda item: (item[0].count("__"), item[0])):
            if not key.startswith(prefix) or key == prefix + "API_KEY":
                continue
            path = tuple(key[len(prefix) :].lower().split("__"))
            if path[0] not in RelayConfig.model_fields:
                if not key.startswith(prefix + "SERVER_"):
                    _warn_if_meant_for_us(key, prefix)
                continue
            try:
                value = _parse_env_value(raw)
            except json.JSONDecodeError as bad:
                problems.append(
                    f"{key}: not JSON ({bad.msg} at character {bad.pos}); a list or a dict "
                    """is written as JSON, e.g. '{"x-tenant": "acme"}' or '["a", "b"]'"""
                )
                continue
            target = data
            for depth, part in enumerate(path[:-1]):
                target = target.setdefault(part, {})
                if not isinstance(target, dict):  # RELAY_LARGE set to a value, not nested
                    owner = _owner(sources, path[: depth + 1])
                    problems.append(f"{key}: {owner} already sets {'.'.join(path[: depth + 1])}")
                    break
            else:
                target[path[-1]] = value
                sources[path] = key
        problems += _relay_variables(prefix).invalid(data, sources)
        if problems:
            raise ValueError("invalid environment variables: " + "; ".join(problems))
        shared_key = env.get(prefix + "API_KEY") or None
        if shared_key:
            for role in MODEL_ROLES:
                data.setdefault(role, {}).setdefault("api_key", shared_key)
        return cls(data, shared_key)


@dataclass(frozen=True)
class EnvironmentVariables:
    """The environment variables of a pydantic model's fields: `prefix` and the field's name in
    capitals, a nested model's fields after ``__`` (``RELAY_LARGE__BASE_URL``). Both
    :meth:`RelayEnvironment.read` and ``ServerSettings.from_env`` (``RELAY_SERVER_*``) check
    their variables with one, so that an error names the variable and a warning the close
    match the same way::

        variables = EnvironmentVariables(RelayConfig, "RELAY_", "the relay's configuration")
        variables.close("RELAY_TEMPRATURE")  # "; did you mean RELAY_SAMPLING__TEMPERATURE?"
    """

    model: type[BaseModel]
    prefix: str
    owner: str
    """What the variables configure, as the warning about an unknown one says it."""
    also: tuple[str, ...] = ()
    """Variables read besides the fields', by their name after the prefix (``"api_key"``)."""

    def known(self) -> dict[str, str]:
        """Every variable read, and its last field name: RELAY_LARGE__MODEL: model, ..."""
        return _known_variables(self.model, self.prefix, self.also)

    def close(self, key: str) -> str:
        """ "; did you mean X?" for the variable closest to `key` (those as close), else "":
        the one a letter or two away, or the least nested ones of the same field name (or of
        a field a letter or two away)."""
        return _close_hint(self.model, self.prefix, self.also, key)

    def warn_ignored(self, key: str, stacklevel: int = 2) -> None:
        """Warn (:class:`RelayEnvironmentWarning`) that `key` is none of the variables and is
        ignored, with the close match; `stacklevel` as :func:`warnings.warn`'s, from the
        caller."""
        warnings.warn(
            f"{key} is not a variable of {self.owner}, and is ignored{self.close(key)}",
            RelayEnvironmentWarning,
            stacklevel=stacklevel + 1,
        )

    def invalid(self, data: dict[str, Any], sources: Mapping[tuple[str, ...], str]) -> list[str]:
        """What is wrong with each variable's value, found by validating them all together
        (so that a field's own validators run) and naming the variable that set each field
        in error (`sources`: the variable of each field path), never the value. Missing
        fields and errors of the whole model are not any one variable's."""
        try:
            self.model.model_validate(data)
        except ValidationError as invalid:
            errors = invalid.errors(include_input=False, include_url=False)
        else:
            return []
        found = []
        for error in errors:
            loc = tuple(str(part) for part in error["loc"])
            key = _owner(sources, loc)
            if error["type"] == "missing" or key is None:
                continue
            if error["type"] == "extra_forbidden":
                meant = self.prefix + "__".join(loc).upper()  # the field's variable, as read
                hint = self.close(meant)
                found.append(f"{key}: {'.'.join(loc[:-1])} has no field {loc[-1]!r}{hint}")
            else:
                field = ".".join(loc)
                found.append(f"{key} (the field {field}): {error['msg']}")
        return found


@functools.lru_cache(maxsize=1024)
def _close_hint(model: type[BaseModel], prefix: str, also: tuple[str, ...], key: str) -> str:
    """:meth:`EnvironmentVariables.close`, worked out once for each variable: every model
    made reads the environment, and other programs' ``RELAY_*`` variables are in it each
    time."""
    known = _known_variables(model, prefix, also)
    name = key[len(prefix) :].lower()
    by_name = {variable[len(prefix) :].lower(): variable for variable in known}
    scores = _close_scores(name, by_name)
    best = max(scores.values(), default=0.0)
    close = [by_name[n] for n, score in scores.items() if score == best]
    if not close:
        field = name.rsplit("__", 1)[-1]
        near = difflib.get_close_matches(field, set(known.values()), n=1, cutoff=0.8)
        same = [variable for variable, f in known.items() if near and f == near[0]]
        close = [v for v in same if v.count("__") == min(x.count("__") for x in same)]
    return f"; did you mean {' or '.join(close)}?" if close else ""


@functools.cache
def _known_variables(model: type[BaseModel], prefix: str, also: tuple[str, ...]) -> dict[str, str]:
    """:meth:`EnvironmentVariables.known`, walked once for each model and prefix (a model is
    made often, and reads the environment each time)."""
    found = {prefix + name.upper(): name for name in also}

    def walk(model: type[BaseModel], name: str) -> None:
        for field, info in model.model_fields.items():
            variable = f"{name}{field.upper()}"
            found[variable] = field
            inner = [t for t in (info.annotation, *get_args(info.annotation)) if _is_model(t)]
            for nested in inner:
                walk(nested, variable + "__")

    walk(model, prefix)
    return found


def _close_scores(name: str, names: Iterable[str], cutoff: float = 0.8) -> dict[str, float]:
    """The similarity of each of `names` to `name` that reaches `cutoff`, found as
    ``difflib.get_close_matches`` finds them: the cheap upper bounds first, so that a
    variable far from all (another program's) costs little."""
    matcher = difflib.SequenceMatcher()
    matcher.set_seq2(name)
    scores = {}
    for other in names:
        matcher.set_seq1(other)
        if matcher.real_quick_ratio() >= cutoff and matcher.quick_ratio() >= cutoff:
            score = matcher.ratio()
            if score >= cutoff:
                scores[other] = score
    return scores


def _relay_variables(prefix: str) -> EnvironmentVariables:
    return EnvironmentVariables(RelayConfig, prefix, "the relay's configuration", ("api_key",))


def _owner(sources: Mapping[tuple[str, ...], str], loc: tuple[str, ...]) -> str | None:
    """The variable that set the field at `loc`: the one of the longest path above it."""
    above = [path for path in sources if loc[: len(path)] == path]
    return sources[max(above, key=len)] if above else None


def _is_model(kind: object) -> bool:
    return isinstance(kind, type) and issubclass(kind, BaseModel)


def _warn_if_meant_for_us(key: str, prefix: str) -> None:
    """Warn about `key` if it looks like a configuration variable (see
    :meth:`RelayEnvironment.read` for the rule); other programs' variables pass in silence."""
    variables = _relay_variables(prefix)
    if "__" in key[len(prefix) :] or variables.close(key):
        variables.warn_ignored(key, stacklevel=3)


def _parse_env_value(raw: str) -> Any:
    stripped = raw.strip()
    if stripped[:1] in ("[", "{"):
        return json.loads(stripped)
    return raw
