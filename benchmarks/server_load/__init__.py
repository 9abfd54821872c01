"""Load benchmark of ``relaygen serve``: many concurrent streams against a fast scripted upstream.

    python -m benchmarks server-load                        # 200 streams x 3 rounds
    python -m benchmarks server-load --quick                # 50 streams x 2 rounds
    python -m benchmarks server-load --concurrency 50 --json /tmp/load-50.json
    python -m benchmarks server-load --token-delay 0.005 --rounds 5
    python -m benchmarks server-load --workers 1,2,4 --quick  # relaygen serve --workers N

``--quick`` is ``--concurrency 50 --rounds 2`` (flags given explicitly win; ``--sequential``
keeps its 20): one quick run before a change and one after it compare the same figures.

A benchmark, not a test: it prints figures measured side by side in one run, and exits 1 only
when a response was wrong (an error, no finish chunk, no ``[DONE]``, empty content) or a
generation slot of the relay stayed taken. Three processes take part:

* the upstream: a scripted pair of models on the scripted vLLM
  (:mod:`relay_integrations.testing.scripted_vllm`, models "large" and "small", a fixed
  reasoning trace with the cues "Now" and "Therefore,", then the question restated: 54 tokens
  and 2 switches a generation; ``--token-delay`` seconds per token), in its own process
  (:mod:`benchmarks.upstream`), so that its pure-Python streaming does not share an event loop
  with the relay. It remembers only its last 32 prompts there (the scripted model scans all it
  remembers on every request, which would slow it down as the run goes on);
* the relay: the real CLI, ``relaygen serve ... --cues '["Therefore,", "Now"]'``, with
  ``RELAY_POLICY__COOLDOWN_TOKENS=0`` (2 switches per generation) and each endpoint's
  ``max_concurrency`` raised to the load (``--endpoint-concurrency``; the default 64 would queue
  the streams inside the relay);
* this process: httpx clients of at most 32 streams each that send the streams and parse the
  SSE themselves (``ClientShards``, as the relay's own upstream requests; one client holding
  200 kept-alive connections held a burst back by ~3 s in this process), and
  the in-process comparison (a ``RelaySwitcher`` running ``stream_chat``, no HTTP).

Per streamed request it records the client's total time and time to the first content or
reasoning text, and the final chunk's ``relay.seconds`` and ``relay.time_to_first_token`` (the
relay's own clock, which starts when the server calls the relay, prompt rendering included).
"Added latency" is the client's total minus ``relay.seconds`` of the same request: HTTP, SSE
framing and JSON, and waiting for a busy event loop. The same generations
run in-process (rounds alternate between the two paths), so the server's overhead shows both as
that difference and as the ratio of the two paths' total times. Memory is the relay process's
VmRSS (sampled every 50 ms during the server rounds) and VmHWM, from ``/proc/<pid>/status``;
a ``GET /metrics`` every 250 ms during the server rounds shows how far behind the relay's event
loop is. Also printed: the CPU time of the three processes during the server rounds, the
relay's ``relay_inflight_generations`` after the load (0 unless slots leaked), and the first
lines the relay logged at warning level or above.

``--workers 1,2,4`` runs something else: the same load rounds against ``relaygen serve
--workers N`` for each N, side by side, and prints generations/s and CPU per generation of each
relay's whole process tree, with ratios (:mod:`.workers`).

The modules: :mod:`.settings` (the run's parameters), :mod:`.processes` (the upstream and
``relaygen serve``, started and stopped), :mod:`.streams` (one generation through the server
and in-process), :mod:`.sampling` (what is measured beside the streams: VmRSS, ``/metrics``,
CPU time), :mod:`.load` (the single requests and the load rounds), :mod:`.workers` (the
``--workers`` comparison), :mod:`.figures` (the typed results, also what ``--json`` writes),
:mod:`.report` (the printed report), :mod:`.cli`.
"""
