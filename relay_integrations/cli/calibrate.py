"""``relaygen calibrate``: choose a model pair's switch cues, write the artifact and a report.

From a problem set, the large model writes the traces (resumable: rerun the same command)::

    relaygen calibrate --problems amc23.jsonl --samples 4 --out calibration/ \\
        --large-url http://gpu-a:8000/v1 --large-model Qwen/Qwen3-32B \\
        --small-url http://gpu-b:8000/v1 --small-model Qwen/Qwen3-1.7B

From ready traces, only the small model is needed; ``--large-model`` names the model that
wrote them (as its server will serve it, so the switcher accepts the artifact)::

    relaygen calibrate --traces math500.jsonl --prompt-field problem \\
        --reasoning-field solution --large-model large --small-url ... --small-model small

``--out`` receives ``cues.json`` (the artifact), ``cues.csv``, ``cues.png`` (with the ``plot``
extra) and, when traces are written, ``traces.jsonl``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from ..calibration import Calibrator, NoCueSelected, ProblemSet, TraceFile, ready_traces
from ..calibration.calibrator import CalibrationOutcome
from ..calibration.candidates import DEFAULT_CANDIDATES
from ..calibration.report import format_table, write_csv, write_plot
from ..relay.artifact import CalibrationRecord, ModelIdentity, SelectionRule, save_artifact
from ..relay.config import RelayConfig
from ..upstream.config import MODEL_ROLES, EndpointConfig, SamplingConfig
from ..upstream.errors import RelayError
from .options import (
    add_endpoint_options,
    add_sampling_options,
    configuration,
    endpoint_values,
    sampling_values,
)


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "calibrate", help="choose the switch cues of a model pair from the small model's margins"
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--problems", type=Path, help="JSON Lines with a 'problem' field")
    source.add_argument("--traces", type=Path, help="JSON Lines with a prompt and its reasoning")
    parser.add_argument(
        "--prompt-field", default="prompt", help="prompt field of --traces (default: %(default)s)"
    )
    parser.add_argument(
        "--reasoning-field", default="reasoning", help="its reasoning field (default: %(default)s)"
    )
    parser.add_argument("--limit", type=int, help="use only the first N rows of the file")
    add_endpoint_options(parser, *MODEL_ROLES)
    parser.add_argument(
        "--out", type=Path, default=Path("calibration"), help="output folder (default: %(default)s)"
    )
    parser.add_argument(
        "--samples", type=int, default=4, help="traces per problem (default: %(default)s)"
    )
    add_sampling_options(parser, budget="token budget of one trace")
    parser.add_argument(
        "--candidates", help="JSON list of candidate cues (default: the published method's 83)"
    )
    parser.add_argument(
        "--k",
        type=float,
        default=1.0,
        help="a cue is selected when its mean margin is this many standard errors above the "
        "global mean (default: %(default)s)",
    )
    parser.add_argument(
        "--min-occurrences",
        type=int,
        default=5,
        help="occurrences a cue needs in the traces to be selected (default: %(default)s)",
    )
    parser.add_argument(
        "--max-span-tokens",
        type=int,
        default=128,
        help="post-cue span cap (the segment cap; default: %(default)s)",
    )
    parser.add_argument(
        "--concurrency", type=int, default=8, help="requests in flight (default: %(default)s)"
    )
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG plot")
    parser.add_argument("--title", help="title of the plot")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    with configuration():
        calibrator = _calibrator(args)
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        outcome = asyncio.run(_calibrate(calibrator, args))
    except NoCueSelected as exc:
        print(format_table(exc.record))
        written = _write_report(exc.record, args)
        print(f"\nrelaygen: {exc}", file=sys.stderr)
        print("the figures are in " + ", ".join(str(p) for p in written), file=sys.stderr)
        return 1
    except RelayError:
        traces = args.out / "traces.jsonl"
        if args.problems is not None and traces.exists():
            print(f"finished traces are kept in {traces}; run the same command to resume")
        raise
    record = outcome.artifact.calibration
    assert record is not None
    written = [save_artifact(outcome.artifact, args.out / "cues.json")]
    print(format_table(record))
    if outcome.skipped:
        print(f"{len(outcome.skipped)} traces had no reasoning and were skipped")
    print(f"\nselected {len(outcome.artifact.cues)} cues: {outcome.artifact.cues}")
    written += _write_report(record, args)
    print("wrote " + ", ".join(str(p) for p in written))
    return 0


def _write_report(record: CalibrationRecord, args: argparse.Namespace) -> list[Path]:
    """The CSV, and the plot unless it is turned off or matplotlib is missing."""
    written = [write_csv(record, args.out / "cues.csv")]
    if not args.no_plot:
        try:
            written.append(write_plot(record, args.out / "cues.png", title=args.title or ""))
        except RelayError as exc:
            print(f"no plot: {exc}", file=sys.stderr)
    return written


def _calibrator(args: argparse.Namespace) -> Calibrator:
    env = RelayConfig.env_values()
    small = EndpointConfig.model_validate(endpoint_values(args, env, "small"))
    large_values = endpoint_values(args, env, "large", need_url=args.problems is not None)
    large = EndpointConfig.model_validate(large_values) if "base_url" in large_values else None
    args.large_identity = ModelIdentity(model=large_values["model"]) if large is None else None
    sampling = SamplingConfig.model_validate(sampling_values(args, env))
    candidates = json.loads(args.candidates) if args.candidates else DEFAULT_CANDIDATES
    rule = SelectionRule(
        k=args.k, min_occurrences=args.min_occurrences, max_span_tokens=args.max_span_tokens
    )
    return Calibrator(
        small=small,
        large=large,
        candidates=candidates,
        rule=rule,
        sampling=sampling,
        concurrency=args.concurrency,
    )


async def _calibrate(calibrator: Calibrator, args: argparse.Namespace) -> CalibrationOutcome:
    async with calibrator:
        if args.problems is not None:
            problems = ProblemSet.load(args.problems, limit=args.limit)
            traces = await calibrator.write_traces(
                problems, TraceFile(args.out / "traces.jsonl"), samples=args.samples
            )
            return await calibrator.calibrate(
                traces, problems, sampling=calibrator.sampling, samples=args.samples
            )
        fields = (args.prompt_field, args.reasoning_field)
        problems = ProblemSet.load(args.traces, fields, limit=args.limit)
        traces = ready_traces(problems, args.prompt_field, args.reasoning_field)
        return await calibrator.calibrate(traces, problems, large_identity=args.large_identity)
