"""The relay's cue modes and request shapes, side by side on the same traces and servers.

Each variant is the same ``RelaySwitcher`` with one thing changed, run in the same rounds as
the default relay and the authors' loop (the order rotates by run), so that their wall times
can be paired by run:

- ``stream1``: ``EndpointConfig(max_stop_strings=1)``: only the end of reasoning goes to vLLM,
  every cue and sentence end is found in the stream and the request closed there (the mode a
  stock server gets for a real cue set of ~145 stop strings, where nearly all are past 4);
- ``stream4``: ``max_stop_strings=4`` as on a stock server; with the benchmark's two cues the
  first four stops are the ones that fire, so vLLM still stops every request itself and what
  changes is the shorter stop list and ``continuous_usage_stats``;
- ``pad145``: the default mode with never-occurring cues added, so the large model's requests
  carry ~145 stop strings (as the built-in Qwen3 cue set does) instead of 13;
- ``waits``: ``SwitchPolicy(speculative_handoff=False)``: the next model's request goes out
  only once the confirming token after `` Now`` or ``.`` has arrived (the relay before the
  speculative hand-off);
- ``warm``: ``SwitchPolicy(warm_small_prompt=True)``: the small model's prompt is sent when
  the generation starts, so its first turn finds it in the prefix cache;
- ``chunk4``: every request asks vLLM for a chunk every 4 tokens (vLLM's per-request
  ``stream_interval``, sent in ``EndpointConfig.extra_body``; the first and last chunks come
  at once): fewer chunks for the servers' API processes and the client on shared cores.

And one variant of the authors' loop (:class:`LoopTransport`), the same loop with its requests
sent the relay's way:

- ``authors_stream``: ``/v1/completions`` with the relay's rendered prompt (the server's chat
  template, then the text so far), streamed, instead of their non-streamed
  ``/v1/chat/completions`` with ``continue_final_message``. The loop's stops, ``min_tokens``,
  forcing and sampling stay theirs, so authors / authors_stream is what the relay's way of
  sending a request costs or gains, apart from its switching.

Overshoot: for a request the client closes at a stop string, vLLM keeps generating until the
abort reaches the engine. Its ``vllm:generation_tokens_total`` counter (read once it has
stopped moving, as ``settled_count`` in the tests) minus the tokens the relay counted is what
it wrote past the cue.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import BaseModel

from relay_integrations.jobs.statistics import median

from .recording import WARM_UP, Generation
from .results import EngineResult, Spread


@dataclass(frozen=True)
class RelayVariant:
    name: str
    label: str
    max_stop_strings: int | None = None
    padding: int = 0  # never-occurring cues added (10 stop strings each)
    speculative_handoff: bool = True
    warm_small_prompt: bool = False
    stream_interval: int | None = None  # vLLM's per-request chunk interval, in tokens

    @property
    def streams_stops(self) -> bool:
        return self.max_stop_strings is not None

    def padding_cues(self) -> list[str]:
        return [f"Zq{chr(ord('a') + i)}xv" for i in range(self.padding)]


VARIANTS = {
    v.name: v
    for v in (
        RelayVariant("stream1", "max_stop_strings=1 (cues and sentence ends in the stream)", 1),
        RelayVariant("stream4", "max_stop_strings=4 (a stock server's limit)", 4),
        RelayVariant("pad145", "~145 stop strings a large request (13 padding cues)", None, 13),
        RelayVariant(
            "waits", "speculative_handoff=False (waits for the confirming token)", None, 0, False
        ),
        RelayVariant(
            "warm",
            "warm_small_prompt=True (the small model's prompt sent when the generation starts)",
            warm_small_prompt=True,
        ),
        RelayVariant(
            "chunk4", "stream_interval=4 (vLLM sends a chunk every 4 tokens)", stream_interval=4
        ),
    )
}
DEFAULT_RELAY = RelayVariant("relay", "stop strings (13 a large request, 8 a small one)")


@dataclass(frozen=True)
class LoopTransport:
    """How the authors' loop sends its requests (the loop itself is always theirs): as their
    whole ``/v1/chat/completions`` continuing the assistant message (`chat`), or as the relay
    sends them, a streamed ``/v1/completions`` of the rendered prompt."""

    name: str
    label: str
    chat: bool


THEIRS = LoopTransport("authors", "/v1/chat/completions, continue_final_message, whole", chat=True)
LOOP_VARIANTS = {
    t.name: t
    for t in (
        LoopTransport(
            "authors_stream",
            "the authors' loop over /v1/completions, the relay's prompt, streamed",
            chat=False,
        ),
    )
}


class Overshoot(BaseModel, frozen=True):
    """Tokens vLLM wrote past a stop string the client found, per closed request."""

    cuts: int  # requests the client closed
    per_cut: Spread | None  # from the per-request pass (settled before and after each)
    per_cut_in_runs: Spread | None  # timed runs: a generation's overshoot / its cuts
    server_stopped_extra: int  # the same for requests vLLM stopped itself (should be 0)


class VariantRow(BaseModel, frozen=True):
    approach: str
    mode: str
    trace: str
    runs: int
    wall: Spread | None
    over_relay: Spread | None  # this variant's wall / the relay's of the same run
    authors_over: Spread | None  # the authors' wall / this variant's of the same run
    same_stops: bool  # every run's (model, stop reason) sequence equals the relay's (a relay
    # variant) or the authors' (a variant of their loop)
    text_ok: bool
    overshoot: Overshoot | None


def _paired(a: Sequence[Generation], b: Sequence[Generation]) -> list[float]:
    """a.wall / b.wall for the generations of the same run."""
    walls = {g.run: g.wall for g in b}
    return [g.wall / walls[g.run] for g in a if g.run in walls]


def stops_of(gen: Generation) -> list[tuple[str, str | None]]:
    """Each request's model and stop string (an end of sequence, or none, as None: the
    forced answer ends either way); the small prompt's warm-up is not a segment's request."""
    return [
        (r.role, r.stop_reason if isinstance(r.stop_reason, str) else None)
        for r in gen.requests
        if r.phase != WARM_UP
    ]


def overshoot(timed: Sequence[Generation], settled: Sequence[Generation]) -> Overshoot:
    clean = [r for g in settled for r in g.requests if not r.foreign]
    per_cut = [r.generated - r.completion_tokens for r in clean if r.cut]
    stopped = [r.generated - r.completion_tokens for r in clean if not r.cut and r.generated]
    in_runs = [  # a generation during which others used the servers would count their tokens
        (g.generated - sum(r.completion_tokens for r in g.requests)) / g.cuts
        for g in timed
        if g.cuts and g.foreign_requests == 0
    ]
    cuts = median([g.cuts for g in timed]) if timed else 0
    return Overshoot(
        cuts=round(cuts),
        per_cut=Spread.of_any(per_cut),
        per_cut_in_runs=Spread.of_any(in_runs),
        server_stopped_extra=sum(stopped) if stopped else 0,
    )


def variant_row(
    gens: Sequence[Generation], approach: str, mode: str, trace: str, streams: bool
) -> VariantRow:
    def of(name: str, run_from: int = 0) -> list[Generation]:
        return [
            g
            for g in gens
            if g.approach == name and g.mode == mode and g.trace == trace and g.run >= run_from
        ]

    mine, relay, authors = of(approach), of("relay"), of("authors")
    reference = authors if approach in LOOP_VARIANTS else relay
    stops = {g.run: stops_of(g) for g in reference}
    settled = [g for g in gens if g.approach == approach and g.mode == mode and g.trace == trace]
    return VariantRow(
        approach=approach,
        mode=mode,
        trace=trace,
        runs=len(mine),
        wall=Spread.of_any([g.wall for g in mine]),
        over_relay=Spread.of_any(_paired(mine, relay)) if approach != "relay" else None,
        authors_over=Spread.of_any(_paired(authors, mine)),
        same_stops=all(stops_of(g) == stops.get(g.run, stops_of(g)) for g in mine),
        text_ok=all(g.text_ok for g in mine),
        overshoot=overshoot(mine, [g for g in settled if g.run < 0]) if streams else None,
    )


def variant_rows(
    gens: Sequence[Generation], modes: Sequence[str], traces: Sequence[str], names: Sequence[str]
) -> list[VariantRow]:
    streams = {n: VARIANTS[n].streams_stops for n in names if n in VARIANTS}
    return [
        variant_row(gens, name, mode, trace, streams.get(name, False))
        for mode in modes
        for trace in traces
        for name in ["relay", *names]
    ]


def variant_summary(engine: EngineResult) -> list[VariantRow]:
    traces = [t.name for t in engine.traces]
    return variant_rows(engine.generations, engine.modes, traces, engine.variants)


def report_lines(rows: Sequence[VariantRow]) -> list[str]:
    labels = {DEFAULT_RELAY.name: DEFAULT_RELAY.label} | {n: v.label for n, v in VARIANTS.items()}
    labels |= {n: v.label for n, v in LOOP_VARIANTS.items()}
    lines = [
        "",
        "7. Cue modes and request shapes, side by side (same rounds; walls paired by run)",
        *(f"   {name:14} {label}" for name, label in labels.items()),
        f"   {'forcing':7} {'trace':6} {'approach':14} {'wall s (range)':>22} "
        f"{'/ relay':>22} {'authors / it':>22} stops text",
    ]
    for r in rows:
        wall = f"{r.wall.median:.2f} [{r.wall.low:.2f}-{r.wall.high:.2f}]" if r.wall else "-"
        lines.append(
            f"   {r.mode:7} {r.trace:6} {r.approach:14} {wall:>22} "
            f"{r.over_relay or '-'!s:>22} {r.authors_over or '-'!s:>22} "
            f"{'same' if r.same_stops else 'DIFF'} {'ok' if r.text_ok else 'DIFF'}"
        )
    for r in rows:
        if r.overshoot is None:
            continue
        o = r.overshoot
        lines.append(
            f"   overshoot {r.mode} {r.trace} {r.approach}: {o.cuts} requests closed by the "
            f"client a generation; tokens past the stop per closed request: {o.per_cut or '-'} "
            f"(settled per request, warm-up), {o.per_cut_in_runs or '-'} (timed runs, per "
            f"generation / closed requests); requests vLLM stopped: {o.server_stopped_extra} extra"
        )
    return lines
