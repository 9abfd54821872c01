"""What a benchmark run records of the machine and the code it measured::

    facts = MachineFacts.now(["python", "-m", "benchmarks", "authors-loop", "--quick"])
    facts.commit, facts.library_uncommitted, facts.cpus, facts.load_at_start

The benchmarks print these first and write them into their JSON.
"""

from __future__ import annotations

import os
import platform
import shlex
import subprocess
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
        )

    def finished(self) -> None:
        self.load_at_end = load_average()


def _git(*args: str) -> str:
    done = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True)
    return done.stdout


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"
