"""The benchmark's report: a Markdown table (for the terminal and ``docs/``), JSON, and a plot of
accuracy against latency and of time per written token, per mode::

    summaries = summarize(records)
    print(markdown_table(summaries))
    write_plot(summaries, "out/accuracy_latency.png", title="AMC 2023")
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..jobs.plotting import pyplot
from .generate import Mode
from .stats import ModeSummary

_COLOURS = {"large": "tab:blue", "small": "tab:green", "relay": "tab:orange"}


def markdown_table(summaries: dict[Mode, ModeSummary]) -> str:
    """One row per mode: accuracy, latency (per generation and per written token, with the
    relay's predicted time per token), speedup against ``large``, share and tokens."""
    lines = [
        "| mode | pass@1 | ± SE | mean s | p90 s | ms/token | predicted ms/token | speedup "
        "| large share | switches/gen | large tok/gen | small tok/gen | n | errors |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for summary in summaries.values():
        if not summary.generations:
            lines.append(f"| {summary.mode} |" + " - |" * 11 + f" 0 | {summary.errors} |")
            continue
        tokens = summary.tokens_per_generation
        speedup = f"{summary.speedup:.2f}x" if summary.speedup is not None else "-"
        lines.append(
            f"| {summary.mode} | {summary.pass_at_1:.1%} | {summary.pass_at_1_se:.1%} "
            f"| {summary.mean_seconds:.2f} | {summary.p90_seconds:.2f} "
            f"| {_milliseconds(summary.ms_per_token)} "
            f"| {_milliseconds(summary.predicted_ms_per_token)} | {speedup} "
            f"| {summary.large_share:.1%} | {summary.switches_per_generation:.1f} "
            f"| {tokens.get('large', 0):.0f} | {tokens.get('small', 0):.0f} "
            f"| {summary.generations} | {summary.errors} |"
        )
    return "\n".join(lines) + "\n"


def _milliseconds(value: float | None) -> str:
    return f"{value:.1f}" if value is not None else "-"


def write_plot(summaries: dict[Mode, ModeSummary], path: str | Path, title: str = "") -> Path:
    """Two panels (the ``plot`` extra): pass@1 (± 1 SE) against mean latency, one point per
    mode; and time per written token per mode, with the relay's prediction beside it."""
    plt = pyplot()
    figure, (accuracy, per_token) = plt.subplots(
        1, 2, figsize=(10, 4.2), gridspec_kw={"width_ratios": [3, 2]}
    )
    ran = [summary for summary in summaries.values() if summary.generations]
    _accuracy_panel(accuracy, ran)
    _per_token_panel(per_token, ran)
    figure.suptitle(title or "Accuracy against latency", fontsize=10)
    figure.tight_layout()
    target = Path(path)
    figure.savefig(target, dpi=120)
    plt.close(figure)
    return target


def _accuracy_panel(axes: Any, summaries: list[ModeSummary]) -> None:
    for summary in summaries:
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
    if summaries:
        axes.legend(fontsize=8, loc="best")


def _per_token_panel(axes: Any, summaries: list[ModeSummary]) -> None:
    timed = [s for s in summaries if s.ms_per_token is not None]
    rows = range(len(timed))
    axes.barh(
        list(rows),
        [s.ms_per_token for s in timed],
        color=[_COLOURS[s.mode] for s in timed],
        height=0.6,
    )
    for row, summary in zip(rows, timed, strict=True):
        axes.annotate(
            f"{summary.ms_per_token:.1f}",
            (summary.ms_per_token or 0.0, row),
            xytext=(4, -3),
            textcoords="offset points",
            fontsize=8,
        )
        if summary.predicted_ms_per_token is not None:
            axes.plot(
                [summary.predicted_ms_per_token] * 2,
                [row - 0.4, row + 0.4],
                color="black",
                linestyle="--",
                label=f"predicted {summary.predicted_ms_per_token:.1f} (s·large + (1-s)·small)",
            )
    axes.set_yticks(list(rows), [s.mode for s in timed])
    axes.invert_yaxis()
    axes.set_xlabel("ms per written token (all seconds / all tokens)")
    axes.set_xlim(left=0)
    axes.grid(alpha=0.3, axis="x")
    if any(s.predicted_ms_per_token is not None for s in timed):
        axes.legend(fontsize=7, loc="lower right")
