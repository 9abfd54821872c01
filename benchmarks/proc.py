"""What the benchmarks read of this machine from ``/proc`` (Linux), in one place::

    cpu_seconds(pid)           # user + system CPU time of a process so far
    tree_cpu_seconds(pid)      # {pid: CPU time so far} of a process and its descendants
    memory_mb(pid)             # {"VmRSS": ..., "VmHWM": ...} in MiB
    machine_busy_seconds()     # CPU time all processes used so far (idle and iowait left out)
    process_groups_seconds(g)  # CPU time of these process groups, and of this process
    cpu_model()                # "AMD EPYC ..." or ""
    load_average()             # [1, 5, 15 min]

Each reads the file again on every call (no caching): the figures are differences over time.
"""

from __future__ import annotations

import os
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of `pid` so far."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def tree_cpu_seconds(pid: int) -> dict[int, float]:
    """User plus system CPU time so far of `pid` and of each of its descendants alive now
    (``relaygen serve --workers N``: the supervisor and its workers)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # it ended meanwhile
        parent = int(stat[stat.rindex(")") + 2 :].split()[1])
        children.setdefault(parent, []).append(int(entry.name))
    seconds: dict[int, float] = {}
    todo = [pid]
    while todo:
        member = todo.pop()
        try:
            seconds[member] = cpu_seconds(member)
        except OSError:
            continue  # it ended meanwhile
        todo += children.get(member, [])
    return seconds


def memory_mb(pid: int) -> dict[str, float]:
    """VmRSS and VmHWM of `pid`, in MB (MiB)."""
    fields: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) / 1024
    return fields


def machine_busy_seconds() -> float:
    """CPU time all processes of the machine used so far (all cores; idle and iowait left out)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    return (user + nice + system + irq + softirq + steal) / TICK


def process_groups_seconds(groups: set[int]) -> tuple[float, float]:
    """CPU seconds so far of the processes in `groups` (process group ids), and of this
    process."""
    grouped = own = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue  # it ended meanwhile
        ticks = int(stat[11]) + int(stat[12])
        if int(stat[2]) in groups:
            grouped += ticks
        elif int(entry.name) == os.getpid():
            own += ticks
    return grouped / TICK, own / TICK


def cpu_model() -> str:
    """The CPU's model name, or "" where ``/proc/cpuinfo`` does not say."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def load_average() -> list[float]:
    """The 1, 5 and 15 minute load averages."""
    return [round(x, 2) for x in os.getloadavg()]
