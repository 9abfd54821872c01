"""The printed report of the measured generations, and the plot::

    print("\\n".join(report(measured)))  # the figures, the tokens/text ratios, the targets
    plot(measured, Path("context-length.png"))

Each figure is the median over a cell's generations (a context length and a column). "API CPU
a switch" is an API server's CPU time over the generation divided by its switches: what the
servers' Python side (HTTP, JSON, tokenizing the prompt, detokenizing) spends on a generation,
the model's own work (the EngineCore) left out, a switch's share of it. It includes what
streaming the trace's tokens costs, which the large model alone pays too; "added a switch" is
what the relay costs both servers beyond the large model writing the same trace alone, divided
by the switches: what handing the reasoning over itself costs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from relay_integrations.jobs.plotting import pyplot
from relay_integrations.jobs.statistics import median
from relay_integrations.relay import ModelRole

from .figures import ALONE, PATHS, Generation, Measured, RequestCost

ROLES: tuple[ModelRole, ...] = ("large", "small")
GROWTH_TARGET = 3.0  # tokens: API CPU a switch at the longest context / at the shortest, at most
SAVING_TARGET = 0.5  # tokens / text of API CPU a switch at the longest context, below


@dataclass(frozen=True)
class Cell:
    """The medians of one context length and column."""

    context: int
    prompt_tokens: int
    path: str
    generations: int
    cpu_per_switch: dict[ModelRole, float]  # seconds (nan: no switches)
    cpu: dict[ModelRole, float]  # seconds a generation
    switches: float
    requests: float  # a generation, both servers
    request_bytes: float  # a generation, both servers
    wall: float
    routes: dict[str, float]
    wrong: int  # generations that did not write the trace

    @property
    def cpu_per_switch_both(self) -> float:
        return sum(self.cpu_per_switch.values())

    def added_per_switch(self, alone: Cell | None) -> float:
        """Both servers' API CPU beyond `alone`'s (the large model writing the same trace in
        one request), a switch; nan without either."""
        if alone is None or not self.switches:
            return float("nan")
        return (sum(self.cpu.values()) - sum(alone.cpu.values())) / self.switches


def cells(measured: Sequence[Generation]) -> list[Cell]:
    """One cell per context length and column, in the order measured."""
    keys = list(dict.fromkeys((g.context, g.path) for g in measured))
    found = []
    for context, path in keys:
        gens = [g for g in measured if (g.context, g.path) == (context, path)]
        routes = sorted({r for g in gens for r in g.routes})
        found.append(
            Cell(
                context,
                gens[0].prompt_tokens,
                path,
                len(gens),
                {r: median([g.cpu_per_switch(r) for g in gens]) for r in ROLES},
                {r: median([g.api_cpu[r] for g in gens]) for r in ROLES},
                median([g.switches for g in gens]),
                median([sum(g.requests.values()) for g in gens]),
                median([sum(g.request_bytes.values()) for g in gens]),
                median([g.wall for g in gens]),
                {r: median([g.routes.get(r, 0) for g in gens]) for r in routes},
                sum(not g.text_ok for g in gens),
            )
        )
    return found


def ms(seconds: float) -> str:
    return "-" if math.isnan(seconds) else f"{1000 * seconds:.1f}"


def ratio(a: float, b: float) -> str:
    return "-" if math.isnan(a) or math.isnan(b) or b == 0 else f"{a / b:.2f}"


def figures_table(found: Sequence[Cell]) -> list[str]:
    """A row per context length and column."""
    alone = {c.context: c for c in found if c.path == ALONE}
    lines = [
        "| context (prompt tokens) | path | API CPU a switch, large / small (ms) "
        "| API CPU a generation, large / small (ms) | added a switch, both (ms) "
        "| requests a generation | KiB sent | wall (s) | relay / large alone |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in found:
        yardstick = alone.get(c.context) if c.path != ALONE else None
        lines.append(
            f"| {c.context} ({c.prompt_tokens}) | {c.path} "
            f"| {ms(c.cpu_per_switch['large'])} / {ms(c.cpu_per_switch['small'])} "
            f"| {ms(c.cpu['large'])} / {ms(c.cpu['small'])} "
            f"| {ms(c.added_per_switch(yardstick))} | {c.requests:.0f} "
            f"| {c.request_bytes / 1024:.0f} | {c.wall:.2f} "
            f"| {'-' if yardstick is None else ratio(c.wall, yardstick.wall)} |"
        )
    return lines


def paired(found: Sequence[Cell]) -> list[tuple[Cell, Cell]]:
    """(text, tokens) cells of each context length that has both, shortest first."""
    by_key = {(c.context, c.path): c for c in found}
    contexts = sorted({c.context for c in found})
    return [
        (by_key[(n, "text")], by_key[(n, "tokens")])
        for n in contexts
        if (n, "text") in by_key and (n, "tokens") in by_key
    ]


def ratios_table(found: Sequence[Cell]) -> list[str]:
    """tokens / text of each figure, a row per context length."""
    lines = [
        "| context | API CPU a switch tokens / text: large, small, both | requests "
        "| bytes sent | wall |",
        "|---|---|---|---|---|",
    ]
    for text, tokens in paired(found):
        cpu = (
            ", ".join(ratio(tokens.cpu_per_switch[r], text.cpu_per_switch[r]) for r in ROLES)
            + f", {ratio(tokens.cpu_per_switch_both, text.cpu_per_switch_both)}"
        )
        lines.append(
            f"| {text.context} | {cpu} | {ratio(tokens.requests, text.requests)} "
            f"| {ratio(tokens.request_bytes, text.request_bytes)} "
            f"| {ratio(tokens.wall, text.wall)} |"
        )
    return lines


def targets(found: Sequence[Cell]) -> list[str]:
    """The token path's growth with context (longest / shortest) and its saving over text at
    the longest context, both of API CPU a switch (both servers), against their targets."""
    pairs = paired(found)
    if len(pairs) < 2:
        return ["targets: need two context lengths with both paths"]
    alone = {c.context: c for c in found if c.path == ALONE}
    (text_short, tokens_short), (text_long, tokens_long) = pairs[0], pairs[-1]
    short, long_ = tokens_short.context, tokens_long.context
    figures: list[tuple[str, Callable[[Cell], float]]] = [
        ("API CPU a switch", lambda c: c.cpu_per_switch_both),
        ("API CPU added a switch", lambda c: c.added_per_switch(alone.get(c.context))),
    ]
    lines = []
    for name, figure in figures:
        growth = figure(tokens_long) / figure(tokens_short)
        text_growth = figure(text_long) / figure(text_short)
        saving = figure(tokens_long) / figure(text_long)
        if math.isnan(growth + saving):
            continue  # no large model alone measured
        lines += [
            f"tokens, {name} at {long_} / at {short}: {growth:.2f} (target <= "
            f"{GROWTH_TARGET:g}: {'met' if growth <= GROWTH_TARGET else 'MISSED'}); text: "
            f"{text_growth:.2f}",
            f"{name} at {long_}, tokens / text: {saving:.2f} (target < {SAVING_TARGET:g}: "
            f"{'met' if saving < SAVING_TARGET else 'MISSED'})",
        ]
    return lines


def routes_lines(found: Sequence[Cell]) -> list[str]:
    """The requests a generation makes, by route, at the longest context."""
    longest = max(c.context for c in found)
    return [
        f"requests a generation at {longest}, {c.path}: "
        + ", ".join(f"{route} {n:g}" for route, n in c.routes.items() if n)
        for c in found
        if c.context == longest
    ]


def costs_table(costs: Sequence[RequestCost]) -> list[str]:
    """What one request of each kind cost the large API server, a row per context length."""
    kinds = list(dict.fromkeys(c.kind for c in costs))
    by_key = {(c.context, c.kind): c.api_cpu for c in costs}
    lines = [
        "| one request, large API server's CPU (ms) | " + " | ".join(kinds) + " |",
        "|---|" + "---|" * len(kinds),
    ]
    for context in sorted({c.context for c in costs}):
        figures = (ms(by_key.get((context, k), math.nan)) for k in kinds)
        lines.append(f"| context {context} | " + " | ".join(figures) + " |")
    return lines


def report(measured: Measured) -> list[str]:
    found = cells(measured.generations)
    wrong = sum(c.wrong for c in found)
    return [
        *figures_table(found),
        "",
        *ratios_table(found),
        "",
        *targets(found),
        *routes_lines(found),
        *([f"{wrong} generations did not write the trace"] if wrong else []),
        *(["", *costs_table(measured.costs)] if measured.costs else []),
    ]


def plot(measured: Sequence[Generation], path: Path) -> None:
    """API CPU a switch (both servers) against the prompt's tokens, a line per path: a
    switch's share of a generation's, and what a switch adds beyond the large model alone."""
    plt = pyplot()
    found = cells(measured)
    alone = {c.context: c for c in found if c.path == ALONE}
    figure, axes = plt.subplots(figsize=(6.4, 4.2))
    for name, colour in zip(PATHS, ("tab:orange", "tab:blue"), strict=True):
        mine = [c for c in found if c.path == name]
        tokens = [c.prompt_tokens for c in mine]
        share = [1000 * c.cpu_per_switch_both for c in mine]
        added = [1000 * c.added_per_switch(alone.get(c.context)) for c in mine]
        axes.plot(tokens, share, marker="o", color=colour, label=f"{name}: a switch's share")
        if not any(math.isnan(a) for a in added):
            label = f"{name}: added a switch (beyond the large model alone)"
            axes.plot(tokens, added, marker="s", linestyle="--", color=colour, label=label)
    axes.set_xscale("log", base=2)
    axes.set_xlabel("prompt tokens")
    axes.set_ylabel("API-server CPU a switch, both servers (ms)")
    axes.set_title("The relay's prompts: text against token ids")
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
