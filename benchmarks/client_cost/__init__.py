"""The relay's own client CPU: ``python -m benchmarks client-cost [--quick]``.

No vLLM: the scripted upstream of :mod:`benchmarks.upstream` (no delay a token) runs in a
process of its own, and a ``RelaySwitcher`` in this one generates over it, one generation
after another, in 9 cells (0, 1 or 2 switches by questions of 4, 100 and 300 words). This
process's CPU time is fitted to ``cpu = a·tokens + b·switches + c·generations`` (:mod:`.fit`),
once with the stop strings sent to the server and once with ``max_stop_strings=1`` (every
stop found in the stream, as on a stock server); :mod:`.cli` prints both fits and the cells::

    python -m benchmarks client-cost --quick --json /tmp/client-cost.json
"""
