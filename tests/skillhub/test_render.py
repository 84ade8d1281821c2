"""Rendering puts every value into the program as a parsed literal, never as text: checked as a
pure property, and by running hostile inputs through the real sandbox in both languages."""

from __future__ import annotations

import json
import string
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sandbox import SandboxRequest, run_sandboxed
from skillhub.render import literal, placeholders, render, with_defaults

INJECTIONS = [
    '"); import os; os.system("id") #',
    "'); require('child_process').execSync('id'); ('",
    '"""\nimport os\nos.system("id")\n"""',
    "`${process.exit(3)}`",
    '\\"; print(1) #',
    "line1\nline2\r\n\u2028\u2029\x00end",
    "{{text}} {{ other }}",
    "🙂 surrogate pairs 𝄞 and ümlauts",
]
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet=st.characters(), max_size=30),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4)
    ),
    max_leaves=10,
)


def test_placeholders_are_listed_once_in_order() -> None:
    assert placeholders("{{b}} {{ a }} {{b}} {x} {{ 1bad }}") == ["b", "a"]


@given(json_values)
@settings(max_examples=200, deadline=None)
def test_a_python_literal_evaluates_to_the_same_value(value: Any) -> None:
    assert eval(literal("python", value)) == value  # noqa: S307 - our own literal, under test


@given(st.text(alphabet=string.printable, max_size=50))
def test_the_literal_is_plain_ascii_and_one_line(value: str) -> None:
    for language in ("python", "node"):
        text = literal(language, value)
        assert text.isascii() and "\n" not in text and "\r" not in text


def test_a_missing_value_renders_as_null_and_defaults_fill_in() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer", "default": 3}}}
    assert with_defaults(schema, {}) == {"n": 3}
    assert render("x = {{n}}", "python", {}) == 'x = __import__("json").loads("null")'


def _run(language: str, code: str) -> str:
    result = run_sandboxed(SandboxRequest(language=language, code=code, timeout_seconds=20))  # type: ignore[arg-type]
    assert result.exit_code == 0, result.stderr
    return result.stdout


@pytest.mark.parametrize("language", ["python", "node"])
def test_hostile_inputs_arrive_as_exactly_those_strings(language: str) -> None:
    values = {"text": INJECTIONS}
    if language == "python":
        template = "import json\nv = {{text}}\nprint(json.dumps(v))\n"
    else:
        template = "const v = {{text}};\nconsole.log(JSON.stringify(v));\n"
    stdout = _run(language, render(template, language, values))
    assert json.loads(stdout) == INJECTIONS
    assert "uid=" not in stdout
