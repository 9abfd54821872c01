"""Every figure as JSON, and the PNG plot."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from .analysis import example_generation
from .settings import BLOCK
from .variants import variant_summary


def to_json(
    engine: dict[str, Any],
    summary: dict[str, Any],
    facts: dict[str, Any],
    client: dict[str, Any] | None,
) -> dict[str, Any]:
    return {
        "facts": facts,
        "traces": engine["traces"],
        "extras": {role: asdict(x) for role, x in engine["extras"].items()},
        "rounds": [
            {**r, "rates": {role: asdict(x) for role, x in r["rates"].items()}}
            for r in engine["rounds"]
        ],
        "summary": summary,
        "rendering": engine["rendering"],
        "generations": [g.summary() for g in engine["generations"]],
        "client": client,
        "variants": [asdict(r) for r in variant_summary(engine)],
    }


def plot(path: Path, engine: dict[str, Any], summary: dict[str, Any]) -> None:
    from relay_integrations.jobs.plotting import pyplot

    plt = pyplot()
    modes: list[str] = engine["modes"]
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
    palette = {
        "large alone": "grey",
        "ideal": "tab:green",
        "requests, paused": "tab:olive",
        "requests, back to back": "tab:cyan",
        "relay": "tab:blue",
        "authors": "tab:red",
    }
    for mode in modes:
        for name, e in summary["by_mode"][mode]["traces"].items():
            for key, label in (
                ("alone_wall", "large alone"),
                ("relay_ideal", "ideal"),
                ("replay_paused", "requests, paused"),
                ("replay_back_to_back", "requests, back to back"),
                ("relay_wall", "relay"),
                ("authors_wall", "authors"),
            ):
                if key in e:
                    labels.append(f"{label}\n{name}, {mode}")
                    values.append(e[key])
                    colors.append(palette[label])
    right.bar(range(len(values)), values, color=colors)
    right.set_xticks(range(len(values)), labels, fontsize=7, rotation=90)
    right.set_ylabel("seconds per generation (median)")
    right.set_title(
        "Wall time: large alone, ideal, the relay's requests replayed, relay, authors' loop"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
