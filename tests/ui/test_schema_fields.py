"""JSON Schema → form fields → posted values → typed JSON (``frontend.schema_fields``), pure:
each kind of field, the parse errors a person sees, the edited-input merge, and the round trip
(a prefilled, untouched form gives back the value it was filled with) as a property."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from frontend.schema_fields import (
    FormField,
    merged_input,
    parse_values,
    posted_values,
    review_rows,
    schema_fields,
)

REVIEW = {
    "type": "object",
    "properties": {
        "verdict": {"type": "string", "enum": ["ok", "risky"], "title": "Verdict"},
        "note": {"type": "string", "maxLength": 80, "description": "One line"},
        "essay": {"type": "string"},
        "score": {"type": "integer", "minimum": 1, "maximum": 5},
        "ratio": {"type": "number"},
        "safe": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b", "c"]}},
        "extra": {"type": "object"},
    },
    "required": ["verdict", "score"],
}


def _kinds(schema: Any) -> dict[str, str]:
    return {f.name: f.kind for f in schema_fields(schema)}


def test_each_json_type_gets_its_kind_of_field() -> None:
    assert _kinds(REVIEW) == {
        "verdict": "select", "note": "text", "essay": "textarea", "score": "integer",
        "ratio": "number", "safe": "checkbox", "tags": "checkboxes", "extra": "json",
    }  # fmt: skip
    fields = {f.name: f for f in schema_fields(REVIEW)}
    assert fields["verdict"] == FormField(
        name="verdict", kind="select", label="Verdict", required=True, choices=("ok", "risky")
    )
    assert (fields["note"].max_length, fields["note"].help) == (80, "One line")
    assert (fields["score"].minimum, fields["score"].maximum, fields["score"].required) == (
        1.0, 5.0, True,
    )  # fmt: skip
    assert fields["tags"].choices == ("a", "b", "c")
    assert _kinds({"type": "object", "properties": {"n": {"type": ["integer", "null"]}}}) == {
        "n": "integer"
    }
    assert _kinds({"properties": {"x": {"enum": ["p", "q"]}, "y": {"enum": [1, 2]}}}) == {
        "x": "select", "y": "json",
    }  # fmt: skip


def test_a_schema_that_is_not_an_object_of_properties_is_one_field_for_the_whole_value() -> None:
    assert _kinds({"type": "string", "enum": ["yes", "no"]}) == {"": "select"}
    assert _kinds({"type": "object"}) == {"": "json"}
    assert _kinds(True) == {"": "json"}
    [whole] = schema_fields({"type": "array"})
    assert parse_values([whole], {"": ['[1, "two"]']}) == ([1, "two"], {})
    assert parse_values([whole], {"": [""]}) == (None, {})


def test_posted_text_becomes_typed_json_and_empty_fields_are_left_out() -> None:
    fields = schema_fields(REVIEW)
    posted = {
        "verdict": ["risky"], "note": [""], "essay": ["long\ntext"], "score": ["4"],
        "ratio": ["0.25"], "safe": ["on"], "tags": ["c", "a"], "extra": ['{"k": [1]}'],
    }  # fmt: skip
    assert parse_values(fields, posted) == (
        {
            "verdict": "risky", "essay": "long\ntext", "score": 4, "ratio": 0.25, "safe": True,
            "tags": ["a", "c"], "extra": {"k": [1]},
        },
        {},
    )  # fmt: skip
    # A missing checkbox is false; a missing group is empty; the rest are simply absent.
    assert parse_values(fields, {}) == ({"safe": False, "tags": []}, {})


def test_values_not_of_the_fields_type_are_named_at_their_field() -> None:
    fields = schema_fields(REVIEW)
    posted = {"score": ["4.5"], "ratio": ["much"], "tags": ["z"], "extra": ["{nope"]}
    values, problems = parse_values(fields, posted)
    assert problems == {
        "score": "Enter a whole number.",
        "ratio": "Enter a number.",
        "tags": "Not a choice: z.",
        "extra": "Not valid JSON: Expecting property name enclosed in double quotes (line 1).",
    }
    assert values == {"safe": False}
    _, refused = parse_values(fields, {"ratio": ["inf"], "extra": ["[" * 200 + "]" * 200]})
    assert refused["ratio"] == "Enter a finite number."
    assert "deeper" in refused["extra"]


def test_an_edited_input_keeps_what_the_form_does_not_show_and_drops_what_was_emptied() -> None:
    schema = {
        "type": "object",
        "properties": {
            "a": {"type": "integer"}, "b": {"type": "integer"}, "dry": {"type": "boolean"},
            "tags": {"type": "array", "items": {"enum": ["x", "y"], "type": "string"}},
        },
    }  # fmt: skip
    fields = schema_fields(schema)
    proposed = {"a": 1, "b": 2, "hidden": "kept"}
    untouched = posted_values(fields, proposed)
    assert merged_input(fields, proposed, untouched) == (proposed, {})
    edited = {**untouched, "a": ["40"], "b": [""], "dry": ["on"]}
    assert merged_input(fields, proposed, edited) == (
        {"a": 40, "hidden": "kept", "dry": True}, {},
    )  # fmt: skip
    merged, problems = merged_input(fields, proposed, {**untouched, "a": ["x"]})
    assert problems == {"a": "Enter a whole number."} and merged["a"] == 1


def test_fields_come_in_the_required_lists_order_then_by_name_whatever_the_key_order() -> None:
    # PostgreSQL's jsonb does not keep an object's key order; a list's it does.
    names = [f.name for f in schema_fields(REVIEW)]
    assert names == ["verdict", "score", "essay", "extra", "note", "ratio", "safe", "tags"]
    shuffled = {**REVIEW, "properties": dict(reversed(list(REVIEW["properties"].items())))}
    assert [f.name for f in schema_fields(shuffled)] == names


def test_a_review_is_shown_as_rows_in_its_schemas_order() -> None:
    review = {"safe": False, "tags": ["a", "b"], "extra": {"k": 1}, "verdict": "ok", "zz": 1}
    assert review_rows(review, REVIEW) == [
        ("verdict", "ok"), ("extra", '{"k": 1}'), ("safe", "no"), ("tags", "a, b"), ("zz", "1"),
    ]  # fmt: skip
    assert review_rows("fine") == [("Review", "fine")]


_TEXT = st.text(st.characters(codec="utf-8", exclude_categories=["Cs", "Cc"]), min_size=1)
#: Text a stored value may hold: anything but NUL and unpaired surrogates, which the JSON
#: limits refuse (``orchestrator/jsonlimits.py``: PostgreSQL cannot store NUL, and a lone
#: surrogate is not text), so no stored form holds them.
_STORABLE = st.text(st.characters(exclude_characters="\x00", exclude_categories=["Cs"]), max_size=5)
_VALUES = st.fixed_dictionaries(
    {},
    optional={
        "verdict": st.sampled_from(["ok", "risky"]),
        "note": _TEXT.filter(lambda s: len(s) <= 80),
        "essay": _TEXT,
        "score": st.integers(-(10**12), 10**12),
        "ratio": st.floats(allow_nan=False, allow_infinity=False) | st.integers(),
        "safe": st.booleans(),
        "tags": st.lists(st.sampled_from(["a", "b", "c"]), unique=True).map(
            lambda t: [c for c in "abc" if c in t]
        ),
        "extra": st.recursive(
            st.none() | st.booleans() | st.integers() | _STORABLE,
            lambda inner: (
                st.lists(inner, max_size=3)
                | st.dictionaries(_STORABLE.filter(lambda k: len(k) <= 3), inner, max_size=3)
            ),
            max_leaves=8,
        ),
    },
)


@settings(max_examples=200, deadline=None)
@given(_VALUES)
def test_a_prefilled_untouched_form_gives_back_its_value(value: dict[str, Any]) -> None:
    fields = schema_fields(REVIEW)
    parsed, problems = parse_values(fields, posted_values(fields, value))
    assert problems == {}
    # An absent checkbox reads as false and an absent group as empty: a form cannot tell.
    expected = {"safe": False, "tags": [], **value}
    assert parsed == expected
    assert merged_input(fields, value, posted_values(fields, value)) == (value, {})
