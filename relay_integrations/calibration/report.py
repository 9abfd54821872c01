"""The calibration report: a terminal table, a CSV file and a plot, from an artifact's record.

Everything is read from the :class:`CalibrationRecord` inside the artifact, so a report can
be redrawn from an artifact alone::

    record = load_artifact("cues.json").calibration
    print(format_table(record))
    write_csv(record, "cues.csv")
    write_plot(record, "cues.png", title="Qwen3-32B / Qwen3-1.7B")  # needs the `plot` extra
"""

from __future__ import annotations

import csv
from pathlib import Path

from ..jobs.plotting import pyplot
from ..relay.artifact import CalibrationRecord, CueStatistics

CSV_COLUMNS = (
    "cue",
    "selected",
    "occurrences",
    "unscored",
    "tokens",
    "mean_margin",
    "standard_error",
    "threshold",
    "global_mean_margin",
)


def ranked(record: CalibrationRecord) -> list[CueStatistics]:
    """Candidates that occurred, best mean post-cue margin first; then those that did not."""
    seen = [c for c in record.candidates if c.mean_margin is not None]
    unseen = [c for c in record.candidates if c.mean_margin is None]
    return sorted(seen, key=lambda c: -(c.mean_margin or 0.0)) + unseen


def format_table(record: CalibrationRecord, show_unseen: bool = False) -> str:
    """A fixed-width table of the candidates, with the rule and the global mean on top."""
    rule = record.selection
    lines = [
        f"{record.calibration_set.traces} traces of {record.calibration_set.name}, "
        f"{record.tokens_scored} reasoning tokens scored in {record.seconds:.0f} s",
        f"global mean margin {record.global_mean_margin:.4g}; a cue is selected when its mean "
        f"post-cue margin >= global mean + {rule.k:g} standard errors, "
        f"over >= {rule.min_occurrences} occurrences",
        "standard errors are over cue occurrences (the tokens of one span are not independent)",
        "",
        f"{'cue':<16} {'sel':>3} {'occ':>5} {'tokens':>7} {'mean':>8} {'± se':>8} {'threshold':>9}",
    ]
    for cue in ranked(record):
        if cue.mean_margin is None and not show_unseen:
            continue
        lines.append(
            f"{cue.cue!r:<16} {'*' if cue.selected else '':>3} {cue.occurrences:>5} "
            f"{cue.tokens:>7} {_number(cue.mean_margin):>8} {_number(cue.standard_error):>8} "
            f"{_number(cue.threshold):>9}"
        )
    unseen = sum(1 for c in record.candidates if c.occurrences == 0)
    if unseen and not show_unseen:
        lines.append(f"({unseen} candidates never occurred with a scored span)")
    return "\n".join(lines)


def write_csv(record: CalibrationRecord, path: str | Path) -> Path:
    """One row per candidate, ranked as in the table."""
    target = Path(path)
    with target.open("w", newline="", encoding="utf-8") as out:
        writer = csv.writer(out)
        writer.writerow(CSV_COLUMNS)
        for cue in ranked(record):
            writer.writerow(
                (
                    cue.cue,
                    int(cue.selected),
                    cue.occurrences,
                    cue.unscored,
                    cue.tokens,
                    _raw(cue.mean_margin),
                    _raw(cue.standard_error),
                    _raw(cue.threshold),
                    record.global_mean_margin,
                )
            )
    return target


def write_plot(record: CalibrationRecord, path: str | Path, title: str = "") -> Path:
    """Mean post-cue margin ± one standard error per cue, against the global mean and each
    cue's threshold; selected cues highlighted. Needs matplotlib (the ``plot`` extra)."""
    plt = pyplot()
    cues = [c for c in ranked(record) if c.mean_margin is not None][::-1]  # best at the top
    rows = range(len(cues))
    figure, axes = plt.subplots(figsize=(8, 1.2 + 0.28 * max(len(cues), 4)))
    for selected, colour, label in (
        (True, "tab:orange", "selected"),
        (False, "tab:gray", "not selected"),
    ):
        group = [(i, c) for i, c in enumerate(cues) if c.selected is selected]
        axes.errorbar(
            [c.mean_margin or 0.0 for _, c in group],
            [i for i, _ in group],
            xerr=[c.standard_error or 0.0 for _, c in group],
            fmt="o",
            color=colour,
            capsize=3,
            label=f"{label}: mean ± 1 SE",
            zorder=3,
        )
    with_threshold = [(i, c.threshold) for i, c in enumerate(cues) if c.threshold is not None]
    axes.scatter(
        [t for _, t in with_threshold],
        [i for i, _ in with_threshold],
        marker="|",
        s=120,
        color="tab:red",
        label=f"threshold (global mean + {record.selection.k:g} SE)",
        zorder=2,
    )
    axes.axvline(
        record.global_mean_margin, color="tab:blue", linestyle="--", label="global mean margin"
    )
    axes.set_yticks(list(rows), [f"{c.cue!r} (n={c.occurrences})" for c in cues], fontsize=8)
    axes.set_xlabel("mean post-cue margin p(top1) - p(top2) of the small model")
    axes.set_title(title or f"Cue calibration on {record.calibration_set.name}", fontsize=10)
    axes.legend(loc="lower right", fontsize=8)
    figure.tight_layout()
    target = Path(path)
    figure.savefig(target, dpi=120)
    plt.close(figure)
    return target


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def _raw(value: float | None) -> str:
    return "" if value is None else repr(value)
