"""The pure prompt renderer (``runtime.prompt_template``): placeholders, pins, the literal
``$${``, and that neither an instruction's text nor an input's value is rendered again."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runtime.prompt_template import (
    PromptTemplateError,
    check_prompt_template,
    instruction_references,
    render_prompt,
)

TEXTS = {("tone", 1): "Plain words ${inputs.secret}.", ("tone", 2): "Haiku."}


def lookup(name: str, version: int | None) -> tuple[str, int]:
    number = 2 if version is None else version
    if (name, number) not in TEXTS:
        raise PromptTemplateError(f'instruction "{name}" has no published version {number}')
    return TEXTS[(name, number)], number


def test_every_kind_of_placeholder() -> None:
    rendered = render_prompt(
        "A ${instructions.tone} B ${instructions.tone@1} C ${inputs.ticket|upper} ${ticket} "
        '${include("ID.md")} {{ kept }} {% kept %} $${HOME}',
        variables={"ticket": "lw-7", "secret": "s3"},
        instruction=lookup,
        include=lambda path: f"<{path}>",
    )
    assert rendered.text == (
        "A Haiku. B Plain words ${inputs.secret}. C LW-7 lw-7 <ID.md> {{ kept }} {% kept %} ${HOME}"
    )
    assert rendered.instructions == {"tone": 2}


def test_a_pin_decides_an_unversioned_reference() -> None:
    rendered = render_prompt("${instructions.tone}", instruction=lookup, pinned={"tone": 1})
    assert (rendered.text, rendered.instructions) == (TEXTS[("tone", 1)], {"tone": 1})
    assert instruction_references("${instructions.a-b@3} ${ instructions.c }") == [
        ("a-b", 3), ("c", None),
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("${missing}", "'missing' is undefined"),
        ('${include("x.md")}', 'include("x.md")'),
        ("${instructions.tone@9}", "no published version 9"),
        ("${inputs.a", "could not be rendered"),
        ("${().__class__}", "could not be rendered"),
    ],
)
def test_failures_name_the_placeholder(text: str, named: str) -> None:
    with pytest.raises(PromptTemplateError) as failed:
        render_prompt(text, variables={"a": 1}, instruction=lookup)
    assert named in str(failed.value)


def test_a_template_that_does_not_parse_is_refused_when_saved() -> None:
    check_prompt_template("no placeholders { at all")
    check_prompt_template("${instructions.tone} ${inputs.x}")
    with pytest.raises(PromptTemplateError):
        check_prompt_template("${inputs.x")


@given(st.text(max_size=60))
def test_an_input_value_is_inserted_as_text(value: str) -> None:
    assert render_prompt("[${v}]", variables={"v": value}).text == f"[{value}]"
