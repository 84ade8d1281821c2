"""Cutting tool output to the loop's limit without breaking a character.

Python strings are sequences of code points, so a slice never splits a UTF-8 byte sequence.
What a plain slice can still break is what a reader sees as one character: a base letter and its
combining accents, an emoji and its modifiers or zero-width joiners, a flag (two regional
indicators), a surrogate pair left in a string decoded with ``surrogatepass``. The cut moves
back to the start of such a cluster.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass

#: Code points that continue the character before them (joiners, selectors, skin tones).
_JOINERS = frozenset({"\u200d", "\u20e3"})


@dataclass(frozen=True)
class Truncated:
    text: str
    truncated: bool
    original_length: int


def _continues_previous(char: str) -> bool:
    code = ord(char)
    return (
        unicodedata.combining(char) != 0
        or char in _JOINERS
        or 0xFE00 <= code <= 0xFE0F  # variation selectors
        or 0xE0100 <= code <= 0xE01EF  # variation selectors supplement
        or 0x1F3FB <= code <= 0x1F3FF  # emoji skin-tone modifiers
        or 0xDC00 <= code <= 0xDFFF  # low surrogate of a pair
    )


def _is_regional_indicator(char: str) -> bool:
    return 0x1F1E6 <= ord(char) <= 0x1F1FF


def _splits_flag(text: str, cut: int) -> bool:
    """A flag is a pair of regional indicators: is ``cut`` between the two of one pair?"""
    if not (_is_regional_indicator(text[cut]) and _is_regional_indicator(text[cut - 1])):
        return False
    run = 0
    while cut - run - 1 >= 0 and _is_regional_indicator(text[cut - run - 1]):
        run += 1
    return run % 2 == 1


def safe_cut_index(text: str, limit: int) -> int:
    """The largest index <= ``limit`` that does not split a character cluster."""
    if limit >= len(text):
        return len(text)
    cut = max(limit, 0)
    # A joiner before the cut binds the next code point to the cluster as well.
    while cut > 0 and (
        _continues_previous(text[cut]) or text[cut - 1] in _JOINERS or _splits_flag(text, cut)
    ):
        cut -= 1
    return cut


def truncate_output(text: str, limit: int) -> Truncated:
    """Keep at most ``limit`` characters and say, in the text, that the rest was cut."""
    if len(text) <= limit:
        return Truncated(text=text, truncated=False, original_length=len(text))
    cut = safe_cut_index(text, limit)
    note = (
        f"\n\n[output truncated: showing the first {cut:,} of {len(text):,} characters; "
        "ask for a narrower range if you need the rest]"
    )
    return Truncated(text=text[:cut] + note, truncated=True, original_length=len(text))
