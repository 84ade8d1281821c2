"""Reads of instructions for the API, the UI, the admin and the services."""

from __future__ import annotations

from django.db.models import OuterRef, QuerySet, Subquery

from instructions.models import Instruction, InstructionVersion, VersionStatus
from orchestrator.errors import NotFound


def instruction_list() -> QuerySet[Instruction]:
    """Instructions with their current version and, as ``draft_version``, their open draft's
    number."""
    drafts = InstructionVersion.objects.filter(
        instruction=OuterRef("pk"), status=VersionStatus.DRAFT
    ).values("version")[:1]
    return (
        Instruction.objects.select_related("current_version")
        .annotate(draft_version=Subquery(drafts))
        .order_by("name")
    )


def instruction_get_or_none(name: str) -> Instruction | None:
    return instruction_list().filter(name=name).first()


def instruction_get(*, name: str) -> Instruction:
    instruction = instruction_get_or_none(name)
    if instruction is None:
        raise NotFound(f"No instruction named {name!r}.")
    return instruction


def instruction_versions(*, name: str) -> QuerySet[InstructionVersion]:
    """Versions of an instruction, newest first; NotFound if the instruction does not exist."""
    return instruction_get(name=name).versions.order_by("-version")


def instruction_version_get(*, name: str, version: int) -> InstructionVersion:
    """One version of an instruction, draft or published; NotFound otherwise."""
    found = instruction_versions(name=name).filter(version=version).first()
    if found is None:
        raise NotFound(f"Instruction {name!r} has no version {version}.")
    return found


def instruction_open_draft(instruction: Instruction) -> InstructionVersion | None:
    return instruction.versions.filter(status=VersionStatus.DRAFT).first()
