"""The plain-text report: one function a section, each returning its lines."""

from __future__ import annotations

from collections.abc import Mapping

from relay_integrations.upstream.config import ModelRole

from .analysis import example_generation
from .client_cost import ClientCosts
from .rates import Extras
from .recording import Generation
from .results import (
    AloneFigures,
    AuthorsFigures,
    EngineResult,
    ModelRates,
    ModeSummary,
    RelayFigures,
    ReplayFigures,
    RunFacts,
    Spread,
    Summary,
    TraceSummary,
)
from .settings import DECODE_SHORT, PREFILL_SHORT, QUIET, REPLAY_PAUSE, RESUME_NEW
from .variants import report_lines, variant_summary


def pct(x: float) -> str:
    return f"{100 * x:+.1f}%"


def gpu_projection(share: float, ratio: float) -> float:
    """Speedup over the large model alone: 1 / (s + (1 - s) / r), prefill ignored."""
    return 1 / (share + (1 - share) / ratio)


def report(
    facts: RunFacts, engine: EngineResult, summary: Summary, client: ClientCosts | None
) -> str:
    lines = [
        *header(facts, engine),
        "",
        *model_rates(engine, summary),
        "",
        *relay_vs_ideal(engine, summary),
        "",
        *prefill_per_request(engine, summary),
        "",
        *published_loop(engine, summary),
        "",
    ]
    if client is not None:
        lines += [*client_own_cost(client), ""]
    lines += speedup_projection(engine, summary)
    if engine.variants:
        lines += report_lines(variant_summary(engine))
    return "\n".join(lines)


def header(facts: RunFacts, engine: EngineResult) -> list[str]:
    """The command, the machine, the servers and the traces."""
    m = facts.machine
    traces = "; ".join(f"{t.name}: {t.tokens} tokens, {t.cues} cues" for t in engine.traces)
    prompt = "?" if facts.prompt_tokens is None else facts.prompt_tokens
    lines = [
        "RelayGen switcher benchmark (python -m benchmarks switcher)",
        "=" * 72,
        f"command:  {m.command}",
        f"machine:  nproc {m.cpus}, {m.cpu}, Python {m.python},",
        f"          {m.platform}; repo {m.commit}, openai {m.versions['openai']}",
        f"servers:  {facts.servers}",
    ]
    if m.library_uncommitted:
        lines.append(f"library:  uncommitted changes measured as found: {m.library_uncommitted}")
    return [
        *lines,
        f"load avg: {m.load_at_start} at start, {m.load_at_end} at end",
        "          (shared machine: other benchmarks and tests come and go; medians over runs)",
        f"traces:   {traces}; prompt ~{prompt} tokens, fresh per generation",
        f"forcing:  {', '.join(engine.modes)} (see docs/benchmarks.md); measured runs per trace: "
        f"{facts.runs}",
    ]


RATE_ROWS = (
    ("overhead", "per-request overhead o", "ms", 1e3),
    ("overhead_forced", "  ... under the forcing", "ms", 1e3),
    ("overhead_resume", "  ... resuming a cached context", "ms", 1e3),
    ("prefill", "prefill rate p", "tokens/s", 1.0),
    ("decode", "decode rate d", "tokens/s", 1.0),
)


def model_rates(engine: EngineResult, summary: Summary) -> list[str]:
    """Section 1: the rates of each forcing, and the figures measured once."""
    lines = [
        "1. Model rates, measured in every round next to its generations (median over rounds,",
        "   [min-max]); o: TTFT of a 1-token prompt; p: 1024 never-seen tokens / (TTFT - o);",
        "   d: (n2 - n1)/(T2 - T1) of two forced requests (16 and 216 tokens, ~900 cached context);",
        f"   o_res, 'resuming a cached context': that 1024-token prompt + {RESUME_NEW} new tokens,"
        f" TTFT - {RESUME_NEW}/p (not in the ideal)",
    ]
    for mode in engine.modes:
        lines += rate_table(mode, summary.by_mode[mode].rates)
    return lines + measured_once(engine.extras)


def rate_table(mode: str, rates: Mapping[ModelRole, ModelRates]) -> list[str]:
    lines = [
        f"   {'-- ' + mode + ' forcing --':30} {'large':>22} {'small':>22} {'small/large':>11}"
    ]
    for key, label, unit, scale in RATE_ROWS:
        large: Spread = getattr(rates["large"], key)
        small: Spread = getattr(rates["small"], key)
        cells = [
            f"{x.median * scale:.1f} [{x.low * scale:.0f}-{x.high * scale:.0f}]"
            for x in (large, small)
        ]
        ratio = small.median / large.median
        lines.append(f"   {label:30} {cells[0]:>22} {cells[1]:>22} {ratio:>11.2f}  {unit}")
    return lines


def _rate(tokens_per_second: float | None) -> str:
    if tokens_per_second is None:
        return "- (its TTFT is within a 1-token request's)"
    return f"{tokens_per_second:.0f}"


def measured_once(extras: Mapping[ModelRole, Extras]) -> list[str]:
    L, S = extras["large"], extras["small"]
    handoffs = ", ".join(
        f"{1e3 * x.handoff_penalty:+.0f} ms ({x.handoff_penalty / x.handoff_paused:+.0%}; "
        f"TTFT {1e3 * x.handoff_penalty_ttft:+.0f} ms) on the {r} model"
        for r, x in (("large", L), ("small", S))
    )
    return [
        f"   once: decode unforced (ignore_eos) {L.decode_unforced:.1f} / {S.decode_unforced:.1f} "
        f"tokens/s; prefill of {PREFILL_SHORT} tokens {_rate(L.prefill_short)} / "
        f"{_rate(S.prefill_short)} tokens/s; a new regex's first request (grammar compiled) "
        f"{1e3 * L.overhead_regex_cold:.0f} / {1e3 * S.overhead_regex_cold:.0f} ms (large / small)",
        f"   a request started right after the other server's takes {handoffs} than after a "
        f"0.3 s pause ({DECODE_SHORT} forced tokens; CPU interference)",
    ]


IDEAL_INTRO = """\
2. Relay wall time vs the IDEAL time of the same tokens (no switching overhead)
   ideal = sum_m C_m/d_m + sum_k U_k/p_m(k) + o_large
   C_m: completion tokens model m wrote (usage, all its requests); d_m, p_m, o: the rates
   of the same round; U_k: the minimum prefill of request k (section 3, text); the one
   overhead is the first request's. Target: relay/ideal <= 1.05.
"""


def relay_vs_ideal(engine: EngineResult, summary: Summary) -> list[str]:
    """Section 2: the relay's wall time against the ideal, and where the time goes."""
    lines = IDEAL_INTRO.splitlines()
    for mode in engine.modes:
        lines += ideal_of_mode(mode, summary.by_mode[mode])
    for mode in engine.modes:
        for name, e in summary.by_mode[mode].traces.items():
            lines += where_the_time_goes(mode, name, e)
    return lines


def ideal_of_mode(mode: str, sm: ModeSummary) -> list[str]:
    lines = [f"   -- {mode} forcing --"]
    for name, e in sm.traces.items():
        r = e.relay
        lo, hi = r.ratio_range
        lines.append(
            f"   {name:7} relay {r.wall:6.2f} s, ideal {r.ideal:6.2f} s: "
            f"relay/ideal {r.ratio:.3f} [{lo:.3f}-{hi:.3f}]; "
            f"{r.requests:.0f} requests, {r.switches:.0f} switches, "
            f"{r.completion:.0f} tokens (large {r.large_share:.0%}; "
            f"canonical {e.canonical_share:.0%})"
        )
    ratio = sm.ratio_median
    verdict = "MET" if ratio <= 1.05 else f"MISSED: {pct(ratio - 1)} over ideal, target +5%"
    lines.append(f"   relay/ideal, median over all runs: {ratio:.3f} -> {verdict}")
    if sm.relay_over_replay_median is not None:
        lines += replays(mode, sm, sm.relay_over_replay_median)
    if sm.ratio_quiet is not None:
        lines.append(
            f"   over the {sm.quiet_runs} quiet runs only (no other requests on the servers, "
            f"others used < {QUIET} cores, during the run and its round's rates): "
            f"{sm.ratio_quiet:.3f}"
        )
    return [*lines, others_meanwhile(sm)]


def replays(mode: str, sm: ModeSummary, over_replay: float) -> list[str]:
    """The relay's requests replayed without the switcher, and in the raw shapes."""
    lines = ["   the same requests replayed without the switcher (replay.py; a new session id):"]
    for name, e in sm.traces.items():
        lines.append(f"   {name:7} " + replay_line(mode, replayed(e)))
    lines.append(f"   relay/back-to-back, median over all runs: {over_replay:.3f}")
    for name, e in sm.traces.items():
        if e.replay_shapes is not None:
            times = ", ".join(f"{k} {v:.2f} s" for k, v in e.replay_shapes.seconds.items())
            lines.append(f"   {name:7} the same requests back to back: {times}")
            lines += [f"           {label}: {s}" for label, s in e.replay_shapes.ratios.items()]
    return lines


def replayed(e: TraceSummary) -> ReplayFigures:
    if e.replay is None:
        raise ValueError("a trace without replays where the others have them")
    return e.replay


def replay_line(mode: str, x: ReplayFigures) -> str:
    differs = "" if x.same_tokens else "; some requests wrote other token counts again"
    if differs and mode == "regex":
        differs += " (regex forcing: a new split each time)"
    return (
        f"back to back {x.back_to_back:6.2f} s, with "
        f"{REPLAY_PAUSE} s pauses {x.paused:6.2f} s in requests: "
        f"relay/back-to-back {x.relay_over_replay:.3f} (the switcher's own cost), "
        f"back-to-back/paused {x.interference:.3f} (the two servers at "
        f"hand-offs), paused/ideal {x.paused_over_ideal:.3f} (the requests "
        "on the engine)" + differs
    )


def others_meanwhile(sm: ModeSummary) -> str:
    """What other processes and other clients of the servers did during the runs."""
    traces = sm.traces.items()
    return (
        "   other processes on the machine used a median of "
        + ", ".join(
            f"{e.foreign_cores:.2f} cores (max {e.foreign_cores_max:.2f}) in {name}"
            for name, e in traces
        )
        + f", {sm.rates_foreign_cores:.2f} during the rate measurements; the servers "
        "served others "
        + ", ".join(f"{e.foreign_requests} requests in {name}" for name, e in traces)
        + "; disturbed runs (relay and authors): "
        + ", ".join(f"{e.disturbed_runs} of {e.runs} in {name}" for name, e in traces)
    )


def where_the_time_goes(mode: str, name: str, e: TraceSummary) -> list[str]:
    b = e.relay_breakdown
    rows = (
        ("relay wall", b.wall),
        ("  before the first request (prompt rendering)", b.rendering),
        (f"  time to first token, sum over {b.requests:.0f} requests", b.ttft_sum),
        ("     the rates predict o(forced) + P/p each", b.ttft_predicted),
        ("  first to last token, sum", b.decoding_sum),
        ("     the rates predict (C - 1)/d each", b.decoding_predicted),
        ("  client, between requests", b.between_requests),
        ("ideal", b.ideal),
        ("relay - ideal", b.excess),
        ("  prompt rendering", b.rendering),
        (
            f"  fixed cost of {b.requests - 1:.0f} more requests, sum (o - 1/d)",
            b.request_fixed_costs,
        ),
        ("  the forcing's grammar, every request (benchmark only)", b.grammar_per_request),
        ("  prefill above the minimum, sum (P - U)/p", b.excess_prefill),
        ("  resuming a cached context costs more than o, sum (o_res - o)", b.resume_overheads),
        ("  client, between requests", b.between_requests),
        ("  starting right after the other server (measured penalty)", b.handoff_interference),
        ("  residual (requests slower than the rates predict)", b.residual),
    )
    switches = e.relay.switches
    return [
        f"   where the time goes ({mode}, {name}; medians over runs; s and % of ideal):",
        *(f"     {label:58} {value:7.3f} s {100 * value / b.ideal:6.1f}%" for label, value in rows),
        f"     relay - ideal per switch ({switches:.0f} switches): "
        f"{1e3 * b.excess / switches:.0f} ms",
        f"     (inside C, so inside the ideal: {b.lookahead_tokens:.0f} look-ahead tokens "
        f"written then cut at hand-offs ('. ', ' Now '), {b.lookahead_seconds:.3f} s)",
    ]


PREFILL_INTRO = """\
3. Prefill per request: prefilled = prompt - cached (usage) vs the minimum U = tokens
   that model had not yet seen (prompt minus its longest common prefix with an earlier
   prompt + completion of the same model in this generation, that text re-tokenized).
   Target: excess <= 128 (one cache block).
"""


def prefill_per_request(engine: EngineResult, summary: Summary) -> list[str]:
    """Section 3: the tokens prefilled against the minimum, request by request."""
    lines = PREFILL_INTRO.splitlines()
    g = example_generation(engine)
    if g is not None:
        lines.append(f"   one relay generation ({g.mode} forcing, {g.trace}, run {g.run + 1}):")
        lines += request_table(g)
    for mode in engine.modes:
        sm = summary.by_mode[mode]
        over = sm.requests_over_block_text
        verdict = "MET" if over == 0 else f"MISSED: {over} requests above 128"
        mismatches = sm.prompt_mismatches
        lines.append(
            f"   {mode}: max excess over all {sm.requests} relay requests {sm.max_excess_text} "
            f"tokens, median {sm.excess_median:.0f} -> {verdict}"
            + (f"; {mismatches} prompts re-tokenized to another length" if mismatches else "")
        )
    return lines


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


AUTHORS_INTRO = """\
4. The published loop on the same traces and servers (one non-streamed chat completion
   per segment with continue_final_message, a GET /v1/models before each), as ratios
   authors/relay paired by run:
"""


def published_loop(engine: EngineResult, summary: Summary) -> list[str]:
    """Section 4: the authors' loop against the relay, its prompts, and the large model alone."""
    lines = AUTHORS_INTRO.splitlines()
    for mode in engine.modes:
        sm = summary.by_mode[mode]
        for name, e in sm.traces.items():
            if e.authors is not None:
                lines += authors_against_relay(f"   {mode:6} {name:7} ", e.relay, e.authors)
        lines.append(
            f"   {mode}: largest excess of one of their requests over its own minimum: "
            f"{sm.authors_max_excess_text} tokens"
        )
    lines += [
        "   what the server renders for their requests (the assistant turn; the relay sends the",
        "   chat rendered once + the text so far, i.e. '<|im_start|>assistant\\n' + text):",
    ]
    for name, text in engine.rendering.items():
        lines += [f"     {name}:", f"       {text}"]
    lines.append(
        "   the large model alone writing the whole trace in one request (the paper's baseline):"
    )
    for mode in engine.modes:
        for name, e in summary.by_mode[mode].traces.items():
            if e.alone is not None:
                lines.append(f"   {mode:6} {name:7} " + alone_line(e.alone))
    return lines


def authors_against_relay(place: str, relay: RelayFigures, a: AuthorsFigures) -> list[str]:
    lo, hi = a.over_relay_wall_range
    return [
        f"{place}wall {a.wall:6.2f} s vs {relay.wall:6.2f} s: "
        f"x{a.over_relay_wall:.3f} [{lo:.3f}-{hi:.3f}]; prefilled "
        f"{a.prefilled:.0f} vs {relay.prefilled:.0f} tokens: "
        f"x{a.over_relay_prefill:.2f}; authors/ideal {a.ratio:.3f}",
        f"          {a.requests:.0f} requests ({a.switches:.0f} "
        f"switches) + as many GET /v1/models ({1e3 * a.models_lookups:.0f} ms "
        f"in all); text == trace: relay {relay.text_ok}, authors {a.text_ok}"
        + (f" ({a.divergence})" if a.divergence else ""),
    ]


def alone_line(x: AloneFigures) -> str:
    authors = x.speedup_authors
    return (
        f"{x.wall:6.2f} s (ideal {x.ideal:.2f} s, "
        f"x{x.ratio:.3f}); speedup of the relay x{x.speedup_relay:.2f}"
        + (f", of the authors' loop x{authors:.2f}" if authors else "")
    )


def client_own_cost(client: ClientCosts) -> list[str]:
    """Section 5: the client's own CPU against the scripted upstream."""
    f = client.fit
    lines = [
        "5. The client's own cost: CPU time of this process (time.process_time) against the",
        "   scripted upstream (benchmarks.upstream, token_delay=0, its own process)",
        f"   least squares cpu = a*tokens + b*switches + c*generations over "
        f"{len(client.cells)} cells:",
        f"   a = {f.cpu_per_token_us:.1f} us per streamed token, b = "
        f"{f.cpu_per_switch_ms:.2f} ms per switch (2 requests), c = "
        f"{f.cpu_per_generation_ms:.2f} ms per generation (R^2 {f.r_squared:.4f}, "
        f"largest residual {100 * f.max_relative_residual:.1f}%)",
    ]
    d = client.fit_detection
    if d is not None:
        verdict = "MET" if d.cpu_per_token_us <= 20 else "MISSED"
        lines.append(
            f"   with max_stop_strings={client.stop_limit} (stops found in the stream): "
            f"a = {d.cpu_per_token_us:.1f} us per streamed token (goal <= 20: {verdict}), "
            f"b = {d.cpu_per_switch_ms:.2f} ms per switch, c = "
            f"{d.cpu_per_generation_ms:.2f} ms per generation (R^2 {d.r_squared:.4f})"
        )
    lines.append(
        f"   {'switches':>8} {'tokens':>7} {'requests':>8} {'cpu ms/gen':>10} {'wall ms/gen':>11}"
    )
    for c in sorted(client.cells, key=lambda c: (c.switches_per_gen, c.tokens_per_gen)):
        lines.append(
            f"   {c.switches_per_gen:>8.1f} {c.tokens_per_gen:>7.0f} "
            f"{c.requests_per_gen:>8.1f} {c.cpu_ms_per_gen:>10.2f} "
            f"{c.wall_ms_per_gen:>11.2f}"
        )
    return lines + concurrent_generations(client)


def concurrent_generations(client: ClientCosts) -> list[str]:
    """Section 5, its second part: many generations at once in one process."""
    lines = [
        "   concurrent generations in one process (2 switches each; N generations at once, "
        "limit: the endpoints' max_concurrency; gc: the collector's first threshold; "
        "medians of the runs):",
        f"   {'N':>5} {'limit':>5} {'gc':>6} {'wall s':>7} {'client CPU s':>12} "
        f"{'ms CPU/gen':>10} {'in gc s':>7} {'upstream CPU s':>14} "
        f"{'loop late max ms':>16} {'p99 ms':>8} {'p50 ms':>7} {'others':>7}",
    ]
    for level in client.concurrent:
        m = level.median
        lines.append(
            f"   {level.generations:>5} {level.limit:>5} "
            f"{level.gc_threshold or 'python':>6} {m.wall_s:>7.2f} "
            f"{m.client_cpu_s:>12.2f} {m.client_cpu_ms_per_generation:>10.1f} "
            f"{m.gc_s:>7.2f} {m.upstream_cpu_s:>14.2f} "
            f"{m.lateness_max_ms:>16.1f} {m.lateness_p99_ms:>8.1f} "
            f"{m.lateness_p50_ms:>7.1f} {m.others_cores:>6.2f}c"
        )
    for level in client.concurrent:
        for r in level.runs:
            if r.errors or r.switches_ok != level.generations:
                lines.append(
                    f"   N={level.generations}: {r.errors} errors, "
                    f"{r.switches_ok} generations with 2 switches; {r.first_error}"
                )
    lines.append(
        "   ('loop late': how late a task sleeping 5 ms wakes up; 'others': cores other "
        "processes used meanwhile)"
    )
    return lines


PROJECTION_INTRO = """\
6. What the ideal formula says about the speedup over the large model alone: time
   relative to it ~ s + (1 - s)/r (s: the large model's share of the tokens, r: the
   small model's per-token speed over the large one's; prefill and overheads ignored)
"""


def speedup_projection(engine: EngineResult, summary: Summary) -> list[str]:
    """Section 6: the speedup the ideal formula predicts, here and for the paper's pair."""
    lines = PROJECTION_INTRO.splitlines()
    for mode in engine.modes:
        sm = summary.by_mode[mode]
        r = sm.speed_ratio
        for name, e in sm.traces.items():
            s = e.relay.large_share
            measured = f"; measured x{e.alone.speedup_relay:.2f}" if e.alone is not None else ""
            lines.append(
                f"   {mode:6} {name:7} s = {s:.2f}, r = {r:.2f}: predicted "
                f"x{gpu_projection(s, r):.2f}{measured}"
            )
    paper = ", ".join(f"r = {r}: x{gpu_projection(0.7, r):.2f}" for r in (2, 3, 4, 6, 8))
    eagle = ", ".join(f"r = {r}: x{1 / (0.7 / 1.79 + 0.3 / r):.2f}" for r in (3, 4, 6))
    return [
        *lines,
        f"   the paper's pair (Qwen3-32B/1.7B, s ~ 0.70, r not reported): {paper}, "
        f"r -> inf: x{1 / 0.7:.2f}; reported x1.29 (fits r ~ 4)",
        "   with Eagle-3 speeding the large model alone x1.79 (paper): s/1.79 + (1 - s)/r, "
        f"{eagle}; reported x2.20",
    ]
