"""What a benchmark run records of the machine and the code it measured::

    facts = MachineFacts.now(["python", "-m", "benchmarks", "authors-loop", "--quick"])
    facts.commit, facts.library_uncommitted, facts.cpus, facts.load_at_start
    ...
    facts.finished()
    facts.speed()  # "the reference workload took 29.7 ms at the start and 31.2 ms at the end"

The benchmarks print these first and write them into their JSON. The reference workload
(:func:`reference_seconds`, a fixed pure-Python task) is timed at the start and the end of a
run: a figure that depends on how fast this shared machine ran (a client's CPU, an API
server's) is read beside it, so that runs of two days or two machines can be set side by side.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import subprocess
import time
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

from pydantic import BaseModel

from .proc import cpu_model, load_average

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("openai", "httpx", "starlette", "uvicorn")


class MachineFacts(BaseModel):
    """The machine, the commit (and what of the library was changed but not committed), and
    the command of one run."""

    command: str
    commit: str
    library_uncommitted: list[str]
    cpus: int | None
    cpus_usable: int
    cpu: str
    python: str
    platform: str
    versions: dict[str, str]
    load_at_start: list[float]
    load_at_end: list[float] | None = None
    reference_ms: list[float] = []
    """The reference workload's time (:func:`reference_seconds`) at the start and the end."""

    @classmethod
    def now(cls, argv: Sequence[str]) -> MachineFacts:
        return cls(
            command=shlex.join(argv),
            commit=_git("rev-parse", "--short", "HEAD").strip(),
            library_uncommitted=[
                line[3:]
                for line in _git("status", "--porcelain", "--", "relay_integrations").split("\n")
                if line.strip()
            ],
            cpus=os.cpu_count(),
            cpus_usable=len(os.sched_getaffinity(0)),
            cpu=cpu_model(),
            python=platform.python_version(),
            platform=platform.platform(),
            versions={name: _version(name) for name in PACKAGES},
            load_at_start=load_average(),
            reference_ms=[reference_seconds() * 1e3],
        )

    def finished(self) -> None:
        self.load_at_end = load_average()
        self.reference_ms.append(reference_seconds() * 1e3)

    def speed(self) -> str:
        """How fast the machine ran, by the reference workload (benchmarks/machine.py)."""
        at = ("at the start", "at the end")
        times = [f"{ms:.1f} ms {when}" for ms, when in zip(self.reference_ms, at, strict=False)]
        return f"the reference workload (benchmarks/machine.py) took {' and '.join(times)}"


def _git(*args: str) -> str:
    done = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True)
    return done.stdout


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


_RECORD = {"prompt": list(range(64)), "text": "Therefore, the radius is three." * 4}


def workload() -> int:
    """Fixed work: integer arithmetic, string building and JSON, ~30 ms on a recent core."""
    total = 0
    for i in range(200_000):
        total = (total * 31 + i * i) % 1_000_003
    for i in range(3_000):
        total += len(json.dumps({**_RECORD, "n": i})) + len(f"{i:08d}".join("abc"))
    return total


def reference_seconds(runs: int = 5) -> float:
    """The fastest of `runs` timings of :func:`workload` (the least disturbed by others)."""
    best = float("inf")
    for _ in range(runs):
        started = time.perf_counter()
        workload()
        best = min(best, time.perf_counter() - started)
    return best
