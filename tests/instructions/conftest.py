"""Fixtures for instruction tests: an instruction ``tone`` with version 1 published."""

from __future__ import annotations

import pytest

from instructions.models import Instruction
from instructions.services import instruction_create, instruction_publish

TONE_V1 = "Be brief.\nBe kind.\n"


@pytest.fixture
def tone(db: None) -> Instruction:
    """``tone``: version 1 published, no draft open."""
    instruction_create(name="tone", description="how to sound", text=TONE_V1, created_by="ada")
    instruction_publish(name="tone", published_by="ada")
    return Instruction.objects.get(name="tone")
