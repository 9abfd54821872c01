"""``python -m benchmarks health-probe`` end to end, at its smallest: the relay server and the
scripted upstream in their own processes, 100 calls of each probe."""

from __future__ import annotations

import re
import subprocess
import sys


def test_the_benchmark_prints_the_cpu_of_each_probe() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", "health-probe", "--calls", "100", "--rounds", "1"],
        capture_output=True,
        text=True,
        timeout=180,
    )
    found = re.findall(r"^  (/\S+(?:, [\w ]+)?)\s+([\d.]+) ms", done.stdout, re.M)
    figures = {name.strip(): ms for name, ms in found}
    assert set(figures) == {"/livez", "/readyz, cached 1 s", "/readyz, no cache"}, done.stdout
    assert all(float(ms) > 0 for ms in figures.values())
    within = float(figures["/readyz, no cache"]) < 1.0
    assert done.returncode == (0 if within else 1)  # the exit status is the budget's verdict
    assert ("within" if within else "OVER") in done.stdout
