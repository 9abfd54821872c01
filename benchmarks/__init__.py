"""The project's benchmarks: scripts that print figures and ratios measured side by side in
one run (not timed tests, which flake on a shared machine). Not part of the wheel; run from
a checkout::

    python -m benchmarks gpu-speed --traces math500.jsonl [--quick]  # the relay at GPU speed
    python -m benchmarks server-load [--quick]    # relaygen serve under many streams
    python -m benchmarks client-cost [--quick]    # the relay's client CPU per token and switch
    python -m benchmarks authors-loop [--quick]   # against the authors' loop, on real vLLM

``authors-loop`` needs the tiny test servers (``scripts/vllm_servers.sh start qwen3-large
qwen3-small``, then ``eval "$(scripts/vllm_servers.sh env)"``); the others run against
scripted upstreams (:mod:`benchmarks.upstream`, :mod:`relay_integrations.testing.gpu_speed`).
What each measures, and the figures of this machine, are in ``docs/benchmarks.md``. Shared
here: ``/proc`` readers (:mod:`.proc`), the scripted upstream process (:mod:`.upstream`), what
a run records of the machine (:mod:`.machine`); statistics come from
:mod:`relay_integrations.jobs.statistics`.
"""
