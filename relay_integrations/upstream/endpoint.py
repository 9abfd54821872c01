"""One upstream vLLM server: its kept-alive connections (:mod:`._http`), retries, concurrency.

Requests that fail before their first token (refused connection, 408/409/429, 5xx) are retried
with exponential backoff, honouring ``Retry-After``. A stream that breaks after it has produced
text raises :class:`StreamInterrupted` carrying that text, so the caller can resume instead of
starting over. A request that fails for good raises :class:`UpstreamFailure`, whose ``detail``
names the URL and the likely fix (a server that is not up, a base URL without ``/v1``, a wrong
key) next to vLLM's own message. Closing the iterator (or cancelling its task) closes the HTTP
response, and vLLM aborts the request::

    endpoint = Endpoint(EndpointConfig(base_url="http://127.0.0.1:8000/v1", model="qwen3"), "large")
    async for piece in endpoint.stream_completion(CompletionRequest(prompt="Hi", max_tokens=8)):
        print(piece.text, end="")
    await endpoint.aclose()
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import email.utils
import json
import logging
import re
import time
import urllib.parse
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, TypeVar

import openai
from pydantic import BaseModel, ValidationError
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt

from . import tracing
from ._failures import (
    ERROR_OBJECT,
    ServerDown,
    Tries,
    explain_broken_stream,
    explain_failure,
    is_outage,
    misfit,
    public_reason,
)
from ._http import (
    ClosedBeforeAnswer,
    HttpClient,
    HttpResponse,
    IncompleteStream,
    ReadTimeout,
    shown,
)
from ._stream_stops import StreamStops
from .answers import Tokenized
from .availability import Availability
from .completion import CompletionRequest as CompletionRequest
from .completion import StreamPiece as StreamPiece
from .completion import TokenPrompt as TokenPrompt
from .config import EndpointConfig, ModelRole
from .deadline import (
    current_deadline,
    sleep_within_deadline,
    stop_at_deadline,
    wait_within_deadline,
)
from .errors import RelayError, UpstreamKind
from .observer import RequestObserver

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)
logger = logging.getLogger(__name__)
RETRYABLE_STATUS = frozenset({408, 409, 429})
MAX_RETRY_AFTER = 60.0
KEPT_TEXT_CHARS = 32
"""Texts up to this long have their ids kept by :meth:`Endpoint.tokenize_text`, the last
:data:`KEPT_TEXTS` of them."""
KEPT_TEXTS = 1024


class StreamInterrupted(RelayError):
    """A stream broke after producing text; ``text`` is what arrived before the break."""

    def __init__(self, role: ModelRole, text: str, cause: BaseException) -> None:
        super().__init__(f"{role} stream broke after {len(text)} characters: {cause!r}")
        self.role = role
        self.text = text
        self.cause = cause

    @property
    def stalled(self) -> bool:
        """Whether it broke by stalling: nothing arrived for the read timeout."""
        error: BaseException | None = self.cause
        seen: set[int] = set()
        while error is not None and id(error) not in seen:
            if isinstance(error, ReadTimeout):
                return True
            seen.add(id(error))
            error = error.__cause__ or error.__context__
        return False


class UpstreamFailure(RelayError):
    """A request failed before its first token: after all retries, or with a final error.

    ``detail`` is the message for people (the URL, vLLM's own message, what to check);
    ``cause`` is the SDK's exception, for callers that decide by its type.
    """

    def __init__(
        self,
        role: ModelRole,
        cause: BaseException,
        detail: str | None = None,
        reason: str | None = None,
    ) -> None:
        self.detail = detail or str(cause)
        super().__init__(f"{role} endpoint failed: {self.detail}")
        self.role = role
        self.cause = cause
        self.reason = reason or str(cause)
        """Why, in words that name no address (what ``relaygen serve`` tells a client)."""

    @classmethod
    def broken(
        cls, broken: StreamInterrupted, config: EndpointConfig, breaks: int
    ) -> UpstreamFailure:
        """A turn that gave up after its stream broke `breaks` times, each after it had
        sent text: the detail names the URL, the breaks and what to check."""
        detail = explain_broken_stream(broken.cause, broken.role, config, breaks)
        times = "once" if breaks == 1 else f"{breaks} times"
        reason = f"its stream broke after sending text, {times} in one turn"
        return cls(broken.role, broken.cause, detail, reason)

    @property
    def outage(self) -> bool:
        """Whether the server is out (no connection, a 502/503/504, known down), not the
        request refused, the server slow, or a misfit on the way (TLS, a proxy's refusal, a
        response that broke HTTP, a URL it cannot use): a restart may bring it back."""
        return is_outage(self.cause)

    @property
    def kind(self) -> UpstreamKind:
        """How it failed, by the SDK's exception: refused (400), timed out, known down (its
        breaker open: :mod:`.availability`), or otherwise."""
        if isinstance(self.cause, openai.BadRequestError):
            return "rejected"
        if isinstance(self.cause, ServerDown):
            return "unavailable"
        if isinstance(self.cause, openai.APITimeoutError):
            return "timeout"
        return "failed"


class ModelInfo(BaseModel):
    """What ``GET /v1/models`` says about the served model."""

    id: str
    root: str | None = None
    max_model_len: int | None = None


class Endpoint:
    """A vLLM OpenAI-compatible server serving one model, shared by all generations."""

    def __init__(
        self, config: EndpointConfig, role: ModelRole, *, observer: RequestObserver | None = None
    ) -> None:
        self.config = config
        self.role: ModelRole = role
        self.observer = observer
        """Sees every streamed request (:class:`RequestObserver`): tracing, benchmarks."""
        self._http = HttpClient(config)
        self._api_path = urllib.parse.urlsplit(config.base_url).path.rstrip("/")
        self._root_path = urllib.parse.urlsplit(config.server_root).path.rstrip("/")
        self._slots = asyncio.Semaphore(config.max_concurrency)
        self.availability = Availability(
            role,
            config.base_url,
            self.probe,
            probe_interval=config.probe_interval,
            probe_timeout=config.connect_timeout,
            failures_to_open=config.failures_to_open,
        )
        """Whether the server is known down (a circuit breaker: :mod:`.availability`)."""
        self._model_info: ModelInfo | None = None
        self._tokenized: dict[str, tuple[int, ...]] = {}  # short texts' ids (tokenize_text)
        self._server_attributes: dict[str, Any] | None = None  # its spans' (made once)
        self.stop_limit: int | None = config.max_stop_strings
        """Stop strings the server takes per request: configured, or learned from its first
        refusal of a longer list; None while unknown (all are sent)."""

    async def aclose(self) -> None:
        await self.availability.aclose()
        await self._http.aclose()

    async def model_info(self) -> ModelInfo:
        """The served model's record from ``/v1/models`` (fetched once, then cached)."""
        if self._model_info is None:
            page = await self._with_retries(lambda: self._json("GET", self._api_path + "/models"))
            served = [m for m in page.get("data") or [] if isinstance(m, dict)]
            for model in served:
                if model.get("id") == self.config.model:
                    self._model_info = ModelInfo.model_validate(model, strict=False)
                    break
            else:
                raise RelayError(
                    f"{self.role} endpoint {self.config.base_url} does not serve model "
                    f"{self.config.model!r}; it serves {[m.get('id') for m in served]}"
                )
        return self._model_info

    async def probe(self) -> str:
        """Whether the server answers ``GET /v1/models``, once, on the endpoint's own
        connections: ``"ok"``, or why not (a health check's answer; bound it with
        ``asyncio.timeout``). It counts in the endpoint's breaker like any request (an answer
        closes it, an outage counts towards opening it); while the breaker is open it is sent
        only as the half-open trial, and otherwise says the server is known down."""
        try:
            trial = self.availability.admit()
        except ServerDown as down:
            return f"unreachable: {down.message}"
        try:
            with tracing.suppressed():  # a probe every few seconds: no trace of its own
                await self._json("GET", self._api_path + "/models")
        except openai.APIError as failed:
            reason = public_reason(failed, self.config)
            self.availability.record(failed, reason, trial=trial)
            if isinstance(failed, openai.APIStatusError):
                return f"answered {failed.status_code}"
            if isinstance(failed, openai.APIResponseValidationError):
                return "answered something that is not vLLM's OpenAI API"
            return f"unreachable: {reason}"
        except BaseException:  # cancelled (a health check's bound): it says nothing
            self.availability.abandoned(trial)
            raise
        self.availability.succeeded()
        return "ok"

    async def post_json(self, path: str, body: Mapping[str, Any], answer: type[M]) -> M:
        """POST to a path at the server root (``/tokenize``, ``/detokenize``), with retries;
        the answer validated as `answer` (:mod:`.answers`), or a :class:`RelayError` naming
        the URL and the fields that were wrong or missing (never their values)."""
        data = await self._with_retries(lambda: self._json("POST", self._root_path + path, body))
        try:
            return answer.model_validate(data)
        except ValidationError as wrong:
            fields = sorted({".".join(map(str, e["loc"])) or "the body" for e in wrong.errors()})
            url = self.config.server_root + path
            raise RelayError(
                f"{self.role} endpoint {url} answered what is not vLLM's answer there (wrong or "
                f"missing: {', '.join(fields)}): check that it is a vLLM server"
            ) from None

    async def tokenize_text(self, text: str) -> list[int]:
        """The ids of `text` alone in the served model's tokenizer (``POST /tokenize``, no
        special tokens added): what a :class:`TokenPrompt`'s text is sent as. Short texts
        are asked once (a text's ids alone do not change): a hand-off between two models of
        one tokenizer sends the same few (the end of a cue, a sentence's full stop)."""
        known = self._tokenized.get(text)
        if known is not None:
            return list(known)
        body = {"model": self.config.model, "prompt": text, "add_special_tokens": False}
        ids = (await self.post_json("/tokenize", body, Tokenized)).tokens
        if len(text) <= KEPT_TEXT_CHARS:
            if len(self._tokenized) >= KEPT_TEXTS:
                del self._tokenized[next(iter(self._tokenized))]  # the oldest
            self._tokenized[text] = tuple(ids)
        return ids

    async def _json(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> Any:
        span = None
        if tracing.tracer() is not None:
            span = tracing.start(f"{method} {path}", self._span_attributes(path), client=True)
        failure: BaseException | None = None
        try:
            async with self._slots:
                response = await self._http.request(
                    method, path, dict(body) if body else None, tracing.traceparent(span)
                )
                try:
                    return await response.json()
                finally:
                    await response.close()
        except BaseException as failed:
            failure = failed
            raise
        finally:
            tracing.finish(span, failure=failure)

    def _span_attributes(self, path: str) -> dict[str, Any]:
        """What a span of a request for `path` says of it (no header, no query, no user)."""
        if self._server_attributes is None:
            self._server_attributes = tracing.server_attributes(self.config.base_url)
        return {
            **self._server_attributes,
            "url.path": path,
            "relay.model.role": self.role,
            "gen_ai.request.model": self.config.model,
        }

    async def stream_completion(
        self, request: CompletionRequest
    ) -> AsyncGenerator[StreamPiece, None]:
        """Stream one completion. Retries until the first piece; see the module docstring.

        A request with more stop strings than the server takes has them all applied in the
        stream (:class:`StreamStops`): the pieces are what vLLM would have streamed with all
        of them (the text after the first stop string dropped, the stop kept or left out as
        the request's ``include_stop_str_in_output`` says, a possible stop's start held back
        while it is undecided), the last with ``finish_reason`` "stop" and that
        ``stop_reason``; a stop the server was not given closes the stream there, which aborts
        the request upstream.
        """
        observer, completed = self.observer, False
        if observer is not None:
            await observer.opened(self, request)
        span = self._completion_span(request)
        failure: BaseException | None = None
        finish_reason: str | None = None
        usage = so_far = StreamPiece()
        try:
            prompt: str | list[int] = request.prompt  # type: ignore[assignment]
            tail: list[int] | None = None
            if isinstance(request.prompt, TokenPrompt):
                tail = await self.tokenize_text(request.prompt.text) if request.prompt.text else []
                prompt = [*request.prompt.ids, *tail]
            async with self._slots:
                headers = {**request.headers, **tracing.traceparent(span)}
                opened = await self._with_retries(lambda: self._open(request, prompt, headers))
                response, events, piece = opened
                if piece is not None:
                    piece.tail_ids = tail
                watch = self._stream_stops(request)  # after _open: it may learn the limit
                received, counted, finished, ended = "", False, False, False
                try:
                    while piece is not None:
                        if piece.finish_reason is not None:
                            finished, finish_reason = True, piece.finish_reason
                        if piece.usage_only:
                            counted, usage = True, piece
                        elif piece.completion_tokens is not None:
                            # the usage so far (continuous usage stats): the piece's token
                            # count; usage is counted once, from the final usage chunk
                            so_far = piece
                            piece = _tokens_only(piece)
                        if watch is not None and not piece.usage_only:
                            piece, closing = self._watched(watch, piece, so_far)
                            if closing:
                                if observer is not None:
                                    observer.piece(self, request, piece)
                                yield piece
                                completed = True
                                return  # the finally clause closes the stream: vLLM aborts it
                        received += piece.text
                        if observer is not None:
                            observer.piece(self, request, piece)
                        yield piece
                        piece = None
                        async for data in events:  # the next event, read here: no layer between
                            piece = _event_piece(data)
                            break
                        else:
                            ended = True  # the body's end, with no [DONE]
                    _check_whole(response, finished, ended)  # [DONE] or the body's end
                    if not ended:  # the body's end after [DONE]: the connection stays
                        with contextlib.suppress(Exception):  # the answer is whole already
                            async for _ in events:
                                pass
                    if not counted and so_far.completion_tokens is not None:
                        piece = usage = _usage_of(so_far)  # a server that sent it on its last
                        if observer is not None:
                            observer.piece(self, request, piece)
                        yield piece
                    completed = True
                except (asyncio.CancelledError, GeneratorExit):
                    raise
                except UpstreamErrorEvent as said:  # the server's words, and where it said them
                    named = UpstreamErrorEvent(f"{said} (from {response.request.url})")
                    raise StreamInterrupted(self.role, received, named) from said
                except Exception as exc:  # httpx/httpx2 transport errors differ by openai version
                    raise StreamInterrupted(self.role, received, exc) from exc
                finally:
                    await response.close()
        except (GeneratorExit, asyncio.CancelledError):
            raise  # closed by the caller: not completed, not failed
        except BaseException as failed:
            failure = failed
            raise
        finally:
            if span is not None:
                if usage.completion_tokens is None:
                    usage = so_far  # closed before its final usage: the count so far
                tracing.finish(
                    span, _completion_attributes(completed, finish_reason, usage), failure
                )
            if observer is not None:
                await observer.closed(self, request, completed)

    def _completion_span(self, request: CompletionRequest) -> tracing.Span | None:
        """The span of a completion `request` (None when not tracing)."""
        if tracing.tracer() is None:
            return None
        attributes = {
            **self._span_attributes(self._api_path + "/completions"),
            "gen_ai.operation.name": "text_completion",
            "gen_ai.request.max_tokens": request.max_tokens,
            "relay.request.purpose": tracing.purpose(),
            "relay.request.id": request.headers.get("X-Request-Id", ""),
            "relay.prompt.kind": "text" if isinstance(request.prompt, str) else "token_ids",
        }
        return tracing.start(f"text_completion {self.config.model}", attributes, client=True)

    def _overflows(self, request: CompletionRequest) -> bool:
        """Whether `request` has more stop strings than the server takes."""
        return self.stop_limit is not None and len(request.stop) > self.stop_limit

    def _stream_stops(self, request: CompletionRequest) -> StreamStops | None:
        """The stop strings to apply in the stream: all of `request`'s, when the server
        takes fewer or one may have begun in the text the request goes on from (None: the
        server applies them)."""
        if not self._watches(request):
            return None
        include = self._request_fields(request).get("include_stop_str_in_output", True)
        return StreamStops(request.stop, include_in_output=bool(include), written=request.written)

    def _watches(self, request: CompletionRequest) -> bool:
        """Whether `request`'s stops are (also) found in its stream."""
        return bool(request.stop) and (bool(request.written) or self._overflows(request))

    def _watched(
        self, watch: StreamStops, piece: StreamPiece, so_far: StreamPiece
    ) -> tuple[StreamPiece, bool]:
        """`piece` as vLLM would have sent it with all the stop strings, and whether it is
        the last one: a stop the server was not given ended the text before the server
        finished (the stream is closed there). A stop the server was given ends the server's
        own stream at the same token (it ends first over all the stops, so over the server's
        too, and the server's come first in the list, which wins a tie), which is then read
        to its end, usage and all."""
        text, stop = watch.feed(piece.text)
        if stop is None and piece.finish_reason is not None:
            text += watch.rest()  # the server's end: what was held back
        elif stop is not None and piece.finish_reason is None:
            # the server ends at a stop it was given, unless the stop began before its output
            if watch.began_before or stop not in watch.stops[: self.stop_limit]:
                closing = _cut(text, stop, so_far)
                closing.tail_ids = piece.tail_ids
                return closing, True
        elif stop is not None:  # the server finished at this piece for a reason of its own
            piece.finish_reason, piece.stop_reason = "stop", stop
        piece.text = text  # the piece is this loop's own (made from its event)
        return piece, False

    async def _with_retries(self, call: Callable[[], Awaitable[T]]) -> T:
        """Run `call`, retrying what may pass; a final failure becomes UpstreamFailure.

        While the server is known down (:attr:`availability`) nothing is sent: the failure
        comes at once, and a retry loop stops at its next attempt; the half-open trial is sent
        once. How the request ended is counted by the breaker (:meth:`Availability.record`).

        The first attempt runs outside tenacity, whose machinery costs about 15 us a request
        that nearly every request would pay for nothing; a failed first attempt is handed to
        tenacity as its own first, so logging and backoff are tenacity's throughout."""
        started, attempts, trial = time.monotonic(), 1, False
        try:
            trial = self.availability.admit()
            try:
                value = await call()
            except Exception as failed:
                if not self._may_retry(failed) or self.config.max_retries == 0:
                    raise
                first: Exception | None = failed

                async def again() -> T:
                    nonlocal first, trial
                    if first is not None:
                        failed, first = first, None
                        raise failed
                    # it may have gone down while this one waited (or be due a trial)
                    trial = self.availability.admit()
                    return await call()

                attempts = 0
                async for attempt in self._retrying():
                    with attempt:
                        attempts += 1
                        value = await again()
            self.availability.succeeded()
            return value
        # Not retryable (400, 401, an error event), or the last of the retries (reraise=True)
        except (openai.APIError, UpstreamErrorEvent) as final:
            reason = public_reason(final, self.config)
            self.availability.record(final, reason, trial=trial)
            tries = Tries(attempts, time.monotonic() - started)
            detail = explain_failure(final, self.role, self.config, tries)
            raise UpstreamFailure(self.role, final, detail, reason) from final
        except BaseException:  # cancelled: it says nothing about the server
            self.availability.abandoned(trial)
            raise

    async def _open(
        self, request: CompletionRequest, prompt: str | list[int], headers: Mapping[str, str]
    ) -> tuple[HttpResponse, AsyncIterator[bytes], StreamPiece | None]:
        """Open the stream of `request` with `prompt` (its text, or its :class:`TokenPrompt`
        as ids) and `headers` (the request's, its trace context), and read its first piece
        (what a retry may repeat): the response, its events (:func:`_event_piece` reads each)
        and that piece."""
        body = self.completion_body(request, prompt)
        try:
            response = await self._http.request(
                "POST", self._api_path + "/completions", body, headers, expect="events"
            )
        except openai.BadRequestError as refused:
            limit = _stop_limit(refused)
            if limit is None or limit >= len(body.get("stop", ())):
                raise
            self.stop_limit = limit  # learned once; the rest are found in the stream
            logger.info(
                "%s server %s takes %d stop strings a request; the relay finds the others in "
                "the stream (start vLLM with VLLM_MAX_STOP_STRINGS=1024 to let it stop there)",
                self.role,
                self.config.base_url,
                limit,
            )
            return await self._open(request, prompt, headers)
        events = response.events()
        try:
            first, ended = None, False
            async for data in events:
                first = _event_piece(data)
                break
            else:
                ended = True
            if first is None:  # [DONE] or the body's end, before any piece: raises
                _check_whole(response, finished=False, ended=ended)
            return response, events, first
        except (UpstreamErrorEvent, openai.APIError):  # an answer: the server's error
            await response.close()
            raise
        except Exception as broken:  # before any text: a lost connection, retried as one
            await response.close()
            raise _connection_error(broken, response.request) from broken
        except BaseException:
            await response.close()
            raise

    def completion_body(
        self, request: CompletionRequest, prompt: str | list[int] | None = None
    ) -> dict[str, Any]:
        """The JSON body of `request`: the fields the relay sets itself (each one in
        :data:`~.reserved_fields.RESERVED_BODY_FIELDS`, so that no ``extra_body`` overrides it
        unseen), the endpoint's ``extra_body``, the sampling, the request's own fields.
        `prompt`: the prompt as sent (a :class:`TokenPrompt`'s ids with its text's; default:
        the request's text, or its ids when it has no text)."""
        if prompt is None:
            given = request.prompt
            prompt = given if isinstance(given, str) else [*given.ids]
        stops = list(request.stop[: self.stop_limit])  # the first ones: the relay orders them
        body = {
            "model": self.config.model,
            "prompt": prompt,
            "max_tokens": request.max_tokens,
            "stream": True,
            **({"stop": stops} if stops else {}),
            **self._request_fields(request),
            # vLLM's own field: every chunk carries the usage so far. A chunk may hold several
            # tokens (vLLM merges what the client has not read yet), so only this counts them
            # exactly while the request runs; and a request closed at a stop string found in
            # the stream gets no final usage chunk.
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        }
        if not isinstance(prompt, str) and request.return_token_ids:
            body["return_token_ids"] = True  # each piece's ids: the model's own tokens kept
        if self._watches(request):
            # the stream's own stops (StreamStops) need to see every stop the server writes,
            # and hold back a stop's possible start themselves (the server would hold back
            # only its own stops' lengths)
            body["include_stop_str_in_output"] = True
        return body

    def _request_fields(self, request: CompletionRequest) -> dict[str, Any]:
        """The fields of `request`'s body past the prompt and stops: the endpoint's
        ``extra_body``, the relay's own, the sampling, the request's own fields."""
        return {
            **self.config.extra_body,
            "include_stop_str_in_output": True,
            "add_special_tokens": False,  # the rendered prompt has BOS if the model wants one
            **request.sampling,
            **request.extra_body,
        }

    def _retrying(self) -> AsyncRetrying:
        """The retry loop: within the current :class:`~.deadline.Deadline` too (a relay
        generation's), whose time its waits spend; it waits no longer than is left, and stops
        once nothing is."""
        deadline = current_deadline()
        return AsyncRetrying(
            retry=retry_if_exception(self._may_retry),
            stop=stop_after_attempt(self.config.max_retries + 1) | stop_at_deadline(deadline),
            wait=wait_within_deadline(_wait_retry_after, deadline),
            sleep=sleep_within_deadline(deadline),
            before_sleep=self._log_retry,
            reraise=True,  # the last attempt's own error, explained in _with_retries
        )

    def _may_retry(self, failed: BaseException) -> bool:
        # not while the server is known down (nor the half-open trial), nor a misfit (TLS, a
        # proxy's refusal, a response that broke HTTP): every attempt would meet it again
        return _is_retryable(failed) and not self.availability.down and misfit(failed) is None

    def _log_retry(self, state: RetryCallState) -> None:
        failed = state.outcome.exception() if state.outcome else None
        logger.warning(
            "%s server %s: %s; retrying in %.1f s (attempt %d of %d)",
            self.role,
            self.config.base_url,
            str(failed) or type(failed).__name__,
            state.upcoming_sleep,
            state.attempt_number + 1,
            self.config.max_retries + 1,
        )


def _connection_error(cause: Exception, request: Any) -> openai.APIConnectionError:
    """A transport error of the raw stream as the SDK's own (httpx and httpx2 both name theirs
    ``...Timeout``), so that retries and callers treat it like any failed request."""
    if "Timeout" in type(cause).__name__:
        return openai.APITimeoutError(request=request)
    return openai.APIConnectionError(message=f"{type(cause).__name__}: {cause}", request=request)


class UpstreamErrorEvent(RelayError):
    """The server sent an error event (or something unreadable) instead of the next chunk."""


def _check_whole(response: HttpResponse, finished: bool, ended: bool) -> None:
    """Raise unless a stream that ended (at ``[DONE]``; at its body's end if `ended`) is
    whole: a piece with a finish reason (`finished`), then ``[DONE]`` or a clean end of the
    body. Else the server's error object, when the body was one (vLLM sends some of its
    errors as a JSON object under ``text/event-stream``), or :class:`IncompleteStream`
    naming the URL and what was missing."""
    cut = ended and response.decoder.cut
    if finished and not cut:
        return
    stray = response.decoder.stray()
    sent = response.request
    where = f"{sent.method} {sent.url}"
    said = _error_object(response, stray, where) if stray else None
    if said is not None:
        raise said
    missing = "[DONE]" if finished else "a finish reason"
    problem = f"the event stream from {where} ended without {missing}"
    if cut:
        problem += ", in the middle of an event"
    if stray:
        problem += f"; it sent lines that are not events: {shown(stray)}"
    raise IncompleteStream(problem, lost=cut)  # a body closed mid-event: a connection lost


def _error_object(response: HttpResponse, raw: bytes, where: str) -> Exception | None:
    """The error a body that is a JSON error object (``{"error": {"message": ..., "code":
    400}}``, or ``{"object": "error", "message": ..., "code": 400}``) reports: the SDK's
    error of its code (``BadRequestError`` for 400, not retried), else an
    :class:`UpstreamErrorEvent`; None if the body is not one."""
    try:
        body = json.loads(raw)
    except ValueError:
        return None
    error = _error_of(body)
    if error is None:
        return None
    message = f"{where} {ERROR_OBJECT}: {error.get('message') or body}"
    code = error.get("code")
    if isinstance(code, int) and 400 <= code < 600:
        return response.status_error(code, raw, body, message)
    return UpstreamErrorEvent(message)


def _error_of(chunk: object) -> Mapping[str, Any] | None:
    """The error a JSON object reports: its ``error`` (a string: the message), or itself
    when it is one (``"object": "error"``, vLLM's older shape); None if it reports none."""
    if not isinstance(chunk, dict):
        return None
    if "error" in chunk:
        error = chunk["error"]
        return error if isinstance(error, dict) else {"message": error}
    return chunk if chunk.get("object") == "error" else None


def _event_piece(data: bytes) -> StreamPiece | None:
    """The piece an event of a ``/v1/completions`` stream carries; None for ``[DONE]``, after
    which the stream's reader reads the body to its end (a response closed before its end
    closes its connection too, and every request would then open a new one)."""
    if data == b"[DONE]":
        return None
    try:
        chunk = json.loads(data.decode())  # str: json.loads(bytes) detects the encoding first
    except ValueError:  # not JSON, or not UTF-8
        raise UpstreamErrorEvent(
            f"the server sent an event that is not JSON: {data[:80]!r}"
        ) from None
    if not isinstance(chunk, dict):
        raise UpstreamErrorEvent(
            f"the server sent an event that is not a JSON object: {data[:80]!r}"
        )
    return _piece(chunk)


def _piece(chunk: Mapping[str, Any]) -> StreamPiece:
    text, finish, stop_reason, ids = "", None, None, None
    choices = chunk.get("choices")
    if choices:
        choice = choices[0]
        text = choice.get("text") or ""
        finish = choice.get("finish_reason")
        stop_reason = choice.get("stop_reason")
        ids = choice.get("token_ids")
    usage = chunk.get("usage")
    if not usage:
        if not choices and (error := _error_of(chunk)) is not None:  # no chunk: an error
            raise UpstreamErrorEvent(f"the server sent an error event: {error.get('message')}")
        return StreamPiece(text, finish, stop_reason, token_ids=ids)
    details = usage.get("prompt_tokens_details") or {}
    return StreamPiece(
        text,
        finish,
        stop_reason,
        prompt_tokens=usage.get("prompt_tokens"),
        cached_tokens=details.get("cached_tokens"),
        completion_tokens=usage.get("completion_tokens"),
        usage_only=not choices,
        token_ids=ids,
    )


def _tokens_only(piece: StreamPiece) -> StreamPiece:
    """A piece whose usage is the usage so far: its token count, no usage to count (made
    directly: ``dataclasses.replace`` costs a few microseconds a token)."""
    return StreamPiece(
        piece.text,
        piece.finish_reason,
        piece.stop_reason,
        tokens=piece.completion_tokens,
        token_ids=piece.token_ids,
        tail_ids=piece.tail_ids,
    )


def _completion_attributes(
    completed: bool, finish_reason: str | None, usage: StreamPiece
) -> dict[str, Any]:
    """What a completion's span says at its end: whether it was read to its end, how the
    server ended it, the server's token counts (the last known, for one closed early)."""
    return {
        "relay.request.completed": completed,
        "gen_ai.response.finish_reasons": [finish_reason] if finish_reason else None,
        "gen_ai.usage.input_tokens": usage.prompt_tokens,
        "gen_ai.usage.output_tokens": usage.completion_tokens,
    }


def _usage_of(piece: StreamPiece) -> StreamPiece:
    """The usage a piece carried, as the stream's final usage piece."""
    return StreamPiece(
        prompt_tokens=piece.prompt_tokens,
        cached_tokens=piece.cached_tokens,
        completion_tokens=piece.completion_tokens,
        usage_only=True,
    )


def _cut(kept: str, stop: str, usage: StreamPiece) -> StreamPiece:
    """The last piece of a request closed at a stop string found in the stream: its text up
    to where vLLM cuts, and the usage so far (cached tokens unknown: that count comes in the
    final chunk, which a closed stream does not get)."""
    return StreamPiece(
        kept,
        "stop",
        stop,
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens,
        tokens=usage.completion_tokens,
    )


_AT_MOST = re.compile(r"at most (\d+) item")


def _stop_limit(refused: openai.BadRequestError) -> int | None:
    """The stop-string limit a vLLM 400 names ("body.stop: List should have at most 4 items
    after validation, not 145"), or None if it is about something else."""
    message = str(refused.message)
    match = _AT_MOST.search(message)
    return int(match.group(1)) if match and "stop" in message else None


def _is_retryable(exc: BaseException) -> bool:
    if isinstance(exc, openai.APIStatusError):
        return exc.status_code in RETRYABLE_STATUS or exc.status_code >= 500
    return isinstance(exc, openai.APIConnectionError)


def _wait_retry_after(state: RetryCallState) -> float:
    """``Retry-After`` when the server sent one it can be read by (at most
    :data:`MAX_RETRY_AFTER`); none after the first attempt's connection closed before an
    answer (a kept-alive connection the server closed while idle: a new one mends it at
    once); else 0.5 s, 1 s, 2 s, ... (max 8 s)."""
    exc = state.outcome.exception() if state.outcome else None
    if isinstance(exc, openai.APIStatusError):
        header = exc.response.headers.get("retry-after")
        if header:
            seconds = _parse_retry_after(header)
            if seconds is not None:
                return min(seconds, MAX_RETRY_AFTER)
            _unreadable_retry_after(exc, header)
    elif state.attempt_number == 1 and isinstance(exc and exc.__cause__, ClosedBeforeAnswer):
        return 0.0
    return float(min(0.5 * 2 ** (state.attempt_number - 1), 8.0))


_DELTA_SECONDS = re.compile(r"\d+(?:\.\d*)?")
_UNREADABLE_FROM: set[str] = set()
"""The servers whose unreadable ``Retry-After`` was logged (once each)."""


def _parse_retry_after(value: str) -> float | None:
    """The seconds a ``Retry-After`` value asks to wait: delta-seconds (a number, however
    large), or an HTTP date (0 once past); None for anything else (``soon``, ``nan``,
    ``inf``, ``-1``), which the default backoff replaces."""
    value = value.strip()
    if _DELTA_SECONDS.fullmatch(value):
        return float(value)  # a number too large for a float is inf: the cap applies
    try:
        date = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, OverflowError):
        return None
    if date.tzinfo is None:  # "-0000": an HTTP date is always GMT
        date = date.replace(tzinfo=datetime.UTC)
    return max(date.timestamp() - time.time(), 0.0)


def _unreadable_retry_after(failed: openai.APIStatusError, value: str) -> None:
    parts = urllib.parse.urlsplit(str(failed.request.url))
    server = f"{parts.scheme}://{parts.netloc}"
    if server not in _UNREADABLE_FROM:
        _UNREADABLE_FROM.add(server)
        logger.warning(
            "%s sent Retry-After: %s, neither seconds nor an HTTP date; retrying after the "
            "default backoff (logged once a server)",
            server,
            shown(value.encode()),
        )
