"""The relay at the speed users run it: two upstreams that keep a GPU pair's step times.

Each model is the scripted vLLM in a process of its own, stepping with continuous batching at
the measured H200 kernel times of Qwen3-32B and Qwen3-1.7B (``h200-qwen3-ctx1k.json``:
decode time by batch size, append time by new tokens; see
:mod:`relay_integrations.testing.gpu_speed`), writing given traces. For each concurrency the
benchmark runs the relay (``RelaySwitcher`` in this process), the large model alone, and
``relaygen serve``, and compares each generation's wall time with the ideal: the same turns on
the same engines with no client at all::

    python -m benchmarks gpu-speed --traces math500.jsonl --quick --json out.json --plot out.png
"""
