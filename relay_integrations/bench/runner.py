"""Running a benchmark: every mode on the same problems, resumable, with a progress bar.

Modes run one after the other at the same concurrency, so they do not share the servers
while they are timed. Each graded generation is appended to ``results.jsonl`` the moment it
finishes; the file's first line records what was run (problem set, models, cues, sampling), and
a rerun with the same settings does only what is missing or failed::

    records = await run_bench(config, problems, Path("out/results.jsonl"), samples=4)
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from ..jobs.concurrency import run_bounded
from ..jobs.datasets import DatasetError
from ..jobs.progress import Progress
from ..jobs.records import RecordFile
from ..relay.config import RelayConfig, RequestHook
from ..relay.cues import CueSet
from ..relay.switcher import RelaySwitcher
from .generate import MODES, BenchRecord, Mode, generate
from .problems import Problem, Problems
from .stats import latest


class RunHeader(BaseModel):
    """What a results file was written for; a rerun must match it to resume."""

    problems: str
    problems_sha256: str
    large_model: str
    small_model: str
    cues: list[str]
    sampling: dict[str, Any]


class ResultLine(BaseModel):
    """A line of ``results.jsonl``: the header (first line) or a record."""

    header: RunHeader | None = None
    record: BenchRecord | None = None


async def run_bench(
    config: RelayConfig,
    problems: Problems,
    results_path: Path,
    *,
    modes: Sequence[Mode] = MODES,
    samples: int = 1,
    concurrency: int = 8,
    request_hook: RequestHook | None = None,
    cues: CueSet | None = None,
) -> list[BenchRecord]:
    """Run what `results_path` does not hold yet; returns all its latest records."""
    cues = cues if cues is not None else CueSet.load(config.cues)
    header = RunHeader(
        problems=problems.name,
        problems_sha256=problems.sha256,
        large_model=config.large.model,
        small_model=config.small.model,
        cues=list(cues.cues),
        sampling=config.sampling.model_dump(),
    )
    results = RecordFile(results_path, ResultLine, kind="result")
    lines = results.read()
    if not lines:
        results.path.parent.mkdir(parents=True, exist_ok=True)
        results.append(ResultLine(header=header))
    elif lines[0].header != header:
        raise DatasetError(
            str(results_path),
            f"was written for another run ({_difference(lines[0].header, header)}); "
            "use another --out or delete the file",
        )
    done = {r.key for r in latest(line.record for line in lines if line.record) if not r.error}
    async with RelaySwitcher(config, cues=cues, request_hook=request_hook) as switcher:
        for mode in modes:
            todo = [
                (problem, sample)
                for problem in problems.items
                for sample in range(samples)
                if (mode, problem.id, sample) not in done
            ]
            if not todo:
                continue
            with Progress(f"{mode:5}", total=len(todo)) as bar:

                async def one(item: tuple[Problem, int], mode: Mode = mode) -> None:
                    problem, sample = item
                    sampling = config.sampling
                    if sampling.seed is not None:  # reproducible, and distinct per sample
                        sampling = sampling.model_copy(update={"seed": sampling.seed + sample})
                    record = await generate(switcher, mode, problem, sample, sampling)
                    results.append(ResultLine(record=record))
                    bar.advance(note="failed: " + record.error[:60] if record.error else "")

                await run_bounded(one, todo, concurrency)
    return latest(line.record for line in results.read() if line.record)


def _difference(old: RunHeader | None, new: RunHeader) -> str:
    if old is None:
        return "its first line is not a header"
    changed = [name for name in RunHeader.model_fields if getattr(old, name) != getattr(new, name)]
    return "different " + ", ".join(changed)
