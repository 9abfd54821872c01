"""Whole generations under fault schedules: one upstream (the large model's server or the
small one's) killed, stopped (SIGSTOP), its stream cut or its request failed (a 5xx) at a
point of the generation: while the prompt is rendered (``/tokenize``), at a cue, during a
speculative hand-off (the next model's request opened before its confirming token), inside a
cue the caller has been shown part of, at the end of the reasoning, in the middle of the
answer. Whatever the schedule, the caller receives exactly the fault-free run's text, written
by the same models in the same turns (both scripted models write the same text: the turns
are what shows a missed switch), unless the small model was given up on; or the generation
ends with a ``RelayError`` naming a server's URL, within its deadline.

Kills and stops hit scripted upstreams in processes of their own (``benchmarks.upstream``, as
``test_server_outages`` runs them: killed, started again on their port); cuts and failures are
:class:`~relay_integrations.testing.scripted_vllm.Fault` s of scripted servers on threads of
their own, given to the request whose text crosses the point: one fault on a server that stays
up, after which only the fault-free text will do. ``HYPOTHESIS_PROFILE=long``
generates more schedules than CI's handful.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from benchmarks import upstream
from relay_integrations.relay import (
    EndpointConfig,
    ModelRole,
    RelayConfig,
    RelayDone,
    RelayError,
    RelaySwitcher,
    SwitchPolicy,
    TextDelta,
)
from relay_integrations.testing.qwen3_template import ASSISTANT
from relay_integrations.testing.scripted_vllm import Fault, ScriptedModel, ScriptedVLLM, serving
from tests.component.test_server_outages import Upstream
from tests.fakes.hostile_upstream import Chunk, hostile_settings, scripted_events

QUESTION = "What is 42 * 7?"
MESSAGES = [{"role": "user", "content": QUESTION}]
FAULT_FREE = upstream.REASONING + f"{QUESTION} Here is the answer."
"""The text every generation writes (the scripted models', the same whichever writes it)."""
TOKEN_DELAY = 0.02
READ_TIMEOUT = 1.0
RESUME_WAIT = 4.0
MAX_RETRIES = 1
STARTUP = 3.0
"""Seconds a scripted upstream's process may take to listen again (a loaded machine)."""

Point = Literal["render", "cue", "inside_cue", "handoff", "end_of_reasoning", "mid_answer"]
POINTS: tuple[Point, ...] = (
    "render",
    "cue",
    "inside_cue",
    "handoff",
    "end_of_reasoning",
    "mid_answer",
)
Action = Literal["kill", "stop", "cut", "fail"]
MARKS: dict[Point, str] = {
    "cue": "question. Now",  # the large model's cue: the small model takes over
    # the cue's first token written (and shown), its "," not yet: resumed from there, the
    # server never sees the cue whole in its output
    "inside_cue": "best here. Therefore",
    "handoff": "best reply.",  # the small model's sentence end: the large model's request
    # is opened before the space that confirms it
    "end_of_reasoning": "</think",  # the request that writes its ">" crosses the point
    "mid_answer": "? Here",
}


def generated_offset(point: Point) -> int:
    """Where `point` is in the generated text (0: before it, the render)."""
    if point == "render":
        return 0
    return FAULT_FREE.index(MARKS[point]) + len(MARKS[point])


def visible_offset(point: Point) -> int:
    """Where `point` is in the text the caller sees (the deltas: no reasoning markers)."""
    reasoning = FAULT_FREE.removeprefix("<think>\n").split("\n</think>", 1)[0]
    if point == "end_of_reasoning":
        return len(reasoning)
    visible = reasoning + FAULT_FREE.split("</think>\n\n", 1)[1]
    return 0 if point == "render" else visible.index(MARKS[point]) + len(MARKS[point])


@dataclass(frozen=True)
class Schedule:
    """What happens to which server, when; `down`: seconds it stays out (a killed one is
    started again after them, a stopped one continued; None: a killed one stays dead)."""

    action: Action
    role: ModelRole
    point: Point
    down: float | None = 1.0

    def deadline(self) -> float:
        """Seconds the generation may take: its fault-free time, the outage, a restart, the
        resume wait, and a read timeout for each try of each resume."""
        tries = (SwitchPolicy().max_resumes + 1) * (1 + MAX_RETRIES)
        restart = STARTUP if self.action == "kill" else 0.0
        return 10.0 + (self.down or 0.0) + restart + RESUME_WAIT + tries * READ_TIMEOUT


def relay_config(large_url: str, small_url: str) -> RelayConfig:
    def endpoint(url: str, model: str) -> EndpointConfig:
        return EndpointConfig(
            base_url=url,
            model=model,
            read_timeout=READ_TIMEOUT,
            connect_timeout=0.5,
            max_retries=MAX_RETRIES,
            probe_interval=0.1,
        )

    return RelayConfig(
        large=endpoint(large_url, "large"),
        small=endpoint(small_url, "small"),
        cues=upstream.CUES,
        policy=SwitchPolicy(resume_wait_seconds=RESUME_WAIT),
    )


@dataclass(frozen=True)
class Written:
    """What a generation wrote: its text, who wrote each turn and how the turn ended, and
    whether the small model was given up on (its turns then the large model's)."""

    text: str
    turns: tuple[tuple[str, str], ...]
    degraded: bool


async def generate(
    config: RelayConfig, schedule: Schedule | None, act: Callable[[], Awaitable[None]]
) -> Written | BaseException:
    """One generation, `act` run once its visible text reaches the schedule's point (None:
    never): what it wrote (its text checked against what the caller received), or the error
    it ended with (a TimeoutError a while past the schedule's deadline)."""
    point = None if schedule is None else schedule.point
    offset = 0 if point is None else visible_offset(point)
    acted, received = point is None, ""
    deadline = 10.0 if schedule is None else schedule.deadline()
    try:
        async with asyncio.timeout(deadline + 5), RelaySwitcher(config) as relay:
            if point == "render":
                acted = True
                await act()
            async for event in relay.stream(MESSAGES):
                if isinstance(event, TextDelta):
                    received += event.text
                    if not acted and len(received) >= offset:
                        acted = True
                        await act()
                elif isinstance(event, RelayDone):
                    result = event.result
                    assert received == result.reasoning + result.answer
                    turns = tuple((s.model, s.ended_by) for s in result.segments)
                    return Written(result.text, turns, result.stats.degraded is not None)
    except Exception as failed:  # judged by the caller
        return failed
    raise AssertionError("the stream ended without its result")


def check(
    outcome: Written | BaseException,
    fault_free: Written,
    seconds: float,
    schedule: Schedule,
    urls: list[str],
    *,
    transient: bool = False,
) -> None:
    """The invariant; a `transient` fault (one request cut or failed, the server up
    throughout) leaves nothing to give up on: the fault-free run is the only outcome."""
    assert seconds <= schedule.deadline(), f"{seconds:.1f} s for {schedule}"
    assert not (transient and isinstance(outcome, BaseException)), repr(outcome)
    if isinstance(outcome, BaseException):
        assert isinstance(outcome, RelayError), repr(outcome)
        assert any(url.removesuffix("/v1") in str(outcome) for url in urls), repr(outcome)
        return
    assert outcome.text == FAULT_FREE
    assert not (transient and outcome.degraded), outcome
    if not outcome.degraded:
        assert outcome.turns == fault_free.turns, (outcome.turns, fault_free.turns)


# --- cuts and failures: scripted servers on threads -----------------------------------------


class FaultAtPoint(list[Fault]):
    """A scripted model's faults, given by where a request starts: the first request whose
    text (as its stops cut it) crosses `offset` of the generated text gets `action` there
    (a cut after the tokens before it, or a 503). A scripted server records a request before it takes its fault, so
    the request is known here."""

    def __init__(self, model: ScriptedModel, offset: int, action: Action) -> None:
        super().__init__()
        self.model, self.offset, self.action = model, offset, action
        self.fired = False

    def __bool__(self) -> bool:
        return not self.fired

    def pop(self, index: Any = -1) -> Fault:
        body = self.model.requests[-1]
        written = len(body["prompt"].split(ASSISTANT, 1)[1])
        pieces = [e.text for e in scripted_events(self.model, body) if isinstance(e, Chunk)]
        if not written <= self.offset < written + len("".join(pieces)):
            return Fault()  # this request ends before the point (a stop) or starts after it
        self.fired = True
        if self.action == "fail":
            return Fault(status=503)
        before = 0  # the tokens (a chunk each) wholly before the point
        while written + len("".join(pieces[: before + 1])) <= self.offset:
            before += 1
        return Fault(cut_after=before)


@pytest.fixture(scope="module")
def threaded() -> Iterator[dict[ModelRole, ScriptedVLLM]]:
    large = upstream.scripted_pair(TOKEN_DELAY, models=("large",))
    small = upstream.scripted_pair(TOKEN_DELAY, models=("small",))
    with serving(large), serving(small):
        yield {"large": large, "small": small}


@pytest.fixture(scope="module")
def fault_free(threaded: dict[ModelRole, ScriptedVLLM]) -> Written:
    """The generation with no fault: its text, and its turns."""

    async def nothing() -> None:
        pass

    config = relay_config(threaded["large"].base_url, threaded["small"].base_url)
    written = asyncio.run(generate(config, None, nothing))
    assert isinstance(written, Written), repr(written)
    assert written.text == FAULT_FREE and not written.degraded, written
    assert ("small", "sentence_end") in written.turns, written.turns  # it switches
    return written


def run_threaded(
    servers: dict[ModelRole, ScriptedVLLM], schedule: Schedule, fault_free: Written
) -> None:
    model = servers[schedule.role].models[schedule.role]
    model.forget()
    render = model.chat_template
    if schedule.point == "render":  # /tokenize answers 500 once

        def failing(*chat: Any) -> str:
            model.chat_template = render
            raise RuntimeError("failed on purpose")

        model.chat_template = failing
    else:
        model.faults = FaultAtPoint(model, generated_offset(schedule.point), schedule.action)

    async def nothing() -> None:
        pass

    config = relay_config(servers["large"].base_url, servers["small"].base_url)
    started = time.monotonic()
    try:
        outcome = asyncio.run(generate(config, schedule, nothing))
    finally:
        model.faults, model.chat_template = [], render
    check(
        outcome,
        fault_free,
        time.monotonic() - started,
        schedule,
        [config.large.base_url, config.small.base_url],
        transient=True,
    )


def in_thread_schedules() -> st.SearchStrategy[Schedule]:
    return st.builds(
        Schedule,
        action=st.sampled_from(("cut", "fail")),
        role=st.sampled_from(("large", "small")),
        point=st.sampled_from(POINTS),
    )


@hostile_settings(examples=6)  # whole generations: a few
@given(schedule=in_thread_schedules())
def test_a_cut_or_failed_request_leaves_the_fault_free_text_or_a_named_error(
    threaded: dict[ModelRole, ScriptedVLLM], fault_free: Written, schedule: Schedule
) -> None:
    run_threaded(threaded, schedule, fault_free)


IN_THREAD: dict[str, Schedule] = {
    # the large model's stream cut just before the ">" of "</think>": resumed from a prompt
    # ending in "</think", the server would never see its stop whole
    "resume-at-the-end-of-reasoning": Schedule("cut", "large", "end_of_reasoning"),
    "answer-cut-mid-way": Schedule("cut", "small", "mid_answer"),
    "render-fails-once": Schedule("fail", "large", "render"),
    "speculative-handoff-request-fails": Schedule("fail", "large", "handoff"),
    # " Therefore" shown, its "," not yet written: the resumed request must still end there
    "cut-inside-a-cue-already-shown": Schedule("cut", "large", "inside_cue"),
    # the small model's "." written, the space that ends its sentence not yet
    "cut-inside-a-sentence-end": Schedule("cut", "small", "handoff"),
}


@pytest.mark.parametrize("case", list(IN_THREAD))
def test_named_cut_and_failure_schedules(
    threaded: dict[ModelRole, ScriptedVLLM], fault_free: Written, case: str
) -> None:
    run_threaded(threaded, IN_THREAD[case], fault_free)


# --- kills and stops: upstreams in processes of their own -----------------------------------


@pytest.fixture(scope="module")
def processes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[ModelRole, Upstream]]:
    logs = tmp_path_factory.mktemp("upstreams")
    running: dict[ModelRole, Upstream] = {
        role: Upstream(role, TOKEN_DELAY, Path(logs / f"{role}.log")) for role in ("large", "small")
    }
    try:
        for server in running.values():
            server.start()
        yield running
    finally:
        for server in running.values():
            if server.process is not None and server.process.poll() is None:
                server.process.send_signal(signal.SIGCONT)
            server.stop()


def revive(server: Upstream) -> None:
    """Continue a stopped upstream, start a dead one again."""
    assert server.process is not None
    if server.process.poll() is None:
        server.process.send_signal(signal.SIGCONT)
    else:
        server.start()


def run_processes(
    servers: dict[ModelRole, Upstream], schedule: Schedule, fault_free: Written
) -> None:
    target = servers[schedule.role]
    assert target.process is not None
    later: list[asyncio.Task[None]] = []

    async def back_after(seconds: float) -> None:
        await asyncio.sleep(seconds)
        await asyncio.to_thread(revive, target)

    async def act() -> None:
        assert target.process is not None
        if schedule.action == "kill":
            await asyncio.to_thread(target.kill)
        else:
            target.process.send_signal(signal.SIGSTOP)
        if schedule.down is not None:
            later.append(asyncio.create_task(back_after(schedule.down)))

    async def run() -> Written | BaseException:
        config = relay_config(servers["large"].url, servers["small"].url)
        outcome = await generate(config, schedule, act)
        await asyncio.gather(*later)
        return outcome

    started = time.monotonic()
    try:
        outcome = asyncio.run(run())
    finally:
        revive(target)
    urls = [s.url for s in servers.values()]
    check(outcome, fault_free, time.monotonic() - started, schedule, urls)


def process_schedules() -> st.SearchStrategy[Schedule]:
    return st.builds(
        Schedule,
        action=st.sampled_from(("kill", "stop")),
        role=st.sampled_from(("large", "small")),
        point=st.sampled_from(POINTS),
        down=st.sampled_from((0.5, 2.0, None)),
    )


@hostile_settings(examples=3)  # whole generations: a few
@given(schedule=process_schedules())
def test_a_killed_or_stopped_upstream_leaves_the_fault_free_text_or_a_named_error(
    processes: dict[ModelRole, Upstream], fault_free: Written, schedule: Schedule
) -> None:
    if schedule.action == "stop" and schedule.down is None:
        schedule = Schedule("stop", schedule.role, schedule.point, 2.0)  # a stop ends
    run_processes(processes, schedule, fault_free)


IN_PROCESSES: dict[str, Schedule] = {
    "large-killed-at-the-end-of-reasoning-and-restarted": Schedule(
        "kill", "large", "end_of_reasoning", 0.5
    ),
    "small-stopped-during-a-speculative-handoff": Schedule("stop", "small", "cue", 2.0),
    "small-killed-at-a-cue-for-good": Schedule("kill", "small", "cue", None),
    "large-killed-mid-answer-for-good": Schedule("kill", "large", "mid_answer", None),
}


@pytest.mark.parametrize("case", list(IN_PROCESSES))
def test_named_kill_and_stop_schedules(
    processes: dict[ModelRole, Upstream], fault_free: Written, case: str
) -> None:
    run_processes(processes, IN_PROCESSES[case], fault_free)
