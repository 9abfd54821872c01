"""The cue-set artifact: a versioned JSON document that records a cue set and its model pair.

A calibration run (``relaygen calibrate``) writes one, with the statistics every cue was chosen
on; the switcher loads it. Built-in artifacts ship with the package::

    from relay_integrations.relay.artifact import load_artifact

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

from ..upstream.config import ModelRole
from .errors import CueArtifactError

ARTIFACT_FORMAT = "relaygen-cues"
ARTIFACT_VERSION: Literal[2] = 2
BUILTIN_PREFIX = "builtin:"
MAX_REPORTED_PROBLEMS = 5


class ModelIdentity(BaseModel):
    """What identifies a model: its name (as vLLM reports it in /v1/models `root`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str = Field(min_length=1, description="Hugging Face id or path, e.g. Qwen/Qwen3-32B")
    served_name: str | None = Field(default=None, description="The name the server serves it as")
    tokenizer: str | None = Field(
        default=None,
        description="Tokenizer id, or a fingerprint: sha256 of the ids of a fixed probe text",
    )

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

    def mismatch(self, role: ModelRole, served: str, root: str | None = None) -> str | None:
        """Why a server's model is not this pair's `role` model, or None when it is.

        `served` is the model's ``/v1/models`` id, `root` the model it was loaded from::

            pair.mismatch("large", "qwen3-32b", "/models/Qwen3-32B")  # None
            pair.mismatch("small", "tiny")  # "calibrated for small model 'Qwen/Qwen3-1.7B', ..."
        """
        identity = self.large if role == "large" else self.small
        if identity.matches(served) or (root is not None and identity.matches(root)):
            return None
        return (
            f"calibrated for {role} model {identity.model!r}, but the {role} endpoint serves "
            f"{root or served!r}"
        )


class CueStatistics(BaseModel):
    """How the small model fared after one candidate cue, over all its occurrences."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    cue: str
    occurrences: int = Field(ge=0, description="Occurrences with at least one post-cue token")
    unscored: int = Field(default=0, ge=0, description="Occurrences at the very end of a trace")
    tokens: int = Field(ge=0, description="Post-cue tokens over all occurrences")
    mean_margin: float | None = Field(description="Mean over occurrences of the span's mean")
    standard_error: float | None = Field(description="Over occurrences; None below two")
    threshold: float | None = Field(description="Global mean + k standard errors")
    selected: bool


class SelectionRule(BaseModel):
    """A cue is kept when its mean post-cue margin is above the global mean margin by at least
    ``k`` standard errors (and strictly above it), over at least ``min_occurrences``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    k: float = Field(default=1.0, ge=0)
    min_occurrences: int = Field(default=5, ge=2)
    max_span_tokens: int = Field(
        default=128, ge=1, description="Post-cue span cap: the small model's segment cap"
    )


class CalibrationSet(BaseModel):
    """The problems (or ready traces) a calibration ran on."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    size: int = Field(ge=0, description="Problems (or ready traces) in the file")
    sha256: str = Field(description="Hash of the file's content")
    traces: int = Field(ge=0, description="Traces scored")
    trace_source: Literal["generated", "file"]


class TraceSampling(BaseModel):
    """How the large model sampled its traces (absent for ready traces)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    samples_per_problem: int = Field(ge=1)
    temperature: float
    top_p: float
    top_k: int | None
    max_tokens: int
    seed: int | None


class CalibrationRecord(BaseModel):
    """What a calibration measured, so a cue set can be audited and reproduced."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    calibration_set: CalibrationSet
    sampling: TraceSampling | None
    selection: SelectionRule
    tokens_scored: int = Field(ge=0, description="Reasoning tokens with a margin")
    global_mean_margin: float
    candidates: list[CueStatistics]
    seconds: float = Field(ge=0, description="Wall time of the calibration run")


class CueArtifact(BaseModel):
    """Version 2 of the cue-set file format (version 1 files, without ``calibration``, load too).

    Margins are p(top1) - p(top2) of the small model, in probability space.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    format: Literal["relaygen-cues"] = "relaygen-cues"
    version: Literal[1, 2] = ARTIFACT_VERSION
    model_pair: ModelPair
    cues: list[str] = Field(min_length=1)
    source: str = Field(min_length=1, description="How the cues were chosen")
    created_at: datetime | None = None
    package_version: str | None = None
    calibration: CalibrationRecord | None = None

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
    if data.get("version") not in (1, ARTIFACT_VERSION):
        raise CueArtifactError(
            where,
            f"unsupported version {data.get('version')!r}; this package reads versions 1 and "
            f"{ARTIFACT_VERSION}",
        )
    try:
        return CueArtifact.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors()
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '(root)'}: {err['msg']}"
            for err in errors[:MAX_REPORTED_PROBLEMS]
        )
        if len(errors) > MAX_REPORTED_PROBLEMS:
            problems += f"; {len(errors) - MAX_REPORTED_PROBLEMS} more not shown"
        raise CueArtifactError(where, problems) from None


def save_artifact(artifact: CueArtifact, path: str | Path) -> Path:
    """Write `artifact` as indented JSON, atomically (a crash never leaves half a file)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    partial.write_text(artifact.model_dump_json(indent=2) + "\n", "utf-8")
    partial.replace(target)
    return target


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
