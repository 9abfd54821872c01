"""The candidate switch cues a calibration scores, by default those of the published method.

The authors' calibration code scores 19 discourse words, each bare and with a comma,
capitalised and lower-case, plus ``So,``, ``So `` and five verbs and adverbs (83 in all).
Matching is whole-word (see :class:`~relay_integrations.relay.cues.CueSet`), so a bare word
also counts its occurrences followed by a comma, exactly as it would fire at run time::

    len(DEFAULT_CANDIDATES)  # 83
    DEFAULT_CANDIDATES[:4]   # ('Therefore', 'Therefore,', 'therefore', 'therefore,')
"""

from __future__ import annotations

_WORDS = (
    "Therefore",
    "Thus",
    "Similarly",
    "Also",
    "Alternatively",
    "Wait",
    "Hmm",
    "But",
    "However",
    "Hence",
    "Another",
    "Oh",
    "Maybe",
    "Other",
    "Again",
    "Now",
    "Ah",
    "Any",
    "Specifically",
)
_EXTRA = ("So,", "So ", "check", "double-check", "verify", "then", "next")

DEFAULT_CANDIDATES: tuple[str, ...] = (
    *(form for word in _WORDS for form in (word, word + ",", word.lower(), word.lower() + ",")),
    *_EXTRA,
)
