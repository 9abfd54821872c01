"""The plain-text report."""

from __future__ import annotations

from typing import Any

from .analysis import example_generation
from .rates import Extras
from .recording import Generation
from .settings import DECODE_SHORT, PREFILL_SHORT, QUIET, REPLAY_PAUSE, RESUME_NEW
from .variants import report_lines, variant_summary


def pct(x: float) -> str:
    return f"{100 * x:+.1f}%"


def gpu_projection(share: float, ratio: float) -> float:
    """Speedup over the large model alone: 1 / (s + (1 - s) / r), prefill ignored."""
    return 1 / (share + (1 - share) / ratio)


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


def client_lines(client: dict[str, Any]) -> list[str]:
    """Section 5: the client's own CPU against the scripted upstream."""
    lines: list[str] = []
    w = lines.append
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
    if "fit_detection" in client:
        d = client["fit_detection"]
        verdict = "MET" if d["cpu_per_token_us"] <= 20 else "MISSED"
        w(
            f"   with max_stop_strings={client['stop_limit']} (stops found in the stream): "
            f"a = {d['cpu_per_token_us']:.1f} us per streamed token (goal <= 20: {verdict}), "
            f"b = {d['cpu_per_switch_ms']:.2f} ms per switch, c = "
            f"{d['cpu_per_generation_ms']:.2f} ms per generation (R^2 {d['r_squared']:.4f})"
        )
    w(f"   {'switches':>8} {'tokens':>7} {'requests':>8} {'cpu ms/gen':>10} {'wall ms/gen':>11}")
    for c in sorted(client["cells"], key=lambda c: (c["switches_per_gen"], c["tokens_per_gen"])):
        w(
            f"   {c['switches_per_gen']:>8.1f} {c['tokens_per_gen']:>7.0f} "
            f"{c['requests_per_gen']:>8.1f} {c['cpu_ms_per_gen']:>10.2f} "
            f"{c['wall_ms_per_gen']:>11.2f}"
        )
    w(
        "   concurrent generations in one process (2 switches each; N generations at once, "
        "limit: the endpoints' max_concurrency; gc: the collector's first threshold; "
        "medians of the runs):"
    )
    w(
        f"   {'N':>5} {'limit':>5} {'gc':>6} {'wall s':>7} {'client CPU s':>12} "
        f"{'ms CPU/gen':>10} {'in gc s':>7} {'upstream CPU s':>14} "
        f"{'loop late max ms':>16} {'p99 ms':>8} {'p50 ms':>7} {'others':>7}"
    )
    for level in client["concurrent"]:
        m = level["median"]
        w(
            f"   {level['generations']:>5} {level['limit']:>5} "
            f"{level['gc_threshold'] or 'python':>6} {m['wall_s']:>7.2f} "
            f"{m['client_cpu_s']:>12.2f} {m['client_cpu_ms_per_generation']:>10.1f} "
            f"{m['gc_s']:>7.2f} {m['upstream_cpu_s']:>14.2f} "
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
        if sm["relay_over_replay_median"] is not None:
            w("   the same requests replayed without the switcher (replay.py; a new session id):")
            for name, e in sm["traces"].items():
                w(
                    f"   {name:7} back to back {e['replay_back_to_back']:6.2f} s, with "
                    f"{REPLAY_PAUSE} s pauses {e['replay_paused']:6.2f} s in requests: "
                    f"relay/back-to-back {e['relay_over_replay']:.3f} (the switcher's own cost), "
                    f"back-to-back/paused {e['replay_interference']:.3f} (the two servers at "
                    f"hand-offs), paused/ideal {e['replay_paused_over_ideal']:.3f} (the requests "
                    "on the engine)"
                    + (
                        ""
                        if e["replays_same_tokens"]
                        else "; some requests wrote other token counts again"
                        + (" (regex forcing: a new split each time)" if mode == "regex" else "")
                    )
                )
            w(f"   relay/back-to-back, median over all runs: {sm['relay_over_replay_median']:.3f}")
            for name, e in sm["traces"].items():
                if "replay_shapes" in e:
                    times = ", ".join(f"{k} {v:.2f} s" for k, v in e["replay_shapes"].items())
                    w(f"   {name:7} the same requests back to back: {times}")
                    for label, (mid, lo, hi) in e["replay_shape_ratios"].items():
                        w(f"           {label}: {mid:.3f} [{lo:.3f}-{hi:.3f}]")
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
        lines += client_lines(client)
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
    if engine.get("variants"):
        lines += report_lines(variant_summary(engine))
    return "\n".join(lines)
