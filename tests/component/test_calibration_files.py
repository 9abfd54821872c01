"""Calibration's files: problem sets, trace files, the artifact, the report, the progress bar."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from relay_integrations.calibration import DatasetError, ProblemSet, Trace, TraceFile, ready_traces
from relay_integrations.calibration.report import format_table, write_csv, write_plot
from relay_integrations.jobs.progress import Progress
from relay_integrations.relay import CueArtifactError, load_artifact
from relay_integrations.relay.artifact import (
    CalibrationRecord,
    CalibrationSet,
    CueArtifact,
    CueStatistics,
    ModelIdentity,
    ModelPair,
    SelectionRule,
    save_artifact,
)


def stat(cue: str, n: int, mean: float | None, se: float | None, selected: bool) -> CueStatistics:
    return CueStatistics(
        cue=cue,
        occurrences=n,
        tokens=3 * n,
        mean_margin=mean,
        standard_error=se,
        threshold=None if se is None else 0.3 + se,
        selected=selected,
    )


RECORD = CalibrationRecord(
    calibration_set=CalibrationSet(
        name="set", size=2, sha256="ab" * 32, traces=2, trace_source="file"
    ),
    sampling=None,
    selection=SelectionRule(k=1.0, min_occurrences=2),
    tokens_scored=40,
    global_mean_margin=0.3,
    candidates=[
        stat("Now", 3, 0.35, 0.1, False),
        stat("Therefore,", 4, 0.6, 0.05, True),
        stat("Hmm", 0, None, None, False),
        stat("Wait,", 1, 0.9, None, False),
    ],
    seconds=1.5,
)
ARTIFACT = CueArtifact(
    model_pair=ModelPair(
        large=ModelIdentity(model="org/large", served_name="large", tokenizer="probe-sha256:1"),
        small=ModelIdentity(model="org/small"),
    ),
    cues=["Therefore,"],
    source="test",
    created_at=datetime(2026, 11, 29, tzinfo=UTC),
    package_version="0.1.0",
    calibration=RECORD,
)


def test_problem_sets_name_the_line_and_the_field(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text('{"problem": "a"}\n\n{"question": "b"}\n')
    with pytest.raises(
        DatasetError, match=r"p.jsonl:3: no 'problem' field \(it has \['question'\]\)"
    ):
        ProblemSet.load(path)
    path.write_text('{"problem": "a"}\n[1]\n')
    with pytest.raises(DatasetError, match=r"p\.jsonl:2: a line must hold a JSON object"):
        ProblemSet.load(path)
    path.write_text("")
    with pytest.raises(DatasetError, match="holds no rows"):
        ProblemSet.load(path)
    with pytest.raises(DatasetError, match="cannot be read"):
        ProblemSet.load(tmp_path / "missing.jsonl")


def test_a_limit_keeps_the_first_rows_and_says_so_in_name_and_hash(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps({"problem": f"q{i}"}) + "\n" for i in range(5)))
    full, head = ProblemSet.load(path), ProblemSet.load(path, limit=2)
    assert (full.name, len(full.rows)) == ("p", 5)
    assert (head.name, [r["problem"] for r in head.rows]) == ("p[:2]", ["q0", "q1"])
    assert head.sha256 != full.sha256
    assert ProblemSet.load(path, limit=2).sha256 == head.sha256


def test_ready_traces_take_configurable_fields_and_chat_prompts(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    rows = [
        {"id": "x", "q": "What?", "sol": "Because."},
        {"q": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}], "sol": "So."},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    traces = ready_traces(ProblemSet.load(path, ("q", "sol")), "q", "sol")
    assert [t.id for t in traces] == ["x", "1"]
    assert traces[0].messages == [{"role": "user", "content": "What?"}]
    assert traces[1].messages[0]["role"] == "system"


def test_a_trace_file_drops_a_last_line_cut_by_a_crash_and_rejects_corruption(
    tmp_path: Path,
) -> None:
    out = TraceFile(tmp_path / "traces.jsonl")
    assert out.read() == []
    for i in range(2):
        out.append(Trace(id=f"{i}/0", messages=[{"role": "user", "content": "q"}], reasoning="r"))
    text = out.path.read_text()
    out.path.write_text(text + '{"id": "2/0", "messa')
    assert [t.id for t in out.read()] == ["0/0", "1/0"]
    assert out.path.read_text() == text  # repaired, so appends start on a fresh line
    lines = text.splitlines()
    out.path.write_text(lines[0] + "\n{garbage\n" + lines[1] + "\n")
    with pytest.raises(DatasetError, match=r"traces\.jsonl:2: not a trace record"):
        out.read()


def test_the_artifact_round_trips_and_version_1_still_loads(tmp_path: Path) -> None:
    path = save_artifact(ARTIFACT, tmp_path / "deep" / "cues.json")
    assert load_artifact(path) == ARTIFACT
    assert not (tmp_path / "deep" / "cues.json.partial").exists()
    old = load_artifact("builtin:qwen3-32b--qwen3-1.7b")
    assert old.version == 1 and old.calibration is None


def test_a_truncated_or_tampered_artifact_fails_with_path_and_reason(tmp_path: Path) -> None:
    text = save_artifact(ARTIFACT, tmp_path / "cues.json").read_text()
    truncated = tmp_path / "truncated.json"
    truncated.write_text(text[: len(text) // 2])
    with pytest.raises(CueArtifactError, match=r"truncated.json: not valid JSON"):
        load_artifact(truncated)
    data = json.loads(text)
    for candidate in data["calibration"]["candidates"]:
        del candidate["occurrences"]
    del data["calibration"]["candidates"][0]["tokens"]
    data["calibration"]["selection"]["k"] = -1
    tampered = tmp_path / "tampered.json"
    tampered.write_text(json.dumps(data))
    with pytest.raises(CueArtifactError) as caught:
        load_artifact(tampered)
    message = str(caught.value)
    assert "calibration.selection.k: Input should be greater than or equal to 0" in message
    assert message.count("Field required") == 4
    assert message.endswith("; 1 more not shown")


def test_the_table_ranks_by_mean_and_states_the_rule() -> None:
    table = format_table(RECORD)
    assert (
        "global mean margin 0.3; a cue is selected when its mean post-cue margin >= global mean + 1 standard errors, over >= 2 occurrences"
        in table
    )
    assert "standard errors are over cue occurrences" in table
    rows = [line.split()[0] for line in table.splitlines()[5:]]
    assert rows == ["'Wait,'", "'Therefore,'", "'Now'", "(1"]  # Hmm never occurred
    assert "'Therefore,'       *     4      12      0.6     0.05      0.35" in table


def test_the_csv_holds_every_candidate(tmp_path: Path) -> None:
    with write_csv(RECORD, tmp_path / "cues.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [r["cue"] for r in rows] == ["Wait,", "Therefore,", "Now", "Hmm"]
    assert rows[1] == {
        "cue": "Therefore,",
        "selected": "1",
        "occurrences": "4",
        "unscored": "0",
        "tokens": "12",
        "mean_margin": "0.6",
        "standard_error": "0.05",
        "threshold": "0.35",
        "global_mean_margin": "0.3",
    }
    assert rows[3]["mean_margin"] == ""


def test_the_plot_is_a_png(tmp_path: Path) -> None:
    path = write_plot(RECORD, tmp_path / "cues.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_progress_in_a_log_prints_a_line_per_tenth() -> None:
    out = io.StringIO()
    with Progress("scoring", total=20, stream=out) as bar:
        for _ in range(20):
            bar.advance()
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("scoring  [--------------------]  0/20  0%")
    assert lines[-1].startswith("scoring  [####################]  20/20  100%")
    assert len(lines) == 11


def test_the_command_line_rejects_a_bad_problem_file_with_the_reason(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"problem": "fine"}\n{"problem": \n')
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "relay_integrations.cli",
            "calibrate",
            "--problems",
            str(bad),
            "--large-url",
            "http://127.0.0.1:9/v1",
            "--large-model",
            "l",
            "--small-url",
            "http://127.0.0.1:9/v1",
            "--small-model",
            "s",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert f"{bad}:2: not valid JSON" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_command_line_needs_the_small_endpoint(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "relay_integrations.cli", "calibrate", "--traces", "t.jsonl"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={"PATH": ""},
    )
    assert done.returncode == 2
    assert "no small endpoint: pass --small-url and --small-model" in done.stderr
