"""Every figure as JSON, and the PNG plot."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from .analysis import example_generation
from .client_cost import ClientCosts
from .results import EngineResult, RunFacts, Summary, TraceSummary
from .settings import BLOCK
from .variants import variant_summary


def to_json(
    engine: EngineResult, summary: Summary, facts: RunFacts, client: ClientCosts | None
) -> dict[str, Any]:
    return {
        "facts": facts.model_dump(),
        "traces": [t.model_dump() for t in engine.traces],
        "extras": {role: asdict(x) for role, x in engine.extras.items()},
        "rounds": [asdict(r) for r in engine.rounds],
        "summary": summary.model_dump(),
        "rendering": engine.rendering,
        "generations": [g.summary() for g in engine.generations],
        "client": client.model_dump() if client is not None else None,
        "variants": [r.model_dump() for r in variant_summary(engine)],
    }


PALETTE = {
    "large alone": "grey",
    "ideal": "tab:green",
    "requests, paused": "tab:olive",
    "requests, back to back": "tab:cyan",
    "relay": "tab:blue",
    "authors": "tab:red",
}


def wall_times(e: TraceSummary) -> list[tuple[str, float]]:
    """The median wall times of one trace the plot shows (label, seconds), those measured."""
    bars = [
        ("large alone", e.alone.wall if e.alone else None),
        ("ideal", e.relay.ideal),
        ("requests, paused", e.replay.paused if e.replay else None),
        ("requests, back to back", e.replay.back_to_back if e.replay else None),
        ("relay", e.relay.wall),
        ("authors", e.authors.wall if e.authors else None),
    ]
    return [(label, value) for label, value in bars if value is not None]


def plot(path: Path, engine: EngineResult, summary: Summary) -> None:
    from relay_integrations.jobs.plotting import pyplot

    plt = pyplot()
    modes = engine.modes
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
    for mode in modes:
        for name, e in summary.by_mode[mode].traces.items():
            for label, value in wall_times(e):
                labels.append(f"{label}\n{name}, {mode}")
                values.append(value)
                colors.append(PALETTE[label])
    right.bar(range(len(values)), values, color=colors)
    right.set_xticks(range(len(values)), labels, fontsize=7, rotation=90)
    right.set_ylabel("seconds per generation (median)")
    right.set_title(
        "Wall time: large alone, ideal, the relay's requests replayed, relay, authors' loop"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
