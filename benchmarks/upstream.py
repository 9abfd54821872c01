"""The scripted vLLM as a benchmark's upstream, in a process of its own.

A scripted pair of models (:mod:`relay_integrations.testing.scripted_vllm`, "large" and
"small") writes one fixed reasoning trace with the cues "Now" and "Therefore," as sentence
starters (:data:`CUES`: a relay with both switches twice a generation, with "Now" once), then
an answer that restates the question's first sentence (:func:`scripted_answer`): 54 tokens
and 2 switches for ``server-load``'s "What is 42 * 7?", and a generation that grows with the
question for the fit of ``client-cost``. The models stream in pure Python; run in
the benchmark's own process they would share its event loop with what it measures. So
`start` runs them as ``python -m benchmarks.upstream`` and returns the base URL, `stop` ends
the process::

    proc, url = start(token_delay=0.002, log=log_file)
    try:
        ...  # point the relay at url
    finally:
        stop(proc)

The models remember only their last `memory` prompts and requests (their cached-token figures
scan all they remember on every request: over thousands of requests an unbounded memory would
slow the upstream down as the run goes on).
"""

from __future__ import annotations

import argparse
import asyncio
import re
import signal
import subprocess
import sys
from typing import IO, TYPE_CHECKING, Any

from relay_integrations.testing.qwen3_template import ASSISTANT, THINKING_OFF

if TYPE_CHECKING:
    from relay_integrations.testing.scripted_vllm import ScriptedVLLM

MEMORY = 32
"""Prompts and requests each scripted model remembers."""

CUES = ["Therefore,", "Now"]
"""The cues of the scripted reasoning: both switch models, twice a generation."""

REASONING = (
    "<think>\nThe user asks a question. Now I think about the best reply. A direct reply fits "
    "best here. Therefore, I will answer directly.\n</think>\n\n"
)
"""The reasoning both models write, whatever the question ("Therefore," comes more than a
relay's default cool-down, 5 tokens, after the sentence that starts with "Now")."""

_USER = re.compile(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", re.S)


def scripted_answer(prompt: str, body: dict[str, Any]) -> str:
    """The rest of the scripted output after `prompt` (the rendered chat and what has been
    written so far): :data:`REASONING` (none with thinking off), then the last user message's
    first sentence restated and "Here is the answer.", so that a longer question gets a
    longer generation. Every request of a generation continues the same text, whichever
    model serves it."""
    head, _, written = prompt.rpartition(ASSISTANT)
    thinking = not written.startswith(THINKING_OFF)
    written = written if thinking else written.removeprefix(THINKING_OFF)
    asked = _USER.findall(head)
    sentence = re.split(r"(?<=[.?!])\s", " ".join(asked[-1].split()))[0] if asked else ""
    full = (REASONING if thinking else "") + f"{sentence} Here is the answer.".lstrip()
    assert full.startswith(written), (written, full)
    return full[len(written) :]


def scripted_pair(
    token_delay: float,
    memory: int | None = MEMORY,
    models: tuple[str, ...] = ("large", "small"),
    port: int = 0,
) -> ScriptedVLLM:
    """The scripted vLLM serving "large" and "small" (or only those of `models`), both
    writing :func:`scripted_answer` (``token_delay`` seconds a token; ``memory``: see
    ``ScriptedModel``), on a free port or `port`."""
    # here, not at the top: the benchmarks import this module (CUES, launch, stop) without
    # the server extra; only the upstream's own process needs it
    from relay_integrations.testing.scripted_vllm import ScriptedModel, ScriptedVLLM

    return ScriptedVLLM(
        *(
            ScriptedModel(name, "", respond=scripted_answer, token_delay=token_delay, memory=memory)
            for name in models
        ),
        port=port,
    )


def serve(
    token_delay: float,
    memory: int = MEMORY,
    models: tuple[str, ...] = ("large", "small"),
    port: int = 0,
) -> None:
    """Serve the scripted pair (or one of its models); print the base URL once listening;
    run until terminated."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the benchmark stops it (SIGTERM), also on ^C

    async def run() -> None:
        async with scripted_pair(token_delay, memory, models, port) as server:
            print(server.base_url, flush=True)
            await asyncio.Event().wait()

    asyncio.run(run())


def start(
    token_delay: float,
    log: IO[bytes],
    memory: int = MEMORY,
    models: tuple[str, ...] = ("large", "small"),
    port: int = 0,
) -> tuple[subprocess.Popen[bytes], str]:
    """Run the upstream in its own process (serving `models`, on `port` if given: one started
    again where one was stopped); its process and base URL, once it listens (its stderr goes
    to `log`)."""
    command = [sys.executable, "-m", "benchmarks.upstream", "--token-delay", str(token_delay)]
    command += ["--models", ",".join(models), "--port", str(port)]
    return launch([*command, "--memory", str(memory)], log)


def launch(command: list[str], log: IO[bytes]) -> tuple[subprocess.Popen[bytes], str]:
    """Run an upstream `command` that prints its base URL once it listens; its process and
    that URL (its stderr goes to `log`)."""
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log)
    assert proc.stdout is not None
    line = proc.stdout.readline().decode().strip()  # the base URL, once it listens
    if not line.startswith("http"):
        proc.wait(timeout=10)
        raise RuntimeError(f"the scripted upstream did not start (exit {proc.returncode})")
    return proc, line


def stop(proc: subprocess.Popen[bytes] | None, grace: float = 20) -> None:
    """Terminate `proc` (if it still runs), killing it if it has not exited after `grace` s."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="the scripted vLLM pair, for benchmarks")
    parser.add_argument("--token-delay", type=float, default=0.0, help="seconds per token")
    parser.add_argument("--memory", type=int, default=MEMORY, help="prompts each remembers")
    parser.add_argument("--models", default="large,small", help="the models it serves")
    parser.add_argument("--port", type=int, default=0, help="its port (0: a free one)")
    args = parser.parse_args(argv)
    serve(args.token_delay, args.memory, tuple(args.models.split(",")), args.port)


if __name__ == "__main__":
    main()
