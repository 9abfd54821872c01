"""The benchmark's report: a Markdown table (for the terminal and ``docs/``), JSON, and a plot of
accuracy against latency per mode::

    summaries = summarize(records)
    print(markdown_table(summaries))
    write_plot(summaries, "out/accuracy_latency.png", title="AMC 2023")
"""

from __future__ import annotations

from pathlib import Path

from ..plotting import pyplot
from .generate import Mode
from .stats import ModeSummary

_COLOURS = {"large": "tab:blue", "small": "tab:green", "relay": "tab:orange"}


def markdown_table(summaries: dict[Mode, ModeSummary]) -> str:
    """One row per mode: accuracy, latency, speedup against ``large``, share and tokens."""
    lines = [
        "| mode | pass@1 | ± SE | mean s | p90 s | speedup | large share | switches/gen "
        "| large tok/gen | small tok/gen | n | errors |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for summary in summaries.values():
        if not summary.generations:
            lines.append(
                f"| {summary.mode} | - | - | - | - | - | - | - | - | - | 0 | {summary.errors} |"
            )
            continue
        tokens = summary.tokens_per_generation
        speedup = f"{summary.speedup:.2f}x" if summary.speedup is not None else "-"
        lines.append(
            f"| {summary.mode} | {summary.pass_at_1:.1%} | {summary.pass_at_1_se:.1%} "
            f"| {summary.mean_seconds:.2f} | {summary.p90_seconds:.2f} | {speedup} "
            f"| {summary.large_share:.1%} | {summary.switches_per_generation:.1f} "
            f"| {tokens.get('large', 0):.0f} | {tokens.get('small', 0):.0f} "
            f"| {summary.generations} | {summary.errors} |"
        )
    return "\n".join(lines) + "\n"


def write_plot(summaries: dict[Mode, ModeSummary], path: str | Path, title: str = "") -> Path:
    """pass@1 (± 1 SE) against mean latency, one point per mode (the ``plot`` extra)."""
    plt = pyplot()
    figure, axes = plt.subplots(figsize=(6, 4.2))
    for summary in summaries.values():
        if not summary.generations:
            continue  # every generation failed: nothing to place
        axes.errorbar(
            [summary.mean_seconds],
            [100 * summary.pass_at_1],
            yerr=[100 * summary.pass_at_1_se],
            fmt="o",
            markersize=8,
            capsize=4,
            color=_COLOURS[summary.mode],
            label=f"{summary.mode} (n={summary.generations})",
        )
        axes.annotate(
            summary.mode,
            (summary.mean_seconds, 100 * summary.pass_at_1),
            xytext=(6, 6),
            textcoords="offset points",
        )
    axes.set_xlabel("mean latency per generation (s)")
    axes.set_ylabel("pass@1 (%), ± 1 SE over problems")
    axes.set_xlim(left=0)
    axes.set_ylim(-5, 105)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8, loc="best")
    axes.set_title(title or "Accuracy against latency", fontsize=10)
    figure.tight_layout()
    target = Path(path)
    figure.savefig(target, dpi=120)
    plt.close(figure)
    return target
