"""``relaygen generate``: one relay generation, streamed to the terminal.

    relaygen generate "What is 17 * 23?" \\
        --large-url http://gpu-a:8000/v1 --large-model Qwen/Qwen3-32B \\
        --small-url http://gpu-b:8000/v1 --small-model Qwen/Qwen3-1.7B

Without a question on the command line, the question is standard input when it is piped
(``echo "What is 17 * 23?" | relaygen generate ...``, ``relaygen generate ... < question.txt``),
else a built-in example; a question given on the command line wins and standard input is not
read. Every option can come from the environment instead (``RELAY_LARGE__BASE_URL``, ... see
:meth:`RelayConfig.from_env`). The generation streams to the terminal, each span marked with
the model that wrote it, followed by the relay's stats.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections import Counter
from typing import Any, TextIO

from ..relay import RelayConfig, RelayDone, RelayResult, RelaySwitcher, TextDelta
from ..upstream.config import ModelRole
from .options import CommandError, add_relay_options, configuration, relay_config

DEFAULT_PROMPT = (
    "A train travels 60 km in the first hour and 90 km in the second hour. "
    "What is its average speed over the two hours?"
)
_COLOURS = {"large": "\033[1;34m", "small": "\033[32m"}
_RESET = "\033[0m"


def add_parser(commands: Any) -> None:
    generate = commands.add_parser("generate", help="stream one relay generation to the terminal")
    generate.add_argument(
        "prompt",
        nargs="?",
        help="the question (default: standard input when it is piped, else a built-in example)",
    )
    generate.add_argument("--system", help="a system message")
    add_relay_options(generate)
    generate.add_argument(
        "--no-thinking", action="store_true", help="pass enable_thinking=false to the chat template"
    )
    generate.add_argument("--json", action="store_true", help="print the result as JSON only")
    generate.add_argument("--note", help="a line printed before the generation")
    generate.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    with configuration():
        config = relay_config(args)
    args.prompt = question(args.prompt, sys.stdin)
    result = asyncio.run(_generate(config, args))
    return 0 if result.finish_reason != "error" else 1


def question(given: str | None, stdin: TextIO | None) -> str:
    """The question to ask: the command line's, else piped standard input, else the example.

    A terminal is not read (the user would face a silent wait); piped input that holds
    nothing but whitespace is an error rather than an empty question::

        question(None, io.StringIO("What is 2 + 2?\\n"))  # 'What is 2 + 2?'
    """
    if given is not None:
        return given
    if stdin is None or stdin.isatty():
        return DEFAULT_PROMPT
    try:
        text = stdin.read().strip()
    except UnicodeDecodeError as bad:
        raise CommandError(
            f"relaygen generate: standard input is not {bad.encoding} text "
            f"(byte {bad.start}); pipe the question as text or give it as an argument",
            2,
        ) from None
    if not text:
        raise CommandError(
            "relaygen generate: standard input is empty: pipe a question in "
            '(echo "What is 2 + 2?" | relaygen generate ...) or give it as an argument',
            2,
        )
    return text


async def _generate(config: RelayConfig, args: argparse.Namespace) -> RelayResult:
    messages: list[dict[str, Any]] = []
    if args.system:
        messages.append({"role": "system", "content": args.system})
    messages.append({"role": "user", "content": args.prompt})
    kwargs = {"enable_thinking": False} if args.no_thinking else None
    out = sys.stdout
    async with RelaySwitcher(config) as relay:
        if not args.json:
            _print_header(out, config, relay, args)
        printer = _SpanPrinter(out, colour=out.isatty() and not args.json)
        result: RelayResult | None = None
        async for event in relay.stream(messages, chat_template_kwargs=kwargs):
            if isinstance(event, TextDelta) and not args.json:
                printer.write(event)
            elif isinstance(event, RelayDone):
                result = event.result
        if not args.json:
            printer.close()
    assert result is not None
    if args.json:
        print(result.model_dump_json(indent=2), file=out)
    else:
        _print_stats(out, result)
    return result


def _print_header(out: TextIO, config: RelayConfig, relay: RelaySwitcher, args: Any) -> None:
    if args.note:
        print(args.note, file=out)
    print(f"large: {config.large.model} @ {config.large.base_url}", file=out)
    print(f"small: {config.small.model} @ {config.small.base_url}", file=out)
    print(f"cues:  {len(relay.cues.cues)} from {relay.cues.source}", file=out)
    print("legend: [L ...] written by the large model, [S ...] by the small one", file=out)
    print(f"question: {args.prompt}\n", file=out)


class _SpanPrinter:
    """Prints deltas, opening a new marked span whenever the writer or the phase changes."""

    def __init__(self, out: TextIO, colour: bool) -> None:
        self.out = out
        self.colour = colour
        self.current: tuple[ModelRole, str] | None = None

    def write(self, delta: TextDelta) -> None:
        key = (delta.model, delta.phase)
        if key != self.current:
            if self.current is not None and self.current[1] != delta.phase:
                self._close()
                self.out.write("\n\n--- answer ---\n")
            elif self.current is not None:
                self._close()
            else:
                self.out.write(f"--- {delta.phase} ---\n")
            self.current = key
            self.out.write(_COLOURS[delta.model] if self.colour else "")
            self.out.write(f"[{delta.model[0].upper()} ")
        self.out.write(delta.text)
        self.out.flush()

    def _close(self) -> None:
        self.out.write("]" + (_RESET if self.colour else ""))

    def close(self) -> None:
        if self.current is not None:
            self._close()
        self.out.write("\n\n")


def _print_stats(out: TextIO, result: RelayResult) -> None:
    stats = result.stats
    print(f"finish reason:     {result.finish_reason}", file=out)
    print(f"large-model share: {stats.large_share:.1%} of generated tokens", file=out)
    print(f"switches:          {stats.switches}", file=out)
    if stats.speculative_handoffs or stats.speculative_misses:
        print(
            f"speculative:       {stats.speculative_handoffs} hand-offs' requests opened "
            f"ahead and used, {stats.speculative_misses} closed unused",
            file=out,
        )
    if stats.warm_up is not None:
        print(
            f"prompt warm-up:    {stats.warm_up.prompt_tokens} small-model prompt tokens sent "
            "ahead, one request (not in the usage below)",
            file=out,
        )
    ttft = f"{stats.time_to_first_token:.2f} s" if stats.time_to_first_token else "n/a"
    print(f"time:              {stats.total_seconds:.2f} s (first token {ttft})", file=out)
    for role, usage in result.usage.items():
        cached = f"{usage.cached_tokens} from the prefix cache"
        if usage.cache_unreported:
            cached += f"; {usage.cache_unreported} requests did not say"
        print(
            f"{role:5} model:       {usage.completion_tokens} tokens written, "
            f"{usage.prompt_tokens} prompt tokens ({cached}), "
            f"{usage.requests} requests, {stats.seconds[role]:.2f} s",
            file=out,
        )
    print(json.dumps({"segments": [(s.model, s.ended_by) for s in result.segments]}), file=out)
    print(what_happened(result), file=out)


_SMALL_TURN_ENDS = {
    "sentence_end": "finishing the sentence",
    "segment_cap": "reaching its token cap",
    "small_ended_reasoning": "writing an end of reasoning the relay dropped",
    "end_of_reasoning": "ending the reasoning",
    "reasoning_budget": "reaching the reasoning budget",
    "length": "using up the budget",
    "stop": "stopping",
    "failed": "failing",
}
"""How a small turn in the reasoning ended, as the closing lines say it."""


def what_happened(result: RelayResult) -> str:
    """The generation in two sentences: the hand-offs, their cues and how each small turn
    ended, the small model's share.

    >>> print(what_happened(result))  # doctest: +SKIP
    In short: the small model took over 3 times mid-reasoning, after "Now" (twice) and
    "So " (once), each time finishing the sentence; it also wrote the answer.
    The small model wrote 31.5% of the tokens.
    """
    cues = Counter(s.cue for s in result.segments if s.ended_by == "cue" and s.cue is not None)
    answered = any(s.model == "small" and s.phase == "answer" for s in result.segments)
    switches = sum(cues.values())
    if switches:
        named = [f"{json.dumps(cue)} ({_times(count)})" for cue, count in cues.items()]
        story = f"the small model took over {_times(switches)} mid-reasoning, after "
        story += f"{_listed(named)}, {_small_turns(result)}"
        story += "; it also wrote the answer" if answered else ""
    else:
        story = "the large model wrote no cue, so it wrote all of the reasoning"
        story += "; the small model wrote the answer" if answered else ""
    share = 1 - result.stats.large_share
    return f"In short: {story}. The small model wrote {share:.1%} of the tokens."


def _small_turns(result: RelayResult) -> str:
    """How the small model's turns in the reasoning ended: "each time finishing the
    sentence", "finishing the sentence once and reaching its token cap twice"."""
    ends = Counter(
        s.ended_by for s in result.segments if s.model == "small" and s.phase == "reasoning"
    )
    said = {end: _SMALL_TURN_ENDS.get(end, end) for end in ends}
    if len(ends) == 1:
        ((end, count),) = ends.items()
        return f"each time {said[end]}" if count > 1 else said[end]
    return _listed([f"{said[end]} {_times(count)}" for end, count in ends.items()])


def _listed(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _times(count: int) -> str:
    return {1: "once", 2: "twice"}.get(count, f"{count} times")
