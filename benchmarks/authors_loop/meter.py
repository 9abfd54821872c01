"""CPU time other processes took while a generation ran (the machine is shared)::

    since = meter.start()  # meter = CpuMeter()
    cores = meter.foreign(since) / wall  # after a generation of `wall` seconds

``foreign``: all busy CPU time (``/proc/stat``) but the test servers' process groups (pid
files in ``.cache/run/`` of this checkout or of the main one) and this process's.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Sequence
from pathlib import Path

from benchmarks.machine import REPO
from benchmarks.proc import machine_busy_seconds, process_groups_seconds

Snapshot = tuple[float, float, float]  # busy, the servers', this process's CPU seconds


def run_dirs() -> list[Path]:
    """Where ``scripts/vllm_servers.sh`` writes its pid files: this checkout, the main one."""
    common = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--path-format=absolute", "--git-common-dir"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    checkouts = [REPO, Path(common).parent] if common else [REPO]
    return [c / ".cache" / "run" for c in dict.fromkeys(checkouts)]


class CpuMeter:
    def __init__(self, names: Sequence[str] = ("qwen3-large", "qwen3-small")) -> None:
        self.groups: set[int] = set()
        for folder in run_dirs():
            for name in names:
                with contextlib.suppress(OSError, ValueError):
                    self.groups.add(int((folder / f"{name}.pid").read_text()))

    def start(self) -> Snapshot:
        busy = machine_busy_seconds()
        servers, own = process_groups_seconds(self.groups)
        return busy, servers, own

    def foreign(self, since: Snapshot) -> float:
        """Seconds of CPU that others used since `since`."""
        busy, servers, own = self.start()
        return max(0.0, (busy - since[0]) - (servers - since[1]) - (own - since[2]))
