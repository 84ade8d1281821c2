"""The resolver prompts use, the diff, and the published-version rule in the model."""

from __future__ import annotations

import pytest

from harness.models import PublishedVersionImmutable
from instructions.models import Instruction, InstructionVersion
from instructions.services import (
    InstructionNotFound,
    instruction_create,
    instruction_diff,
    instruction_publish,
    instruction_save_draft,
    instruction_text,
)
from orchestrator.errors import InvalidInput
from runtime.prompt_template import render_prompt
from tests.instructions.conftest import TONE_V1

pytestmark = pytest.mark.django_db


def test_the_resolver_reads_the_current_or_a_named_published_version(tone: Instruction) -> None:
    instruction_save_draft(name="tone", text="Be terse.\n", note="shorter")
    assert instruction_text("tone", None) == (TONE_V1, 1)  # a draft is not used
    instruction_publish(name="tone", version=2)
    assert instruction_text("tone", None) == ("Be terse.\n", 2)
    assert instruction_text("tone", 1) == (TONE_V1, 1)
    rendered = render_prompt(
        "${instructions.tone} ${instructions.tone@1}", instruction=instruction_text
    )
    assert rendered.text == f"Be terse.\n {TONE_V1}"
    assert rendered.instructions == {"tone": 2}


@pytest.mark.parametrize(
    ("name", "version", "message"),
    [
        ("ghost", None, 'instruction "ghost" does not exist'),
        ("ghost", 1, 'instruction "ghost" does not exist'),
        ("tone", 3, 'instruction "tone" has no published version 3'),
        ("tone", 2, 'instruction "tone" has no published version 2'),  # the open draft
        ("fresh", None, 'instruction "fresh" has no published version'),
    ],
)
def test_the_resolver_names_what_is_missing(
    tone: Instruction, name: str, version: int | None, message: str
) -> None:
    instruction_save_draft(name="tone", text="draft")
    instruction_create(name="fresh", text="never published")
    with pytest.raises(InstructionNotFound) as caught:
        instruction_text(name, version)
    assert caught.value.detail == message
    assert caught.value.status_code == 400


def test_a_second_draft_save_writes_into_the_open_draft(tone: Instruction) -> None:
    first = instruction_save_draft(name="tone", text="a", note="n")
    second = instruction_save_draft(name="tone", text="b")
    assert (first.pk, second.version, second.text, second.note) == (first.pk, 2, "b", "n")
    assert InstructionVersion.objects.filter(instruction=tone).count() == 2


def test_a_published_version_cannot_be_saved_or_deleted(tone: Instruction) -> None:
    published = InstructionVersion.objects.get(instruction=tone, version=1)
    published.text = "rewritten"
    with pytest.raises(PublishedVersionImmutable):
        published.save()
    with pytest.raises(PublishedVersionImmutable):
        published.delete()
    assert instruction_text("tone", 1) == (TONE_V1, 1)


def test_the_diff_is_unified_and_headed_by_name_and_version(tone: Instruction) -> None:
    instruction_save_draft(name="tone", text="Be brief.\nBe warm.\n")
    diff = instruction_diff("tone", 1, 2)
    assert diff.splitlines()[:2] == ["--- tone@1", "+++ tone@2"]
    assert "-Be kind." in diff and "+Be warm." in diff
    assert instruction_diff("tone", 1, 1) == ""


@pytest.mark.parametrize("name", ["Tone", "-tone", "to ne", "x" * 101, ""])
def test_a_name_outside_the_reference_grammar_is_refused(name: str) -> None:
    with pytest.raises(InvalidInput):
        instruction_create(name=name)


def test_text_over_the_cap_is_refused_with_a_400(tone: Instruction) -> None:
    with pytest.raises(InvalidInput, match="at most 100,000"):
        instruction_save_draft(name="tone", text="x" * 100_001)
    assert instruction_save_draft(name="tone", text="x" * 100_000).version == 2
