"""Test helpers for the relay, as ``langchain_core`` ships its fake chat models: what this
project's own tests and benchmarks use, public for an application's tests too.

- :mod:`.forcing`: request hooks that make real models (even tiny random ones) write a known
  text through vLLM's structured outputs, so a relay's segments are known in advance::

      from relay_integrations.testing import forcing
      async with RelaySwitcher(config, request_hook=forcing(trace)) as relay:
          result = await relay.generate(messages)
      assert result.text == trace

  ``forced(relay, trace)`` forces one generation of a relay already open (its connections,
  its servers' caches); ``hooked(relay, hook)`` gives it a request hook of one's own.

- :mod:`.scripted_vllm`: an in-process server speaking vLLM's completions protocol, scripted
  per model (a large and a small model writing a reasoning trace with a cue), with fault
  injection (needs the ``server`` extra); ``serving(...)`` runs it on a thread of its own for
  sync code.
- :mod:`.qwen3_template`: the Qwen3 chat template as vLLM renders it, in plain Python.
- :mod:`.vllm_stops`: vLLM's stop strings as its detokenizer applies them (which one wins,
  where the text is cut, what a stream holds back), in plain Python.
- :mod:`.gpu_speed`: a scripted model at a GPU's pace, from measured step times (continuous
  batching, prefill of uncached prompt tokens), and a virtual clock for ideal timings.
- :mod:`.loop_monitor`: which callback held an event loop's thread too long, and where
  (``with LoopMonitor() as monitor: ...; monitor.check()``).
"""

from .forcing import forced, forcing, hooked, regex_literal

__all__ = ["forced", "forcing", "hooked", "regex_literal"]
