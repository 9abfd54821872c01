"""Final answers of the benchmark: the last boxed answer, choice letters, and grading with
math-verify (on and off the main thread)."""

import asyncio
import threading

import pytest

from relay_integrations.bench.answers import (
    Grade,
    equivalent,
    extract_boxed,
    extract_choice,
    grade,
)


@pytest.mark.parametrize(
    ("text", "boxed"),
    [
        (r"So it is \boxed{4}.", "4"),
        (r"First \boxed{1}, then on reflection \boxed{2}.", "2"),  # the last box wins
        (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"),
        (r"\boxed{x^{2}+\{y\}}", r"x^{2}+\{y\}"),  # escaped braces do not count
        (r"\boxed{\left\{1,2\right\}}", r"\left\{1,2\right\}"),
        (r"\fbox{7}", "7"),
        (r"\boxed {5}", "5"),
        (r"the answer is \boxed{  42 }  ", "42"),  # whitespace inside is stripped
        ("\\boxed{\n3\n}", "3"),
        (r"\boxed{}", ""),
        ("no box at all", None),
        (r"\boxed{\frac{1}{", None),  # cut off by the token limit
        (r"\boxed{3}, but wait: \boxed{\frac{1}{", None),  # the last box is cut off
        (r"\boxed{\boxed{6}}", "6"),
    ],
)
def test_extract_boxed(text: str, boxed: str | None) -> None:
    assert extract_boxed(text) == boxed


@pytest.mark.parametrize(
    ("text", "letter"),
    [
        (r"\boxed{B}", "B"),
        (r"\boxed{(B)}", "B"),
        (r"\boxed{ ( B ) }", "B"),
        (r"\boxed{\text{(C)}}", "C"),
        (r"\boxed{\textbf{(B)}}", "B"),  # AMC solutions box their choice like this
        (r"\boxed{(B) 12}", "B"),
        (r"\boxed{\mathrm{E}}", "E"),
        (r"\boxed{Bob}", None),  # a word, not a letter
        (r"\boxed{E.}", "E"),
        ("The answer is (D).", "D"),
        ("Answer: B", "B"),
        ("so the answer is (c).", "C"),  # a letter in parentheses may be lower case
        ("The answer is (A). No wait, the answer is (C).", "C"),  # the last one said
        (r"\boxed{A} even though the answer is (C)", "A"),  # a boxed letter comes first
        (r"\boxed{12}, so the answer is (E).", "E"),  # a box that is no letter: the text
        (r"\boxed{F}", None),  # not one of the letters
        ("The answer is (F).", None),
        (r"\boxed{F}; the answer is (B)", "B"),
        ("The answer is a multiple of 4.", None),  # the article, not a choice
        ("I cannot decide.", None),
        ("", None),
    ],
)
def test_extract_choice(text: str, letter: str | None) -> None:
    assert extract_choice(text, "ABCDE") == letter


@pytest.mark.parametrize(
    ("answer", "gold"),
    [
        (r"\frac{1}{2}", "0.5"),
        ("0.5", r"\frac{1}{2}"),
        (r"\dfrac{3}{4}", r"\frac34"),
        ("27", "27"),  # AMC's gold 27.0, as load_problems gives it
        ("27.0", "27"),
        (r"2\sqrt{2}", r"\sqrt{8}"),
        (r"\text{5}", "5"),
        (r"\text{(5)}", "5"),
        (r"12 \text{ cm}", "12"),
        (r"50\%", "50"),
        (r"50\%", r"50\%"),
        (r"\pi/2", r"\frac{\pi}{2}"),
        ("x = 3", "3"),
        ("7.", "7"),
    ],
)
def test_equivalent_answers(answer: str, gold: str) -> None:
    assert equivalent(answer, gold)


@pytest.mark.parametrize(
    ("answer", "gold"),
    [
        ("3", "4"),
        (r"\frac{1}{3}", "0.33"),
        (r"\sqrt{2}", "2"),
        ("28", "27"),
        (r"\text{five}", "6"),
        ("", "1"),
    ],
)
def test_different_answers(answer: str, gold: str) -> None:
    assert not equivalent(answer, gold)


@pytest.mark.parametrize(
    ("response", "gold", "expected"),
    [
        (
            r"<think>...</think> The answer is $\boxed{\frac{1}{2}}$.",
            "0.5",
            Grade(r"\frac{1}{2}", True),
        ),
        (r"\boxed{27}", "27", Grade("27", True)),
        (r"\boxed{2\sqrt{2}}", r"\sqrt{8}", Grade(r"2\sqrt{2}", True)),
        (r"\boxed{26}", "27", Grade("26", False)),
        (r"\boxed{\text{Monday}}", "Monday", Grade(r"\text{Monday}", True)),
        ("The answer is 27.", "27", Grade(None, False)),  # no box, no answer
        (r"\boxed{\frac{1}{", "0.5", Grade(None, False)),
    ],
)
def test_grade(response: str, gold: str, expected: Grade) -> None:
    assert grade(response, gold) == expected


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        (r"\boxed{(B)}", Grade("B", True)),
        (r"\boxed{b}", Grade(None, False)),  # a lower-case box is no letter
        (r"\boxed{C}", Grade("C", False)),
        (r"\boxed{12}", Grade(None, False)),  # choice B's text, but choices go by letter
        ("The answer is (B).", Grade("B", True)),
        ("No idea.", Grade(None, False)),
    ],
)
def test_multiple_choice_is_graded_by_letter_only(response: str, expected: Grade) -> None:
    assert grade(response, " b ", choices="ABCDE") == expected


def test_grading_works_off_the_main_thread() -> None:
    # math-verify's timeouts use SIGALRM, which only the main thread may set: in a worker
    # thread they would fail (math-verify logs the error and answers False)
    results: list[Grade] = []
    failures: list[BaseException] = []

    def work() -> None:
        try:
            results.append(grade(r"\boxed{\frac{1}{2}}", "0.5"))
            results.append(grade(r"\boxed{2\sqrt{2}}", r"\sqrt{8}"))
            results.append(grade(r"\boxed{3}", "4"))
        except BaseException as exc:  # pragma: no cover - reported below
            failures.append(exc)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join(timeout=60)
    assert not failures
    assert [r.correct for r in results] == [True, True, False]


async def test_grading_works_in_asyncio_to_thread() -> None:
    assert await asyncio.to_thread(equivalent, r"\dfrac{3}{4}", "0.75")
