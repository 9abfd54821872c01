"""The figures: each approach's walls over the relay's, paired by run, and the table::

    measured = [Measured("tokens", "orders", run=0, gen=relay_gen), Measured(..., authors_gen)]
    for line in table(paired(measured)):
        print(line)

A run is one generation of every approach on one trace, back to back (the order rotating
from run to run), so the ratio of two walls of a run compares them under the same conditions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import BaseModel

from relay_integrations.jobs.statistics import median

from .approaches import Generation


@dataclass(frozen=True)
class Measured:
    """One timed generation, where it ran: forcing, trace and run."""

    mode: str
    trace: str
    run: int
    gen: Generation
    foreign_cores: float = 0.0  # cores other processes used meanwhile


class Row(BaseModel, frozen=True):
    """One approach against the relay on one forcing and trace, over the runs of both."""

    mode: str
    trace: str
    approach: str  # authors | stream
    over_relay: list[float]  # its wall / the relay's of the same run, run by run
    median: float  # of those
    relay_faster: int  # runs in which the relay's wall was the shorter
    wall: float  # medians, seconds
    relay_wall: float
    prefilled_over_relay: float | None  # median of the paired ratios (None: not reported)
    text_ok: list[bool]  # text == trace, run by run
    relay_text_ok: list[bool]


def row(pairs: Sequence[tuple[Generation, Generation]], mode: str, trace: str) -> Row:
    """`pairs`: (the approach's generation, the relay's) of each run."""
    walls = [g.wall / r.wall for g, r in pairs]
    prefills = [g.prefilled / r.prefilled for g, r in pairs if g.prefilled and r.prefilled]
    return Row(
        mode=mode,
        trace=trace,
        approach=pairs[0][0].approach,
        over_relay=walls,
        median=median(walls),
        relay_faster=sum(x > 1 for x in walls),
        wall=median([g.wall for g, _ in pairs]),
        relay_wall=median([r.wall for _, r in pairs]),
        prefilled_over_relay=median(prefills) if len(prefills) == len(pairs) else None,
        text_ok=[g.text_ok for g, _ in pairs],
        relay_text_ok=[r.text_ok for _, r in pairs],
    )


def paired(measured: Sequence[Measured]) -> list[Row]:
    """A row for every forcing, trace and approach other than the relay, in the order met."""
    by: dict[tuple[str, str, str], dict[int, Generation]] = {}
    for m in measured:
        by.setdefault((m.mode, m.trace, m.gen.approach), {})[m.run] = m.gen
    rows = []
    for (mode, trace, approach), gens in by.items():
        relay = by.get((mode, trace, "relay"), {})
        pairs = [(g, relay[run]) for run, g in sorted(gens.items()) if run in relay]
        if approach != "relay" and pairs:
            rows.append(row(pairs, mode, trace))
    return rows


def _texts(oks: Sequence[bool]) -> str:
    return " ".join("ok" if ok else "DIFF" for ok in oks)


def table(rows: Sequence[Row]) -> list[str]:
    """The rows as text: ratio (median, range), relay faster in k of n, walls, text == trace."""
    lines = [
        f"{'forcing':7} {'trace':6} {'approach':8} {'wall / relay, paired by run':>28} "
        f"{'relay faster':>12} {'walls: relay / it':>18} {'prefill / relay':>15}  text == trace"
    ]
    for r in rows:
        prefill = "-" if r.prefilled_over_relay is None else f"x{r.prefilled_over_relay:.2f}"
        ratio = f"x{r.median:.3f} [{min(r.over_relay):.3f}-{max(r.over_relay):.3f}]"
        lines.append(
            f"{r.mode:7} {r.trace:6} {r.approach:8} {ratio:>28} "
            f"{f'{r.relay_faster} of {len(r.over_relay)}':>12} "
            f"{f'{r.relay_wall:.2f} / {r.wall:.2f} s':>18} {prefill:>15}  "
            f"relay {_texts(r.relay_text_ok)}; {r.approach} {_texts(r.text_ok)}"
        )
    return lines
