"""Tool-call validation and repair: lenient JSON, tool names, JSON Schema arguments."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runtime.validation import (
    Invalid,
    ParsedJson,
    ValidArguments,
    canonical_json,
    match_name,
    near_name,
    parse_json_lenient,
    validate_arguments,
    validator_for,
)

SCHEMA = {
    "type": "object",
    "properties": {
        "path": {"type": "string"},
        "limit": {"type": "integer"},
        "recursive": {"type": "boolean"},
    },
    "required": ["path"],
    "additionalProperties": False,
}


def value_of(raw: str) -> object:
    parsed = parse_json_lenient(raw)
    assert isinstance(parsed, ParsedJson), parsed
    return parsed.value


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ('{"path": "a.txt"}', {"path": "a.txt"}),
        ('```json\n{"path": "a.txt"}\n```', {"path": "a.txt"}),
        ('```\n{"path": "a.txt",}\n```', {"path": "a.txt"}),
        ('{"items": [1, 2, 3,], "path": "x",}', {"items": [1, 2, 3], "path": "x"}),
        ("{'path': 'a.txt', 'recursive': True}", {"path": "a.txt", "recursive": True}),
        ("{'text': 'it\\'s \"quoted\"'}", {"text": 'it\'s "quoted"'}),
        ("{'value': None, 'flag': False}", {"value": None, "flag": False}),
        ('Here you go: {"path": "a.txt"} hope that helps', {"path": "a.txt"}),
        ('"{\\"path\\": \\"a.txt\\"}"', {"path": "a.txt"}),
        ("", {}),
        ("   ", {}),
    ],
)
def test_lenient_json_repairs_the_usual_slips(raw: str, expected: object) -> None:
    assert value_of(raw) == expected


def test_repair_leaves_commas_quotes_and_words_inside_strings_alone() -> None:
    raw = "{'note': 'a, b,] True None \"x\"', 'n': 1,}"
    assert value_of(raw) == {"note": 'a, b,] True None "x"', "n": 1}


def test_repairs_are_reported() -> None:
    parsed = parse_json_lenient("```json\n{'a': 1,}\n```")
    assert isinstance(parsed, ParsedJson)
    assert "removed markdown fences" in parsed.repairs


def test_unrepairable_json_gets_an_actionable_message() -> None:
    parsed = parse_json_lenient("path = a.txt")
    assert isinstance(parsed, Invalid)
    assert "not valid JSON" in parsed.message
    assert '{"path": "README.md"}' in parsed.message
    assert "path = a.txt" in parsed.message


def test_oversized_arguments_are_refused_before_any_repair() -> None:
    parsed = parse_json_lenient("{" + " " * 1_000_001 + "}")
    assert isinstance(parsed, Invalid)
    assert "limit" in parsed.message


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)


@given(st.dictionaries(st.text(max_size=10), json_values, max_size=5))
def test_valid_json_objects_parse_unchanged_fenced_or_not(value: dict[str, object]) -> None:
    text = json.dumps(value)
    assert value_of(text) == value
    assert value_of(f"```json\n{text}\n```") == value


@given(
    st.dictionaries(
        st.text(alphabet="abcxyz_", min_size=1, max_size=6),
        st.text(alphabet="abc ,:{}[]\"'\\", max_size=12) | st.integers() | st.booleans(),
        max_size=4,
    )
)
def test_single_quoted_objects_with_trailing_commas_parse_to_the_same_value(
    value: dict[str, object],
) -> None:
    def single(v: object) -> str:
        if isinstance(v, bool):
            return "True" if v else "False"
        if isinstance(v, str):
            return "'" + v.replace("\\", "\\\\").replace("'", "\\'") + "'"
        return str(v)

    body = ", ".join(f"{single(k)}: {single(v)}" for k, v in value.items())
    assert value_of("{" + body + (", }" if value else "}")) == value


def test_canonical_json_ignores_key_order_and_spacing() -> None:
    assert canonical_json({"b": 1, "a": [1, 2]}) == canonical_json({"a": [1, 2], "b": 1})


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("read", "read"),
        ("Read", "read"),
        ("READ", "read"),
        ("functions.read", "read"),
        (" read ", "read"),
        ("read-file", "read_file"),
        ("Read File", "read_file"),
    ],
)
def test_tool_names_match_ignoring_case_prefixes_and_separators(name: str, expected: str) -> None:
    assert match_name(name, ["read", "read_file", "write"]) == expected


def test_a_single_typo_is_corrected_only_when_unambiguous() -> None:
    assert near_name("raed", ["read", "write", "edit", "list"]) == "read"
    assert near_name("wirte", ["read", "write"]) == "write"
    assert near_name("read_files", ["read_file"]) == "read_file"
    assert near_name("reed", ["read", "reel"]) is None  # two candidates: no guess
    assert near_name("lst", ["list"]) is None  # too short to guess
    assert near_name("delete_everything", ["read", "write"]) is None


def test_valid_arguments_pass_with_scalar_strings_repaired() -> None:
    checked = validate_arguments(
        "read", '{"path": "a", "limit": "10", "recursive": "true"}', SCHEMA
    )
    assert isinstance(checked, ValidArguments)
    assert checked.arguments == {"path": "a", "limit": 10, "recursive": True}


def test_missing_required_property_is_named_with_the_expected_parameters() -> None:
    checked = validate_arguments("read", '{"limit": 3}', SCHEMA)
    assert isinstance(checked, Invalid)
    assert "'path' is a required property" in checked.message
    assert "path (string, required)" in checked.message
    assert "was not run" in checked.message


def test_wrong_types_and_unknown_properties_are_reported() -> None:
    checked = validate_arguments("read", '{"path": 5, "colour": "red"}', SCHEMA)
    assert isinstance(checked, Invalid)
    assert "5 is not of type 'string'" in checked.message
    assert "'colour' was unexpected" in checked.message


def test_arguments_must_be_an_object() -> None:
    checked = validate_arguments("read", '["a.txt"]', SCHEMA)
    assert isinstance(checked, Invalid)
    assert "must be a JSON object" in checked.message


def test_a_schema_validator_is_built_once_per_schema_object() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    assert validator_for(schema) is validator_for(schema)
    # An equal mapping is another schema object: it gets its own validator, never a stale one.
    twin = json.loads(json.dumps(schema))
    assert validator_for(twin) is not validator_for(schema)
    assert validator_for(twin).schema is twin
    # Cached or not, the verdicts are those of the schema.
    assert isinstance(validate_arguments("t", '{"n": 1}', schema), ValidArguments)
    assert isinstance(validate_arguments("t", '{"n": "x"}', schema), Invalid)
    assert isinstance(validate_arguments("t", "{}", twin), Invalid)
