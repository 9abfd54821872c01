"""3. Minimum prefill, the ideal time, where the time goes, and the medians over runs."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from relay_integrations.core.config import ModelRole

from .meters import median
from .recording import Generation, RequestRecord
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


SHAPE_RATIOS = {
    "endpoint stream / raw stream (this client)": ("back_to_back", "raw_stream"),
    "raw stream / whole (vLLM streaming)": ("raw_stream", "whole"),
    "continuous usage / raw stream": ("raw_stream_continuous", "raw_stream"),
    "endpoint stream / whole (all streaming)": ("back_to_back", "whole"),
}


def spread(values: Sequence[float]) -> list[float]:
    """[median, min, max] of `values`."""
    return [median(values), min(values), max(values)]


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
    replayed = [g for g in relay if g.replays]
    if replayed:
        e |= {
            "replay_back_to_back": med(replayed, lambda g: g.replays["back_to_back"]),
            "replay_paused": med(replayed, lambda g: g.replays["paused"]),
            "relay_over_replay": med(replayed, lambda g: g.wall / g.replays["back_to_back"]),
            "replay_interference": med(
                replayed, lambda g: g.replays["back_to_back"] / g.replays["paused"]
            ),
            "replay_paused_over_ideal": med(replayed, lambda g: g.replays["paused"] / g.ideal),
            "replays_same_tokens": all(g.replays_same_tokens for g in replayed),
        }
    raw = [g for g in replayed if "whole" in g.replays]
    if raw:
        kinds = ("back_to_back", "raw_stream", "raw_stream_continuous", "whole")
        e["replay_shapes"] = {k: median([g.replays[k] for g in raw]) for k in kinds}
        e["replay_shape_ratios"] = {
            name: spread([g.replays[a] / g.replays[b] for g in raw])
            for name, (a, b) in SHAPE_RATIOS.items()
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
            "relay_over_replay_median": med(
                [g for g in relay_all if g.replays],
                lambda g: g.wall / g.replays["back_to_back"],
            )
            if any(g.replays for g in relay_all)
            else None,
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


def example_generation(engine: dict[str, Any]) -> Generation | None:
    """The relay generation of median wall time (first forcing, first trace)."""
    gens = sorted(
        by(engine["generations"], "relay", engine["modes"][0], engine["traces"][0]["name"]),
        key=lambda g: g.wall,
    )
    return gens[len(gens) // 2] if gens else None
