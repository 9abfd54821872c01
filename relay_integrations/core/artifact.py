"""The cue-set artifact: a versioned JSON document that records a cue set and its model pair.

A calibration run writes one; the switcher loads it. Built-in artifacts ship with the package::

    from relay_integrations.core.artifact import load_artifact

    artifact = load_artifact("builtin:qwen3-32b--qwen3-1.7b")
    artifact.cues[:3]           # ['Oh,', 'another,', 'Thus']
    artifact.model_pair.large   # ModelIdentity(model='Qwen/Qwen3-32B', tokenizer='Qwen/Qwen3-32B')
"""

from __future__ import annotations

import json
from datetime import datetime
from importlib import resources
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .errors import CueArtifactError

ARTIFACT_FORMAT = "relaygen-cues"
BUILTIN_PREFIX = "builtin:"


class ModelIdentity(BaseModel):
    """What identifies a model: its name (as vLLM reports it in /v1/models `root`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str = Field(min_length=1, description="Hugging Face id or path, e.g. Qwen/Qwen3-32B")
    tokenizer: str | None = Field(default=None, description="Tokenizer id or content hash")

    def matches(self, served: str) -> bool:
        """True if `served` (a /v1/models `root` or served name) names the same model.

        Compares the last path component, case-insensitively, so ``Qwen/Qwen3-32B`` matches
        ``/models/qwen3-32b``.
        """
        return _base_name(self.model) == _base_name(served)


class ModelPair(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    large: ModelIdentity
    small: ModelIdentity


class CueArtifact(BaseModel):
    """Version 1 of the cue-set file format."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    format: Literal["relaygen-cues"] = "relaygen-cues"
    version: Literal[1] = 1
    model_pair: ModelPair
    cues: list[str] = Field(min_length=1)
    source: str = Field(min_length=1, description="How the cues were chosen")
    created_at: datetime | None = None
    package_version: str | None = None

    @field_validator("cues")
    @classmethod
    def _cues_are_words(cls, cues: list[str]) -> list[str]:
        for cue in cues:
            if not cue.strip():
                raise ValueError("a cue is empty or only whitespace")
            if cue != cue.lstrip():
                raise ValueError(f"cue {cue!r} starts with whitespace; write the word itself")
        if len(set(cues)) != len(cues):
            duplicates = sorted({c for c in cues if cues.count(c) > 1})
            raise ValueError(f"duplicate cues: {duplicates}")
        return cues


def builtin_artifact_names() -> list[str]:
    """Names accepted after ``builtin:``."""
    folder = resources.files(__package__).joinpath("builtin_cues")
    return sorted(
        p.name.removesuffix(".json") for p in folder.iterdir() if p.name.endswith(".json")
    )


def load_artifact(source: str | Path) -> CueArtifact:
    """Load and validate an artifact from a path or ``builtin:NAME``.

    Raises :class:`CueArtifactError` naming the file and what is wrong with it.
    """
    text, where = _read(source)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CueArtifactError(where, f"not valid JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(data, dict) or data.get("format") != ARTIFACT_FORMAT:
        raise CueArtifactError(
            where, f'not a cue artifact (expected "format": "{ARTIFACT_FORMAT}")'
        )
    if data.get("version") != 1:
        raise CueArtifactError(
            where, f"unsupported version {data.get('version')!r}; this package reads version 1"
        )
    try:
        return CueArtifact.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '(root)'}: {err['msg']}"
            for err in exc.errors()
        )
        raise CueArtifactError(where, problems) from None


def _read(source: str | Path) -> tuple[str, str]:
    if isinstance(source, str) and source.startswith(BUILTIN_PREFIX):
        name = source[len(BUILTIN_PREFIX) :]
        if name not in builtin_artifact_names():
            raise CueArtifactError(
                source, f"no built-in artifact {name!r}; choose one of {builtin_artifact_names()}"
            )
        ref = resources.files(__package__).joinpath("builtin_cues", f"{name}.json")
        return ref.read_text(encoding="utf-8"), source
    path = Path(source)
    try:
        return path.read_text(encoding="utf-8"), str(path)
    except FileNotFoundError:
        raise CueArtifactError(str(path), "file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CueArtifactError(str(path), f"cannot be read: {exc}") from None


def _base_name(name: str) -> str:
    return name.rstrip("/").rsplit("/", 1)[-1].lower()
