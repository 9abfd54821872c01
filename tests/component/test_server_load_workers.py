"""``python -m benchmarks server-load --workers 1,2`` end to end, at its smallest: a relay of
one process and one of two workers under the same streams, side by side."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.server_load.cli import worker_counts


def test_the_comparison_prints_a_row_per_worker_count_and_writes_its_figures(
    tmp_path: Path,
) -> None:
    out = tmp_path / "workers.json"
    done = subprocess.run(
        [
            *(sys.executable, "-m", "benchmarks", "server-load", "--workers", "1,2"),
            *("--concurrency", "4", "--rounds", "1", "--json", str(out)),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    assert "relaygen serve --workers N: 4 concurrent streams x 1 rounds each" in done.stdout
    assert "--workers 2 --log-level info" in done.stdout and "errors: 0" in done.stdout
    figures = json.loads(out.read_text())["figures"]
    assert [f["workers"] for f in figures] == [1, 2]
    for f in figures:
        assert f["generations"] == 4 and f["errors"] == []
        assert f["cpu"]["relay"] > 0 and f["generations_per_second"] > 0


def test_worker_counts_are_distinct_and_positive() -> None:
    assert worker_counts("1,2,2,4") == [1, 2, 4]
    with pytest.raises(argparse.ArgumentTypeError, match="at least 1"):
        worker_counts("0,2")
