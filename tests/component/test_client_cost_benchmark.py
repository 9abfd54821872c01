"""``python -m benchmarks client-cost`` end to end, at its smallest: one round of two
generations a cell, against the scripted upstream in its own process (no vLLM)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def test_the_benchmark_prints_both_fits_and_writes_them(tmp_path: Path) -> None:
    out = tmp_path / "client-cost.json"
    done = subprocess.run(
        [
            *(sys.executable, "-m", "benchmarks", "client-cost"),
            *("--rounds", "1", "--per-cell", "2", "--json", str(out)),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    fits = json.loads(out.read_text())["fits"]
    assert [f["stop_limit"] for f in fits] == [None, 1]
    for f in fits:
        fit = f["fit"]
        a, b, c = (
            fit[k] for k in ("cpu_per_token_us", "cpu_per_switch_ms", "cpu_per_generation_ms")
        )
        assert a > 0 and b > 0 and c > 0, fit
        assert f"a = {a:5.1f} us per streamed token, b = {b:.2f} ms per switch" in done.stdout
        assert (
            sorted(cell["switches"] / cell["gens"] for cell in f["cells"])
            == [0] * 3 + [1] * 3 + [2] * 3
        )
    assert "stop strings at the server" in done.stdout and "max_stop_strings=1" in done.stdout
