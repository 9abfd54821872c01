"""``python -m benchmarks authors-loop``'s figures from given walls: each approach paired with
the relay by run, the ratio's median and range, the runs the relay was faster in, the table."""

from __future__ import annotations

from benchmarks.authors_loop.approaches import Generation
from benchmarks.authors_loop.pairing import Measured, paired, table


def measured(
    approach: str, run: int, wall: float, mode: str = "tokens", ok: bool = True
) -> Measured:
    return Measured(mode, "orders", run, Generation(approach, wall, ok, 20, 7, 1000))


def test_walls_pair_by_run_and_the_table_says_median_range_and_wins() -> None:
    runs = [
        measured("relay", 0, 10.0),
        measured("authors", 0, 11.0),
        measured("stream", 0, 9.0),
        measured("authors", 1, 9.0),  # the order rotates: authors first in run 1
        measured("relay", 1, 10.0),
        measured("stream", 1, 10.0),
        measured("relay", 2, 8.0),
        measured("authors", 2, 10.0, ok=False),
        measured("relay", 0, 5.0, mode="regex"),
        measured("authors", 1, 5.0, mode="regex"),  # no relay run 1 under regex: left out
    ]
    rows = {(r.mode, r.approach): r for r in paired(runs)}
    assert set(rows) == {("tokens", "authors"), ("tokens", "stream")}
    authors = rows["tokens", "authors"]
    assert authors.over_relay == [1.1, 0.9, 1.25] and authors.median == 1.1
    assert authors.relay_faster == 2 and authors.wall == 10.0 and authors.relay_wall == 10.0
    assert authors.text_ok == [True, True, False] and authors.prefilled_over_relay == 1.0
    stream = rows["tokens", "stream"]
    assert stream.over_relay == [0.9, 1.0] and stream.relay_faster == 0
    lines = table(paired(runs))
    assert "x1.100 [0.900-1.250]" in lines[1] and "2 of 3" in lines[1]
    assert "10.00 / 10.00 s" in lines[1] and lines[1].endswith("relay ok ok ok; authors ok ok DIFF")
