"""Where a sentence ends: the point where a small segment hands control back.

The small model stops on the vLLM stop strings in :data:`SENTENCE_STOPS`; each stop is then
checked by :func:`is_sentence_end`, which rejects the false ends a plain ``.`` would take:
decimals (``3.5`` never matches, the stops need a space or line break after the mark),
abbreviations (``e.g.``, ``i.e.``, ``Fig.``), numbered-list markers (``1.``) and marks inside
LaTeX math (``$x = 3. y$``, ``\\[ ... \\]``). Calibration uses :func:`find_sentence_end`, built
on the same two pieces, so a post-cue span ends exactly where the runtime's would::

    find_sentence_end("so e.g. x is 3.5 here. Then", 0)  # 22, just after "here."
"""

from __future__ import annotations

import re

SENTENCE_STOPS = (". ", ".\n", "? ", "?\n", "! ", "!\n", "\n\n")
"""vLLM stop strings of a small segment (each ends in whitespace, trimmed at hand-off)."""

ABBREVIATIONS = frozenset(
    {
        "e.g",
        "i.e",
        "cf",
        "vs",
        "fig",
        "eq",
        "eqs",
        "dr",
        "mr",
        "mrs",
        "ms",
        "prof",
        "approx",
        "resp",
        "al",
    }
)
"""Words whose dot does not end a sentence (lower case). Not "etc" or "no": they often do."""

_WORD_BEFORE_DOT = re.compile(r"(\S+)\.$")
_LIST_MARKER = re.compile(r"(?:^|\n)[ \t]*(?:\d+|[a-zA-Z]|[ivxIVX]+)\.$")
_UNESCAPED_DOLLARS = re.compile(r"(?<!\\)\$\$|(?<!\\)\$")


def is_sentence_end(text: str) -> bool:
    """Whether `text`, which ends with one of :data:`SENTENCE_STOPS`, ends a sentence."""
    body = text.rstrip()
    if not body:
        return False
    if _inside_math(_paragraph(body)):
        return False
    if body.endswith("."):
        if _LIST_MARKER.search(body):
            return False
        word = _WORD_BEFORE_DOT.search(body)
        if word and word.group(1).lstrip("([{\"'").lower() in ABBREVIATIONS:
            return False
    return True


def may_end_here(text: str) -> bool:
    """Whether `text` ends in a sentence mark that ends a sentence if whitespace follows.

    The point where the relay may open the large model's request before the small model's
    next token confirms the end (see ``SwitchPolicy.speculative_handoff``). A dot after a
    digit is left out: it is as often a decimal point (``3.5``)::

        may_end_here("so x is 7.")  # False (maybe 7.5)
        may_end_here("so x is seven.")  # True
    """
    if not text or text[-1] not in ".?!":
        return False
    if text[-1] == "." and text[-2:-1].isdigit():
        return False
    return is_sentence_end(text + " ")


def find_sentence_end(text: str, start: int) -> int | None:
    """The hand-off index of the first sentence end at or after `start`, or None.

    The index points just past the punctuation (trailing whitespace excluded), the same
    place where the runtime hands control back.
    """
    pos = start
    while True:
        hits = [(i, s) for s in SENTENCE_STOPS if (i := text.find(s, pos)) != -1]
        if not hits:
            return None
        index, stop = min(hits)
        end = index + len(stop)
        if is_sentence_end(text[:end]):
            return len(text[:end].rstrip())
        pos = index + 1


def _paragraph(body: str) -> str:
    return body[body.rfind("\n\n") + 2 :] if "\n\n" in body else body


def _inside_math(paragraph: str) -> bool:
    """True if an inline or display math span is open at the end of `paragraph`."""
    open_inline = False
    open_display = False
    for m in _UNESCAPED_DOLLARS.finditer(paragraph):
        if m.group() == "$$":
            open_display = not open_display
        elif not open_display:
            open_inline = not open_inline
    if open_inline or open_display:
        return True
    for opener, closer in (("\\(", "\\)"), ("\\[", "\\]"), ("\\begin{", "\\end{")):
        if paragraph.count(opener) > paragraph.count(closer):
            return True
    return False
