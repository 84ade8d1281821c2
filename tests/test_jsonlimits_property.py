"""Property tests of the JSON bounds (orchestrator.jsonlimits): whatever the document, parsing
either returns exactly what ``json.loads`` returns or refuses with a pointer that names a real
place; never another exception, never a ``RecursionError``."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.jsonlimits import MAX_DEPTH, JsonRefused, check_value, loads_bounded

_TEXT = st.text(alphabet=st.characters(codec="utf-8"), max_size=8)
_NASTY = st.sampled_from(["a\x00b", "\x00", "\ud800", "x\udfffy", "ok", ""])
_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | _TEXT
    | _NASTY
)
_JSON = st.recursive(
    _SCALARS,
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(_TEXT | _NASTY, children, max_size=3)
    ),
    max_leaves=20,
)


def _depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    return 0


def _strings(value: Any) -> list[str]:
    if isinstance(value, dict):
        return [*value, *(s for v in value.values() for s in _strings(v))]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return [value] if isinstance(value, str) else []


def _storable(text: str) -> bool:
    return "\x00" not in text and not any(0xD800 <= ord(c) <= 0xDFFF for c in text)


def _resolve(value: Any, pointer: str) -> None:
    """Follow ``pointer`` (keys with a NUL or surrogate are shown escaped: stop there)."""
    for raw in pointer.split("/")[1:]:
        part = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(value, list):
            value = value[int(part)]
        elif part in value:
            value = value[part]
        else:
            assert "\\u" in part or "\\x" in part, (pointer, part)
            return


@settings(max_examples=400, deadline=None)
@given(_JSON)
def test_a_document_is_parsed_as_is_or_refused_at_a_real_place(value: Any) -> None:
    text = json.dumps(value)  # ASCII: NUL and surrogates travel as \\u escapes
    clean = all(_storable(s) for s in _strings(value)) and _depth(value) <= MAX_DEPTH
    try:
        parsed = loads_bounded(text)
    except JsonRefused as refused:
        assert not clean
        assert refused.code in {"null_character", "unpaired_surrogate", "too_deep"}
        _resolve(value, refused.pointer)
    else:
        assert clean
        assert parsed == json.loads(text)


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=0, max_value=20_000), st.sampled_from(["[]", "{}"]))
def test_any_depth_is_parsed_or_refused_never_a_recursion_error(depth: int, kind: str) -> None:
    opener, closer = kind
    inner = '"a": ' if kind == "{}" else ""
    text = (
        (opener + inner) * depth + "1" * (kind == "[]") + "null" * (kind == "{}") + closer * depth
    )
    if depth == 0:
        text = "1"
    try:
        loads_bounded(text)
    except JsonRefused as refused:
        assert depth > MAX_DEPTH and refused.code == "too_deep"
    else:
        assert depth <= MAX_DEPTH


@settings(max_examples=200, deadline=None)
@given(_JSON)
def test_check_value_agrees_with_loads_bounded(value: Any) -> None:
    text = json.dumps(value)
    try:
        loads_bounded(text)
        from_text = None
    except JsonRefused as refused:
        from_text = (refused.code, refused.pointer)
    try:
        check_value(value)
        from_value = None
    except JsonRefused as refused:
        from_value = (refused.code, refused.pointer)
    assert (from_text is None) == (from_value is None)
