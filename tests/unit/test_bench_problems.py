"""Benchmark problem sets: plain and multiple-choice rows, the chat the models get, and errors
that name the file and row."""

import json
from pathlib import Path
from typing import Any

import pytest

from relay_integrations.bench.problems import (
    CHOICE_INSTRUCTION,
    INSTRUCTION,
    Problem,
    load_problems,
)
from relay_integrations.jobs.datasets import DatasetError


def write(tmp_path: Path, rows: list[Any], name: str = "set.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def test_plain_rows(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        [
            {"problem": "What is 3^3?", "answer": 27.0},  # AMC 2023 stores answers as floats
            {"problem": "Half of 1?", "answer": r"\frac{1}{2}", "id": "half"},
            {"problem": "Seven?", "answer": 7, "id": 12},
            {"problem": "Two and a half?", "answer": 2.5},
            {"problem": "Spaces?", "answer": "  x + 1 "},
        ],
        name="amc23.jsonl",
    )
    problems = load_problems(path)
    assert problems.name == "amc23"
    assert len(problems.sha256) == 64
    assert [p.id for p in problems.items] == ["1", "half", "12", "4", "5"]  # else the row
    assert [p.answer for p in problems.items] == ["27", r"\frac{1}{2}", "7", "2.5", "x + 1"]
    assert problems.items[0] == Problem("1", "What is 3^3?", "27")
    assert all(p.choices is None and p.letters is None for p in problems.items)


def test_plain_messages(tmp_path: Path) -> None:
    problem = load_problems(write(tmp_path, [{"problem": "What is 2+2?", "answer": 4}])).items[0]
    assert problem.messages() == [{"role": "user", "content": f"What is 2+2?\n\n{INSTRUCTION}"}]
    assert "\\boxed{}" in INSTRUCTION


@pytest.mark.parametrize("gold", ["C", "c", "(C)", " (C) ", "12"])
def test_choices_as_a_list(tmp_path: Path, gold: str) -> None:
    row = {"problem": "Which is 3 * 4?", "choices": ["10", "11", "12", "13", "14"], "answer": gold}
    problem = load_problems(write(tmp_path, [row])).items[0]
    assert problem.choices == {"A": "10", "B": "11", "C": "12", "D": "13", "E": "14"}
    assert problem.letters == "ABCDE"
    assert problem.answer == "C"


def test_choices_as_a_dict(tmp_path: Path) -> None:
    rows = [
        {"problem": "Pick", "choices": {"A": "red", "B": "green", "C": "blue"}, "answer": "B"},
        {"problem": "Pick", "choices": {"A": "red", "B": "blue"}, "answer": "blue", "id": "x"},
    ]
    problems = load_problems(write(tmp_path, rows))
    assert problems.items[0].choices == {"A": "red", "B": "green", "C": "blue"}
    assert problems.items[0].answer == "B"
    assert problems.items[1].answer == "B"
    assert problems.items[1].letters == "AB"


def test_multiple_choice_messages(tmp_path: Path) -> None:
    row = {"problem": "Which is 3 * 4?", "choices": ["10", "12", "14"], "answer": "12"}
    messages = load_problems(write(tmp_path, [row])).items[0].messages()
    assert len(messages) == 1 and messages[0]["role"] == "user"
    content = messages[0]["content"]
    assert content == f"Which is 3 * 4?\n\n(A) 10\n(B) 12\n(C) 14\n\n{CHOICE_INSTRUCTION}"
    assert content.index("(A) 10") < content.index("(B) 12") < content.index("(C) 14")
    assert "\\boxed{}" in CHOICE_INSTRUCTION and "letter" in CHOICE_INSTRUCTION


@pytest.mark.parametrize(
    ("rows", "row", "reason"),
    [
        ([{"problem": "a", "answer": 1}, {"problem": "b"}], 2, "no 'answer' field"),
        ([{"problem": "a", "answer": "  "}], 1, "no 'answer' field"),
        ([{"problem": "a", "answer": None}], 1, "no 'answer' field"),
        (
            [
                {"problem": "a", "answer": 1, "id": "x"},
                {"problem": "b", "answer": 2},
                {"problem": "c", "answer": 3, "id": "x"},
            ],
            3,
            "id 'x' appears twice",
        ),
        (  # a given id may clash with a defaulted one
            [{"problem": "a", "answer": 1}, {"problem": "b", "answer": 2, "id": 1}],
            2,
            "id '1' appears twice",
        ),
        ([{"problem": "a", "answer": "A", "choices": "ABCD"}], 1, "'choices' must be"),
        ([{"problem": "a", "answer": "A", "choices": []}], 1, "'choices' must be"),
        ([{"problem": "a", "answer": "A", "choices": [1, 2]}], 1, "'choices' must be"),
        ([{"problem": "a", "answer": "A", "choices": {"a": "x"}}], 1, "'choices' must be"),
        ([{"problem": "a", "answer": "A", "choices": {"AB": "x"}}], 1, "'choices' must be"),
        ([{"problem": "a", "answer": "A", "choices": {"A": 1}}], 1, "'choices' must be"),
        (
            [{"problem": "a", "answer": "A", "choices": [str(i) for i in range(27)]}],
            1,
            "more than 26 choices",
        ),
        (
            [{"problem": "a", "answer": "F", "choices": ["1", "2", "3"]}],
            1,
            "answer 'F' is neither a choice letter (ABC) nor a choice",
        ),
        (
            [{"problem": "a", "answer": "7", "choices": ["1", "2", "3"]}],
            1,
            "answer '7' is neither",
        ),
    ],
)
def test_bad_rows_name_the_file_and_row(
    tmp_path: Path, rows: list[dict[str, Any]], row: int, reason: str
) -> None:
    path = write(tmp_path, rows)
    with pytest.raises(DatasetError) as failed:
        load_problems(path)
    message = str(failed.value)
    assert message.startswith(f"{path} (row {row}): ")
    assert reason in message


def test_malformed_json_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"problem": "a", "answer": 1}\n{"problem": "b", "answer":\n', "utf-8")
    with pytest.raises(DatasetError, match="not valid JSON") as failed:
        load_problems(path)
    assert str(failed.value).startswith(f"{path}:2: ")


def test_a_row_without_a_problem_names_the_line(tmp_path: Path) -> None:
    path = write(tmp_path, [{"problem": "a", "answer": 1}, {"question": "b", "answer": 2}])
    with pytest.raises(DatasetError, match="no 'problem' field") as failed:
        load_problems(path)
    assert str(failed.value).startswith(f"{path}:2: ")


def test_a_missing_file_is_a_dataset_error(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="cannot be read"):
        load_problems(tmp_path / "missing.jsonl")


def test_limit_keeps_the_first_rows_and_says_so(tmp_path: Path) -> None:
    rows = [{"problem": f"p{i}", "answer": i} for i in range(5)]
    path = write(tmp_path, rows, name="aime.jsonl")
    whole = load_problems(path)
    first = load_problems(path, limit=2)
    assert [p.text for p in first.items] == ["p0", "p1"]
    assert first.name == "aime[:2]"
    assert first.sha256 != whole.sha256
    assert load_problems(path, limit=2).sha256 == first.sha256
    assert load_problems(path, limit=3).sha256 != first.sha256
    assert len(load_problems(path, limit=99).items) == 5


def test_limit_does_not_read_the_rows_after_it(tmp_path: Path) -> None:
    path = tmp_path / "set.jsonl"
    path.write_text('{"problem": "a", "answer": 1}\nnot json\n', "utf-8")
    assert len(load_problems(path, limit=1).items) == 1
