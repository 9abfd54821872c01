"""Whether two vLLM servers are ready for the relay: a checklist from probing both of them.

Every probe is a request the relay itself sends, through the relay's own endpoints::

    report = await check_servers(config)  # check_servers_sync(config) from sync code
    for item in report.items:
        print(item.status, item.title, item.found, item.fix or "")
    report.breaks_relay  # True when something would stop generations (relaygen check: 1)

- ``/v1/models``: each server serves its named model; its context window (``max_model_len``);
- ``/v1/completions`` with every stop string of a reasoning turn: vLLM refuses more than its
  limit (4 unless ``VLLM_MAX_STOP_STRINGS`` says otherwise) and the endpoint learns the limit
  from the refusal, as in a generation;
- the same long prompt twice (several cache blocks: 128 tokens on a CPU, 16 on a GPU):
  whether usage reports cached prompt tokens, and whether the second request found them;
- ``/tokenize`` and ``/detokenize`` of one conversation (or the given renderer): how each
  server's chat template renders the same messages;
- a text the small model must continue (``echo`` off, as every relay turn), as it continues
  the large model's text;
- the cue artifact's model pair against the served models;
- the prompt path: token ids (the rendered chat's ids in a ``/v1/completions`` prompt, each
  piece's ids returned) or text, and why.

A ``problem`` would stop or fail generations; a ``warning`` costs speed or quality, or needs
a look (two chat templates); ``unknown`` could not be checked.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping
from contextlib import aclosing
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, computed_field

from ..upstream.config import MODEL_ROLES, ModelRole
from ..upstream.endpoint import (
    CompletionRequest,
    Endpoint,
    ModelInfo,
    TokenPrompt,
    UpstreamFailure,
)
from ..upstream.errors import RelayError
from ..upstream.rendering import (
    ChatInput,
    PromptRenderer,
    RenderedIds,
    RenderedPrompt,
    TokenRenderer,
)
from .config import ReasoningMarkers, RelayConfig
from .reasoning import PromptReasoning
from .switcher import RelaySwitcher
from .sync import shared_loop

CheckStatus = Literal["ok", "warning", "problem", "unknown"]
CheckName = Literal[
    "server",
    "stop_strings",
    "cached_tokens",
    "context_windows",
    "chat_templates",
    "cue_artifact",
    "continuation",
    "prefix_caching",
    "prompt_path",
]

CONVERSATION = [
    {"role": "system", "content": "You are a careful assistant."},
    {"role": "user", "content": "What is 17 * 23?"},
]
"""What both servers' chat templates render, to compare them."""

STOP_PROBE_PROMPT = "The relay checks how many stop strings this server takes."
CONTINUATION_PREFIX = "Counting from one to ten: one, two, three, four,"
CACHE_PROBE_LINES = 40
"""Lines of the prompt sent twice: about 500 tokens, over three 128-token blocks."""
SHOWN_CHARACTERS = 40


class CheckItem(BaseModel):
    """One line of the checklist: what was checked, what was found, and the fix if not ok."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    check: CheckName
    role: ModelRole | None = None
    """The server it is about; None for an item about both."""
    status: CheckStatus
    found: str
    fix: str | None = None

    @property
    def title(self) -> str:
        """``large stop strings``, ``chat templates``, ..."""
        name = self.check.replace("_", " ")
        return f"{self.role} {name}" if self.role else name


class ServerReport(BaseModel):
    """The checklist of :func:`check_servers`, in a fixed order. Its JSON carries
    ``breaks_relay`` too, which loading it again recomputes."""

    model_config = ConfigDict(frozen=True)

    items: list[CheckItem]

    @computed_field  # type: ignore[prop-decorator]
    @property
    def breaks_relay(self) -> bool:
        """Whether a problem would stop or fail the relay's generations."""
        return any(item.status == "problem" for item in self.items)

    def item(self, check: CheckName, role: ModelRole | None = None) -> CheckItem:
        """The item of `check` (for `role`, if it is about one server)."""
        return next(i for i in self.items if i.check == check and i.role == role)


async def check_servers(
    config: RelayConfig, *, renderer: PromptRenderer | None = None
) -> ServerReport:
    """Probe the two servers of `config` and list what would help or hurt the relay.

    `renderer` is the relay's (default: each server's own chat template). Raises
    :class:`~relay_integrations.relay.errors.CueArtifactError` when ``config.cues`` cannot be
    loaded, as the relay would.
    """
    async with RelaySwitcher(config, renderer=renderer) as relay:
        probe_id = f"relay-check-{uuid.uuid4().hex}"
        served = await asyncio.gather(*(_served(relay.endpoints[role]) for role in MODEL_ROLES))
        infos = {role: info for role, (_, info) in zip(MODEL_ROLES, served, strict=True) if info}
        probed = await asyncio.gather(
            *(_probe(relay, role, probe_id) for role in MODEL_ROLES if role in infos)
        )
        found = {result.role: result for result in probed}
    items = [item for item, _ in served]
    for check in ("stop_strings", "cached_tokens"):
        items += [_item_of(found, role, check) for role in MODEL_ROLES]
    items.append(_context_windows(infos))
    items.append(_chat_templates(found, config.markers))
    items.append(_cue_artifact(relay, infos))
    items.append(_item_of(found, "small", "continuation"))
    items += [_item_of(found, role, "prefix_caching") for role in MODEL_ROLES]
    items.append(_prompt_path(relay, found))
    return ServerReport(items=items)


def check_servers_sync(
    config: RelayConfig, *, renderer: PromptRenderer | None = None
) -> ServerReport:
    """:func:`check_servers` from sync code (also inside a running event loop)."""
    return shared_loop().run(check_servers(config, renderer=renderer))


@dataclass(frozen=True)
class _Probed:
    """What the probes of one server found."""

    role: ModelRole
    rendered: RenderedPrompt | RelayError
    items: Mapping[CheckName, CheckItem]
    token_ids: RenderedIds | _TokenTrouble | None = None
    """On the token path: the chat's ids, when a prompt of them was continued with the ids
    of what was written; else what went wrong."""


async def _served(endpoint: Endpoint) -> tuple[CheckItem, ModelInfo | None]:
    role, config = endpoint.role, endpoint.config
    try:
        info = await endpoint.model_info()
    except UpstreamFailure as failure:
        fix = f"start the {role} vLLM server, or correct its URL or key as the message says"
        return _problem("server", role, failure.detail, fix), None
    except RelayError as wrong_model:  # it answers, but serves other models
        fix = (
            f"name one of the served models as the {role} model, or serve {config.model!r} "
            "there (vLLM --served-model-name)"
        )
        return _problem("server", role, str(wrong_model), fix), None
    origin = f" ({info.root})" if info.root and info.root != info.id else ""
    found = f"{config.base_url} serves {info.id}{origin}"
    return CheckItem(check="server", role=role, status="ok", found=found), info


async def _probe(relay: RelaySwitcher, role: ModelRole, probe_id: str) -> _Probed:
    endpoint = relay.endpoints[role]
    headers = {relay.config.session_header: probe_id}  # a router keeps the probes together
    sampling = relay.config.sampling.request_fields(endpoint.config.sampling)
    try:
        rendered: RenderedPrompt | RelayError = await relay.renderer.render(
            endpoint, ChatInput(list(CONVERSATION))
        )
    except RelayError as failed:
        rendered = failed
    stops = relay.reasoning_stops(role)
    items: dict[CheckName, CheckItem] = {
        "stop_strings": await _stop_strings(endpoint, stops, headers)
    }
    items["cached_tokens"], items["prefix_caching"] = await _prefix_cache(
        endpoint, relay.config.session_header, probe_id
    )
    if role == "small":
        items["continuation"] = await _continuation(endpoint, sampling, headers)
    token_ids = None
    if relay.prompt_path == "tokens":
        token_ids = await _token_prompt(endpoint, relay.renderer, headers)
    return _Probed(role, rendered, items, token_ids)


@dataclass(frozen=True)
class _TokenTrouble:
    """What went wrong with a prompt of token ids; `breaks`: a generation would fail."""

    found: str
    breaks: bool


async def _token_prompt(
    endpoint: Endpoint, renderer: PromptRenderer, headers: Mapping[str, str]
) -> RenderedIds | _TokenTrouble:
    """The conversation's ids, continued by two tokens from a prompt of them; or what went
    wrong (a refused prompt of ids, pieces without the ids they wrote)."""
    assert isinstance(renderer, TokenRenderer)
    try:
        rendered = await renderer.render_ids(endpoint, ChatInput(list(CONVERSATION)))
        request = CompletionRequest(TokenPrompt(rendered.ids), max_tokens=2, headers=headers)
        async with aclosing(endpoint.stream_completion(request)) as pieces:
            written = [piece async for piece in pieces if piece.text]
    except RelayError as failed:
        detail = failed.detail if isinstance(failed, UpstreamFailure) else str(failed)
        return _TokenTrouble(f"a prompt of token ids failed: {detail}", breaks=True)
    if any(piece.token_ids is None for piece in written):
        return _TokenTrouble(
            "its pieces do not carry the ids they wrote (return_token_ids): the model's own "
            "text is tokenized again with its next request",
            breaks=False,
        )
    return rendered


@dataclass(frozen=True)
class _Completed:
    text: str
    prompt_tokens: int | None
    cached_tokens: int | None
    finish_reason: str | None


async def _complete(endpoint: Endpoint, request: CompletionRequest) -> _Completed:
    """One completion through the relay's endpoint: its text and its final usage."""
    text, finish, usage = "", None, None
    async with aclosing(endpoint.stream_completion(request)) as pieces:
        async for piece in pieces:
            text += piece.text
            finish = piece.finish_reason or finish
            if piece.usage_only:
                usage = piece
    prompt_tokens = usage.prompt_tokens if usage else None
    return _Completed(text, prompt_tokens, usage.cached_tokens if usage else None, finish)


async def _stop_strings(
    endpoint: Endpoint, stops: tuple[str, ...], headers: Mapping[str, str]
) -> CheckItem:
    role, wanted = endpoint.role, len(stops)
    request = CompletionRequest(STOP_PROBE_PROMPT, max_tokens=1, stop=stops, headers=headers)
    try:
        await _complete(endpoint, request)
    except RelayError as failed:
        return _failed_request("stop_strings", endpoint, failed)
    limit = endpoint.stop_limit
    if limit is None or limit >= wanted:
        found = f"takes all {wanted} stop strings of a {role} turn in one request"
        return CheckItem(check="stop_strings", role=role, status="ok", found=found)
    configured = endpoint.config.max_stop_strings is not None
    said = f"max_stop_strings={limit} is configured" if configured else f"the server takes {limit}"
    found = (
        f"{said} of the {wanted} stop strings of a {role} turn: the relay sends the first "
        f"{limit} and finds the others in the stream, closing the request there (vLLM aborts it)"
    )
    fix = "start the vLLM server with VLLM_MAX_STOP_STRINGS=1024 in its environment"
    if configured:
        fix += f", and raise the {role} endpoint's max_stop_strings (or leave it unset)"
    return CheckItem(check="stop_strings", role=role, status="warning", found=found, fix=fix)


async def _prefix_cache(
    endpoint: Endpoint, session_header: str, probe_id: str
) -> tuple[CheckItem, CheckItem]:
    """(cached_tokens, prefix_caching): the same new prompt twice, one token each, both with
    the relay's session header (a router keeps them on one replica)."""
    role, headers = endpoint.role, {session_header: probe_id}
    lines = (f"Line {n}: the relay sends this prompt twice." for n in range(CACHE_PROBE_LINES))
    prompt = f"{probe_id}\n" + "\n".join(lines)
    request = CompletionRequest(prompt, max_tokens=1, headers=headers)
    try:
        first = await _complete(endpoint, request)
        second = await _complete(endpoint, request) if first.cached_tokens is not None else None
    except RelayError as failed:
        item = _failed_request("cached_tokens", endpoint, failed)
        return item, _not_checked("prefix_caching", role, "its requests failed")
    if second is None:
        found = (
            "usage has no cached prompt tokens (prompt_tokens_details): the relay's cached-token "
            "counts are unknown (None)"
        )
        fix = "start the vLLM server with --enable-prompt-tokens-details"
        reporting = CheckItem(
            check="cached_tokens", role=role, status="warning", found=found, fix=fix
        )
        unknown = CheckItem(
            check="prefix_caching",
            role=role,
            status="unknown",
            found="cannot tell: the server does not report cached prompt tokens",
            fix=fix + " to check it",
        )
        return reporting, unknown
    reporting = CheckItem(
        check="cached_tokens",
        role=role,
        status="ok",
        found="usage reports cached prompt tokens (prompt_tokens_details.cached_tokens)",
    )
    sent = f"a {second.prompt_tokens}-token prompt sent twice: {second.cached_tokens} tokens"
    if second.cached_tokens:
        found = f"{sent} came from the prefix cache the second time"
        return reporting, CheckItem(check="prefix_caching", role=role, status="ok", found=found)
    fix = (
        "leave prefix caching on (vLLM's default: drop --no-enable-prefix-caching); behind a "
        f"router, route by the relay's session header ({session_header}) to keep a generation "
        "on one replica"
    )
    found = f"{sent} cached the second time: each switch prefills the whole text again"
    caching = CheckItem(check="prefix_caching", role=role, status="warning", found=found, fix=fix)
    return reporting, caching


async def _continuation(
    endpoint: Endpoint, sampling: Mapping[str, object], headers: Mapping[str, str]
) -> CheckItem:
    request = CompletionRequest(
        CONTINUATION_PREFIX, max_tokens=8, sampling=dict(sampling), headers=headers
    )
    try:
        done = await _complete(endpoint, request)
    except RelayError as failed:
        return _failed_request("continuation", endpoint, failed)
    if not done.text.strip():
        found = (
            f"wrote nothing after {CONTINUATION_PREFIX!r} (finish reason {done.finish_reason}): "
            "a small model that ends at once hands every sentence straight back"
        )
        fix = "check the small model and its generation_config (end-of-sequence tokens)"
        return CheckItem(check="continuation", role="small", status="warning", found=found, fix=fix)
    found = f"continued {_shown(CONTINUATION_PREFIX)} with {_shown(done.text)}"
    return CheckItem(check="continuation", role="small", status="ok", found=found)


def _context_windows(infos: Mapping[ModelRole, ModelInfo]) -> CheckItem:
    if len(infos) < len(MODEL_ROLES):
        return _not_checked("context_windows", None, "a server did not answer")
    large, small = infos["large"].max_model_len, infos["small"].max_model_len
    if large is None or small is None:
        silent = " and ".join(r for r in MODEL_ROLES if infos[r].max_model_len is None)
        found = f"the {silent} server does not say its max_model_len in /v1/models"
        return CheckItem(check="context_windows", status="unknown", found=found)
    found = f"large {large} tokens, small {small} tokens"
    if small >= large:
        return CheckItem(check="context_windows", status="ok", found=found)
    found += (
        ": the small model continues the large model's text, so a generation that outgrows "
        f"{small} tokens leaves it no room and ends there (finish reason 'length')"
    )
    fix = f"serve the small model with --max-model-len {large} (or more)"
    return CheckItem(check="context_windows", status="warning", found=found, fix=fix)


def _chat_templates(found: Mapping[ModelRole, _Probed], markers: ReasoningMarkers) -> CheckItem:
    if len(found) < len(MODEL_ROLES):
        return _not_checked("chat_templates", None, "a server did not answer")
    failed = {r: p.rendered for r, p in found.items() if isinstance(p.rendered, RelayError)}
    if failed:
        said = "; ".join(f"{role}: {error}" for role, error in failed.items())
        fix = (
            "serve each model with a chat template (vLLM --chat-template), or give the relay a "
            "renderer (JinjaChatTemplate)"
        )
        found_text = f"the conversation could not be rendered ({said})"
        return _problem("chat_templates", None, found_text, fix)
    large, small = (
        p.rendered.text for p in found.values() if isinstance(p.rendered, RenderedPrompt)
    )
    if large == small:
        same = f"both servers render the same {len(large)}-character prompt for the same messages"
        return CheckItem(check="chat_templates", status="ok", found=same)
    return CheckItem(
        check="chat_templates",
        status="warning",
        found=_difference(large, small, markers),
        fix="none for a pair from two model families, as long as each server uses its own "
        "model's template (vLLM's default); for one family, serve both with the same "
        "--chat-template",
    )


def _difference(large: str, small: str, markers: ReasoningMarkers) -> str:
    """Where two renderings of the same messages part, and how each opens the reasoning."""
    at = next((i for i, (a, b) in enumerate(zip(large, small, strict=False)) if a != b), None)
    at = min(len(large), len(small)) if at is None else at
    line = large.rfind("\n", 0, at) + 1  # from the start of the line where they part
    differs = (
        f"the same messages render differently from character {at}: large "
        f"{_shown(large[line:])}, small {_shown(small[line:])}"
    )
    large_mode, small_mode = (PromptReasoning.of(text, markers) for text in (large, small))
    if large_mode is not small_mode:
        differs += (
            f"; the large prompt {_REASONING_OPENER[large_mode]}, the small one "
            f"{_REASONING_OPENER[small_mode]}"
        )
    return differs


_REASONING_OPENER = {
    PromptReasoning.OPEN: "opens the reasoning itself",
    PromptReasoning.MODEL_OPENS: "leaves the reasoning to the model to open",
    PromptReasoning.CLOSED: "closes the reasoning (thinking off)",
}


def _prompt_path(relay: RelaySwitcher, found: Mapping[ModelRole, _Probed]) -> CheckItem:
    """Whether the pair's prompts go as token ids or as text, and why."""
    if relay.prompt_path == "text":
        if relay.config.prompt_path == "text":
            return CheckItem(
                check="prompt_path", status="ok", found="text, as configured (prompt_path)"
            )
        found_text = (
            f"text: the renderer ({type(relay.renderer).__name__}) renders text, so every "
            "request sends the whole context as text and each server tokenizes it again"
        )
        fix = "serve both models with vLLM (its /tokenize) and keep the default renderer"
        return CheckItem(check="prompt_path", status="warning", found=found_text, fix=fix)
    if len(found) < len(MODEL_ROLES):
        return _not_checked("prompt_path", None, "a server did not answer")
    wrong = {
        role: probed.token_ids
        for role, probed in found.items()
        if isinstance(probed.token_ids, _TokenTrouble)
    }
    if wrong:
        said = "; ".join(f"{role}: {trouble.found}" for role, trouble in wrong.items())
        fix = "serve both models with a vLLM that takes and returns token ids (0.32 does)"
        if any(trouble.breaks for trouble in wrong.values()):
            fix += ", or set prompt_path='text'"
            return _problem("prompt_path", None, f"token ids do not work ({said})", fix)
        found_text = f"token ids, with the text tokenized again ({said})"
        return CheckItem(check="prompt_path", status="warning", found=found_text, fix=fix)
    large, small = (found[role].token_ids for role in MODEL_ROLES)
    found_text = "token ids: each request sends ids the server has seen, and a short text"
    if large == small:
        found_text += (
            "; both servers render the chat to the same ids (one tokenizer): each model "
            "continues from the other's own ids, and only the last token of a stop is tokenized "
            "again"
        )
    else:
        found_text += (
            "; the servers render the chat to different ids (two tokenizers): each hand-off "
            "tokenizes the other model's new text, once, on the next model's server"
        )
    return CheckItem(check="prompt_path", status="ok", found=found_text)


def _cue_artifact(relay: RelaySwitcher, infos: Mapping[ModelRole, ModelInfo]) -> CheckItem:
    cues, pair = relay.cues, relay.cues.model_pair
    if pair is None:
        found = f"cues given as a list ({len(cues.cues)}) record no model pair to compare"
        return CheckItem(check="cue_artifact", status="ok", found=found)
    if len(infos) < len(MODEL_ROLES):
        return _not_checked("cue_artifact", None, "a server did not answer")
    mismatches = [
        mismatch
        for role, info in infos.items()
        if (mismatch := pair.mismatch(role, info.id, info.root)) is not None
    ]
    if not mismatches:
        found = f"{cues.source} was calibrated for {pair.large.model} and {pair.small.model}"
        return CheckItem(check="cue_artifact", status="ok", found=found)
    found = f"{cues.source}: " + "; ".join(mismatches)
    calibrate = "calibrate this pair (relaygen calibrate) and use its artifact"
    if relay.config.allow_model_mismatch:
        found += ": the relay uses it anyway (allow_model_mismatch)"
        return CheckItem(check="cue_artifact", status="warning", found=found, fix=calibrate)
    found += ": the relay refuses it"
    fix = f"{calibrate}, or use this one anyway (--allow-model-mismatch, allow_model_mismatch=True)"
    return _problem("cue_artifact", None, found, fix)


def _item_of(found: Mapping[ModelRole, _Probed], role: ModelRole, check: CheckName) -> CheckItem:
    """`role`'s item of `check`, or "not checked" when its server did not answer."""
    if role not in found:
        return _not_checked(check, role, f"the {role} server did not answer")
    return found[role].items[check]


def _not_checked(check: CheckName, role: ModelRole | None, why: str) -> CheckItem:
    return CheckItem(check=check, role=role, status="unknown", found=f"not checked: {why}")


def _failed_request(check: CheckName, endpoint: Endpoint, failed: RelayError) -> CheckItem:
    role = endpoint.role
    detail = failed.detail if isinstance(failed, UpstreamFailure) else str(failed)
    fix = f"read the {role} vLLM server's log: the relay sends every {role} turn as such a request"
    return _problem(check, role, f"a /v1/completions request failed: {detail}", fix)


def _problem(check: CheckName, role: ModelRole | None, found: str, fix: str) -> CheckItem:
    return CheckItem(check=check, role=role, status="problem", found=found, fix=fix)


def _shown(text: str) -> str:
    """The start of `text`, quoted, with its line breaks visible."""
    return repr(text[:SHOWN_CHARACTERS]) + ("..." if len(text) > SHOWN_CHARACTERS else "")
