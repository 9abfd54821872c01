"""Calibration's files: problem sets, trace files, the artifact, the report, the progress bar."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
import tempfile
from contextlib import redirect_stderr, redirect_stdout
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relay_integrations.calibration import DatasetError, ProblemSet, Trace, TraceFile, ready_traces
from relay_integrations.calibration.report import format_table, write_csv, write_plot
from relay_integrations.cli import main
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


# --- every malformed input file of `relaygen calibrate`: a clean error naming file and line ---

BAD_FILES = settings(
    max_examples=max(1, round(60 * float(os.environ.get("RELAY_FUZZ_SCALE", "1")))),
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=6,
)
NOT_TEXT = JSON_VALUES.filter(lambda value: not isinstance(value, str))
BLANK = st.sampled_from(["", " ", "\t\n"])
MESSAGE = {"role": "user", "content": "What is 2 + 2?"}
BAD_MESSAGE = st.one_of(
    NOT_TEXT.filter(lambda value: not isinstance(value, dict)),
    st.builds(lambda role: {**MESSAGE, "role": role}, NOT_TEXT),
    st.builds(lambda content: {**MESSAGE, "content": content}, NOT_TEXT),
    st.sampled_from([{"role": "user"}, {"content": "hi"}, {}]),
)
BAD_PROMPT = st.one_of(
    NOT_TEXT.filter(
        lambda value: (
            not isinstance(value, list)
            or not value
            or not all(
                isinstance(m, dict)
                and isinstance(m.get("role"), str)
                and isinstance(m.get("content"), str)
                for m in value
            )
        )
    ),
    BLANK,
    st.builds(
        lambda bad, last: [MESSAGE, bad] if last else [bad, MESSAGE], BAD_MESSAGE, st.booleans()
    ),
)
NOT_JSON = st.text(st.characters(exclude_characters="\r\n"), min_size=1, max_size=12).filter(
    lambda text: text.strip() and not _json(text)
)
INVALID_UTF8 = st.sampled_from([b"\xff", b"\xc3", b"\xe2\x82", b"\xed\xa0\x80", b"\x80abc"])


def _json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def _line(row: dict[str, Any]) -> bytes:
    return json.dumps(row).encode()


@st.composite
def bad_lines(
    draw: st.DrawFn, good: dict[str, Any], fields: dict[str, st.SearchStrategy[Any]]
) -> bytes:
    """A line that is not a usable row: a field missing or of a bad value, another JSON value
    than an object, not JSON, or not UTF-8."""
    kind = draw(st.sampled_from(["field", "missing", "not an object", "not JSON", "not UTF-8"]))
    name = draw(st.sampled_from(sorted(fields)))
    if kind == "field":
        return _line({**good, name: draw(fields[name])})
    if kind == "missing":
        return _line({k: v for k, v in good.items() if k != name})
    if kind == "not an object":
        return json.dumps(draw(JSON_VALUES.filter(lambda v: not isinstance(v, dict)))).encode()
    if kind == "not JSON":
        return draw(NOT_JSON).encode()
    text = _line(good)
    at = draw(st.integers(0, len(text)))
    return text[:at] + draw(INVALID_UTF8) + text[at:]


@st.composite
def files_with_a_bad_line(
    draw: st.DrawFn, good: dict[str, Any], fields: dict[str, st.SearchStrategy[Any]]
) -> tuple[bytes, int]:
    """Good rows (with extra fields of any JSON, and blank lines) around one bad line; the
    bad line's number."""
    extra = st.dictionaries(
        st.text(max_size=5).filter(lambda k: k not in good), JSON_VALUES, max_size=2
    )
    lines = [_line({**draw(extra), **good}) for _ in range(draw(st.integers(0, 3)))]
    lines += [b""] * draw(st.integers(0, 1))
    at = draw(st.integers(0, len(lines)))
    lines.insert(at, draw(bad_lines(good, fields)))
    lines += [_line(good) for _ in range(draw(st.integers(0, 2)))]
    return b"\n".join(lines) + b"\n", at + 1


def calibrate_stderr(*options: str) -> tuple[int, str]:
    """`relaygen calibrate` in this process against closed ports (a bad file fails before any
    request): its exit status and standard error; an exception escapes as a traceback would."""
    err = io.StringIO()
    endpoints = ["--small-url", "http://127.0.0.1:9/v1", "--small-model", "s"]
    endpoints += ["--large-model", "l", "--no-plot"]
    with redirect_stderr(err), redirect_stdout(io.StringIO()):
        status = main(["calibrate", *options, *endpoints])
    return status, err.getvalue()


@BAD_FILES
@given(
    files_with_a_bad_line(
        {"prompt": "What is 2 + 2?", "reasoning": "Two and two make four."},
        {"prompt": BAD_PROMPT, "reasoning": NOT_TEXT | BLANK},
    )
)
def test_every_bad_line_of_a_trace_file_is_named_with_its_file_and_line(
    case: tuple[bytes, int],
) -> None:
    content, line = case
    with tempfile.TemporaryDirectory() as folder:
        traces = Path(folder, "traces.jsonl")
        traces.write_bytes(content)
        status, error = calibrate_stderr("--traces", str(traces), "--out", folder)
    assert status == 1, error
    assert error.startswith(f"\nrelaygen: {traces}:{line}: "), error


@BAD_FILES
@given(files_with_a_bad_line({"problem": "What is 2 + 2?"}, {"problem": BAD_PROMPT}))
def test_every_bad_line_of_a_problem_set_is_named_before_any_request(
    case: tuple[bytes, int],
) -> None:
    content, line = case
    with tempfile.TemporaryDirectory() as folder:
        problems = Path(folder, "problems.jsonl")
        problems.write_bytes(content)
        status, error = calibrate_stderr(
            "--problems", str(problems), "--large-url", "http://127.0.0.1:9/v1", "--out", folder
        )
    assert status == 1, error
    assert f"relaygen: {problems}:{line}: " in error, error
    assert "connect" not in error.lower()  # refused before any request


@pytest.mark.parametrize("content", [b"", b"\n", b" \n\t\n"])
@pytest.mark.parametrize("source", ["--traces", "--problems"])
def test_an_empty_input_file_is_named(content: bytes, source: str, tmp_path: Path) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_bytes(content)
    large = ["--large-url", "http://127.0.0.1:9/v1"] if source == "--problems" else []
    status, error = calibrate_stderr(source, str(path), *large, "--out", str(tmp_path))
    assert (status, error) == (1, f"\nrelaygen: {path}: holds no rows\n")


@BAD_FILES
@given(st.integers(1, 3), INVALID_UTF8 | NOT_JSON.map(str.encode), st.integers(0, 2))
def test_a_resumed_trace_file_names_a_bad_line_that_is_not_its_last(
    good: int, bad: bytes, after: int
) -> None:
    """A last line cut short by a crash is dropped; any other bad line is named."""
    record = Trace(id="0/0", messages=[MESSAGE], reasoning="r").model_dump_json().encode()
    with tempfile.TemporaryDirectory() as folder:
        out = TraceFile(Path(folder, "traces.jsonl"))
        out.path.write_bytes(b"\n".join([record] * good + [bad] + [record] * (after + 1)) + b"\n")
        with pytest.raises(DatasetError, match=rf"traces\.jsonl:{good + 1}: not a trace record"):
            out.read()
        out.path.write_bytes(b"\n".join([record] * good + [bad]))
        assert len(out.read()) == good
