"""Load benchmark of ``relaygen serve``: many concurrent streams against a fast scripted upstream.

    python -m benchmarks server-load                        # 200 streams x 3 rounds
    python -m benchmarks server-load --quick                # 50 streams x 2 rounds
    python -m benchmarks server-load --concurrency 50 --json /tmp/load-50.json
    python -m benchmarks server-load --workers 1,2,4 --quick  # relaygen serve --workers N

``--quick`` is ``--concurrency 50 --rounds 2`` (flags given explicitly win). A benchmark, not a
test: it prints figures measured side by side in one run, and exits 1 only when a response was
wrong (an error, no finish chunk, no ``[DONE]``, empty content) or a generation slot of the
relay stayed taken. Three processes take part: the upstream (:mod:`benchmarks.upstream`: 54
tokens and 2 switches a generation, ``--token-delay`` seconds a token, in its own process so
that its pure-Python streaming does not share the relay's event loop); the relay, the real
``relaygen serve`` with ``RELAY_POLICY__COOLDOWN_TOKENS=0`` and each endpoint's
``max_concurrency`` raised to the load; and this process, whose httpx clients of at most 32
streams each parse the SSE themselves (:class:`.client_shards.ClientShards`), and which runs
the same generations in-process (``stream_chat``, no HTTP), rounds alternating between the two.

"Added latency" is a stream's total time at the client minus the relay's own ``relay.seconds``
of it: HTTP, SSE framing and JSON, and waiting for a busy event loop. Also measured: the relay
process's memory (VmRSS sampled every 50 ms, VmHWM), a ``GET /metrics`` every 250 ms (how far
behind its event loop is), the CPU time of the three processes, ``relay_inflight_generations``
after the load, and the relay's log at warning level. ``--workers 1,2,4`` instead runs the
load against ``relaygen serve --workers N`` for each N side by side (:mod:`.workers`).

The modules: :mod:`.settings`, :mod:`.processes` (the upstream and ``relaygen serve``),
:mod:`.streams` (one generation through the server and in-process), :mod:`.sampling` (VmRSS,
``/metrics``, CPU time), :mod:`.load` (the single requests and the load rounds),
:mod:`.workers`, :mod:`.figures` (the typed results ``--json`` writes), :mod:`.report`,
:mod:`.cli`.
"""
