"""Sentence ends: not fooled by decimals, abbreviations, list markers or LaTeX."""

import pytest

from relay_integrations.relay import find_sentence_end, is_sentence_end
from relay_integrations.relay.sentences import may_end_here


@pytest.mark.parametrize(
    "text",
    [
        "The sum is 4. ",
        "Is it 4? ",
        "Yes!\n",
        "So $x = 3$. ",
        "We get\n\\[x = 2\\]\n\n",
        "It works.\n",
        "Done, etc. ",
        "Is 9 prime? No. ",
        "The answer is no. ",
    ],
)
def test_real_sentence_ends(text: str) -> None:
    assert is_sentence_end(text)


@pytest.mark.parametrize(
    "text",
    [
        "Use a rule, e.g. ",
        "That is, i.e. ",
        "See Fig. ",
        "Steps:\n1. ",
        "Let $x = 3. ",
        "Then \\( a. ",
        "We have $$x = 1. ",
        "\\[ y. ",
        "as in Eq. ",
    ],
)
def test_false_sentence_ends(text: str) -> None:
    assert not is_sentence_end(text)


def test_find_sentence_end_skips_decimals_and_abbreviations() -> None:
    text = " the value, e.g. 3.5 in $x. y$ here. Then more."
    end = find_sentence_end(text, 0)
    assert end is not None and text[:end].endswith("here.")


def test_find_sentence_end_none_without_an_end() -> None:
    assert find_sentence_end(" no end in sight", 0) is None
    assert find_sentence_end("Ends at the very end.", 0) is None  # nothing follows the mark yet


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("So x is seven.", True),
        ("Is it 4?", True),
        ("Yes!", True),
        ("So x is 7.", False),  # 7.5 may follow
        ("Look at e.g.", False),
        ("Steps:\n1.", False),
        ("So $x = 3 y.", False),  # inside math
        ("So x is seven", False),
        ("", False),
    ],
)
def test_may_end_here(text: str, expected: bool) -> None:
    """Where the relay may open the large model's request before the small model's next
    token confirms the sentence end."""
    assert may_end_here(text) is expected
    if expected:  # the runtime's own check agrees once the space comes
        assert is_sentence_end(text + " ")
