"""3. Minimum prefill, the ideal time, where the time goes, and the medians over runs."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence

from relay_integrations.jobs.statistics import median
from relay_integrations.upstream.config import ModelRole

from .recording import Generation, RequestRecord
from .results import (
    AloneFigures,
    AuthorsFigures,
    Breakdown,
    EngineResult,
    ModelRates,
    ModeSummary,
    RelayFigures,
    ReplayFigures,
    ReplayShapes,
    Spread,
    Summary,
    TraceSummary,
)
from .servers import Tokenizer
from .settings import BLOCK


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


async def analyse(gen: Generation, toks: Mapping[ModelRole, Tokenizer]) -> None:
    """Fill each request's minimum prefill U with the server's tokenizer.

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


def breakdown(gen: Generation, penalty: Mapping[ModelRole, float]) -> Breakdown:
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
    residual = excess - gen.prepare - between - fixed - grammar - excess_prefill - handoffs - resume
    return Breakdown(
        wall=gen.wall,
        ideal=gen.ideal,
        excess=excess,
        requests=len(reqs),
        rendering=gen.prepare,
        ttft_sum=sum((r.first or r.done or r.sent) - r.sent for r in reqs),
        ttft_predicted=sum(
            rates[r.role].overhead_forced + r.prefilled / rates[r.role].prefill for r in reqs
        ),
        decoding_sum=sum((r.done or r.sent) - (r.first or r.sent) for r in reqs),
        decoding_predicted=sum(
            max(r.completion_tokens - 1, 0) / rates[r.role].decode for r in reqs
        ),
        models_lookups=sum(r.models_seconds for r in reqs),
        in_requests=in_requests,
        between_requests=between,
        request_fixed_costs=fixed,
        grammar_per_request=grammar,
        excess_prefill=excess_prefill,
        handoff_interference=handoffs,
        resume_overheads=resume,
        residual=residual,
        lookahead_tokens=sum(1 for r in reqs if lookahead(r)),
        lookahead_seconds=sum(1 / rates[r.role].decode for r in reqs if lookahead(r)),
    )


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


def completion(g: Generation) -> float:
    """Tokens both models wrote."""
    return g.completion("large") + g.completion("small")


SHAPE_RATIOS = {
    "endpoint stream / raw stream (this client)": ("back_to_back", "raw_stream"),
    "raw stream / whole (vLLM streaming)": ("raw_stream", "whole"),
    "continuous usage / raw stream": ("raw_stream_continuous", "raw_stream"),
    "endpoint stream / whole (all streaming)": ("back_to_back", "whole"),
}
SHAPE_KINDS = ("back_to_back", "raw_stream", "raw_stream_continuous", "whole")


def relay_figures(relay: Sequence[Generation]) -> RelayFigures:
    return RelayFigures(
        wall=med(relay, lambda g: g.wall),
        ideal=med(relay, lambda g: g.ideal),
        ratio=med(relay, lambda g: g.ratio),
        ratio_range=(min(g.ratio for g in relay), max(g.ratio for g in relay)),
        requests=med(relay, lambda g: len(g.requests)),
        switches=med(relay, lambda g: g.switches),
        prefilled=med(relay, lambda g: g.prefilled),
        min_text=med(relay, lambda g: g.min_text),
        large_share=med(relay, share),
        completion=med(relay, completion),
        text_ok=all(g.text_ok for g in relay),
    )


def replay_figures(replayed: Sequence[Generation]) -> ReplayFigures | None:
    if not replayed:
        return None
    return ReplayFigures(
        back_to_back=med(replayed, lambda g: g.replays["back_to_back"]),
        paused=med(replayed, lambda g: g.replays["paused"]),
        relay_over_replay=med(replayed, lambda g: g.wall / g.replays["back_to_back"]),
        interference=med(replayed, lambda g: g.replays["back_to_back"] / g.replays["paused"]),
        paused_over_ideal=med(replayed, lambda g: g.replays["paused"] / g.ideal),
        same_tokens=all(g.replays_same_tokens for g in replayed),
    )


def replay_shapes(replayed: Sequence[Generation]) -> ReplayShapes | None:
    raw = [g for g in replayed if "whole" in g.replays]
    if not raw:
        return None
    return ReplayShapes(
        seconds={k: median([g.replays[k] for g in raw]) for k in SHAPE_KINDS},
        ratios={
            name: Spread.of([g.replays[a] / g.replays[b] for g in raw])
            for name, (a, b) in SHAPE_RATIOS.items()
        },
    )


def authors_figures(
    authors: Sequence[Generation], relay: Sequence[Generation]
) -> AuthorsFigures | None:
    if not authors:
        return None
    # paired by run: the two ran back to back on the same trace
    pairs = [(a, r) for a in authors for r in relay if a.run == r.run]
    walls = [a.wall / r.wall for a, r in pairs]
    return AuthorsFigures(
        wall=med(authors, lambda g: g.wall),
        ideal=med(authors, lambda g: g.ideal),
        ratio=med(authors, lambda g: g.ratio),
        requests=med(authors, lambda g: len(g.requests)),
        switches=med(authors, lambda g: g.switches),
        prefilled=med(authors, lambda g: g.prefilled),
        min_text=med(authors, lambda g: g.min_text),
        models_lookups=med(authors, lambda g: sum(r.models_seconds for r in g.requests)),
        completion=med(authors, completion),
        text_ok=all(g.text_ok for g in authors),
        divergence=next((g.divergence() for g in authors if not g.text_ok), ""),
        over_relay_wall=median(walls),
        over_relay_prefill=median([a.prefilled / r.prefilled for a, r in pairs]),
        over_relay_wall_range=(min(walls), max(walls)),
    )


def alone_figures(
    alone: Sequence[Generation], relay: RelayFigures, authors: AuthorsFigures | None
) -> AloneFigures | None:
    if not alone:
        return None
    wall = med(alone, lambda g: g.wall)
    return AloneFigures(
        wall=wall,
        ideal=med(alone, lambda g: g.ideal),
        ratio=med(alone, lambda g: g.ratio),
        completion=med(alone, lambda g: g.completion("large")),
        speedup_relay=wall / relay.wall,
        speedup_authors=wall / authors.wall if authors else None,
    )


def trace_summary(
    gens: Sequence[Generation], mode: str, name: str, penalty: Mapping[ModelRole, float]
) -> TraceSummary:
    relay, authors = by(gens, "relay", mode, name), by(gens, "authors", mode, name)
    both = relay + authors
    replayed = [g for g in relay if g.replays]
    relay_part, authors_part = relay_figures(relay), authors_figures(authors, relay)
    return TraceSummary(
        relay=relay_part,
        canonical_share=med(both, lambda g: g.canonical_share),
        foreign_cores=med(both, lambda g: g.foreign_cores),
        foreign_cores_max=max(g.foreign_cores for g in both),
        foreign_requests=sum(g.foreign_requests for g in both),
        disturbed_runs=sum(1 for g in both if not g.quiet),
        runs=len(both),
        fallbacks=sum(g.fallbacks for g in both),
        replay=replay_figures(replayed),
        replay_shapes=replay_shapes(replayed),
        relay_breakdown=Breakdown.median_of([breakdown(g, penalty) for g in relay]),
        authors=authors_part,
        alone=alone_figures(by(gens, "large_alone", mode, name), relay_part, authors_part),
    )


def excesses(gens: Sequence[Generation], skip: int = 0) -> list[int]:
    """Tokens prefilled above the minimum, of each request (after the first `skip` of each
    generation)."""
    return [r.prefilled - r.min_text for g in gens for r in g.requests[skip:]]


def mode_summary(engine: EngineResult, mode: str) -> ModeSummary:
    gens = engine.generations
    penalty = {role: x.handoff_penalty for role, x in engine.extras.items()}
    rounds = [r for r in engine.rounds if r.mode == mode]
    rates = {role: ModelRates.over([r.rates[role] for r in rounds]) for role in ("large", "small")}
    relay_all = by(gens, "relay", mode)
    replayed = [g for g in relay_all if g.replays]
    quiet = [g for g in relay_all if g.quiet]
    return ModeSummary(
        rates=rates,
        traces={t.name: trace_summary(gens, mode, t.name, penalty) for t in engine.traces},
        ratio_median=med(relay_all, lambda g: g.ratio),
        relay_over_replay_median=(
            med(replayed, lambda g: g.wall / g.replays["back_to_back"]) if replayed else None
        ),
        ratio_quiet=med(quiet, lambda g: g.ratio) if quiet else None,
        quiet_runs=len(quiet),
        rates_foreign_cores=median([r.foreign_cores for r in rounds]),
        speed_ratio=rates["small"].decode.median / rates["large"].decode.median,
        max_excess_text=max(excesses(relay_all)),
        excess_median=median(excesses(relay_all, skip=1)),
        authors_max_excess_text=max(excesses(by(gens, "authors", mode)), default=0),
        requests_over_block_text=sum(1 for x in excesses(relay_all) if x > BLOCK),
        prompt_mismatches=sum(r.prompt_mismatch for g in relay_all for r in g.requests),
        requests=sum(len(g.requests) for g in relay_all),
    )


def summarize(engine: EngineResult) -> Summary:
    return Summary(by_mode={mode: mode_summary(engine, mode) for mode in engine.modes})


def example_generation(engine: EngineResult) -> Generation | None:
    """The relay generation of median wall time (first forcing, first trace)."""
    gens = sorted(
        by(engine.generations, "relay", engine.modes[0], engine.traces[0].name),
        key=lambda g: g.wall,
    )
    return gens[len(gens) // 2] if gens else None
