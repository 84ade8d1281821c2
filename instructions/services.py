"""Writes of instructions, and the resolver prompts use to read one.

As for harness profiles, version numbers are allocated while holding the instruction row
(``SELECT … FOR UPDATE``): concurrent saves and publishes of one instruction serialise, a save
writes into the open draft or opens the next number, and never into a version being published.
The unique indexes on (instruction, version) and on the single draft back this up.
"""

from __future__ import annotations

import difflib
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Max
from django.utils import timezone

from instructions.models import (
    MAX_INSTRUCTION_CHARS,
    NAME_RULE,
    Instruction,
    InstructionVersion,
    VersionStatus,
)
from instructions.selectors import instruction_get, instruction_open_draft, instruction_version_get
from instructions.usage import InstructionUsage, instruction_usages
from orchestrator.errors import Conflict, InvalidInput, NotFound
from runtime.prompt_template import INSTRUCTION_NAME


class InstructionNotFound(InvalidInput):
    """A reference (``${instructions.NAME}`` or ``…@N``) that names no published version."""

    problem_type = "unknown-instruction"
    title = "Unknown instruction"


def _check_name(name: str) -> None:
    if not isinstance(name, str) or INSTRUCTION_NAME.fullmatch(name) is None:
        raise InvalidInput(
            f"A name is {NAME_RULE}.",
            errors=[{"pointer": "/name", "detail": "Invalid name.", "code": "invalid"}],
        )


def _check_text(text: str) -> None:
    if len(text) > MAX_INSTRUCTION_CHARS:
        detail = (
            f"The text is {len(text):,} characters long; an instruction holds at most "
            f"{MAX_INSTRUCTION_CHARS:,}."
        )
        raise InvalidInput(detail, errors=[{"pointer": "/text", "detail": detail, "code": "max"}])


def instruction_create(
    *,
    name: str,
    description: str = "",
    text: str | None = None,
    note: str = "",
    created_by: str = "",
) -> Instruction:
    """Create an instruction; with ``text``, its version 1 as a draft, in the same transaction.
    Nothing is published: a reference resolves only after the first publish."""
    _check_name(name)
    if text is not None:
        _check_text(text)
    try:
        with transaction.atomic():
            instruction = Instruction.objects.create(name=name, description=description)
            if text is not None:
                _draft_open(instruction, text, note, created_by)
    except IntegrityError as exc:
        # The unique name decides a race between two creations; the loser gets a clear 409.
        raise Conflict(f"An instruction named {name!r} already exists.") from exc
    return instruction


def instruction_update(*, name: str, description: str) -> Instruction:
    """Change what describes an instruction; its text only changes through versions."""
    instruction = instruction_get(name=name)
    instruction.description = description
    instruction.save(update_fields=["description", "updated_at"])
    return instruction


def _usage_line(usage: InstructionUsage) -> str:
    pinned = f"@{usage.pinned_version}" if usage.pinned_version is not None else ""
    return f"{usage.kind} {usage.label} ({usage.field}{pinned})"


def instruction_delete(*, name: str) -> None:
    """Delete an instruction and its versions; refused (409) while anything references it."""
    with transaction.atomic():
        instruction = _lock(name)
        used = instruction_usages(name)
        if used:
            where = ", ".join(_usage_line(u) for u in used)
            raise Conflict(
                f"Instruction {name!r} is still used by {where}; remove those references first.",
                usages=[
                    {"kind": u.kind, "label": u.label, "field": u.field, "url": u.url} for u in used
                ],
            )
        instruction.delete()


def _lock(name: str) -> Instruction:
    """The instruction row, locked until the transaction ends. Caller must be inside atomic()."""
    instruction = Instruction.objects.select_for_update().filter(name=name).first()
    if instruction is None:
        raise NotFound(f"No instruction named {name!r}.")
    return instruction


def _draft_open(
    instruction: Instruction, text: str, note: str, created_by: str
) -> InstructionVersion:
    last = instruction.versions.aggregate(last=Max("version"))["last"] or 0
    return InstructionVersion.objects.create(
        instruction=instruction,
        version=last + 1,
        text=text,
        status=VersionStatus.DRAFT,
        note=note,
        created_by=created_by,
    )


def instruction_save_draft(
    *, name: str, text: str, note: str | None = None, created_by: str = ""
) -> InstructionVersion:
    """Write ``text`` into the open draft, or open the next version if none is open.

    Holds the instruction row lock, so the draft found here cannot be published underneath this
    write and two saves cannot both open a new version. ``note`` None keeps the draft's note.
    """
    _check_text(text)
    with transaction.atomic():
        instruction = _lock(name)
        draft = instruction_open_draft(instruction)
        if draft is None:
            return _draft_open(instruction, text, note or "", created_by)
        fields: dict[str, Any] = {"text": text, "updated_at": timezone.now()}
        if note is not None:
            fields["note"] = note
        updated = InstructionVersion.objects.filter(pk=draft.pk, status=VersionStatus.DRAFT).update(
            **fields
        )
        if updated != 1:  # cannot happen under the lock; refuse rather than lose the write
            raise Conflict(f"Draft {draft.version} of {name!r} changed concurrently; save again.")
        draft.refresh_from_db()
        return draft


def _refuse_publish(instruction: Instruction, version: int | None) -> Conflict | NotFound:
    name = instruction.name
    if version is None:
        return Conflict(f"Instruction {name!r} has no open draft to publish; save a draft first.")
    existing = instruction.versions.filter(version=version).first()
    if existing is None:
        return NotFound(f"Instruction {name!r} has no version {version}.")
    if existing.is_published:
        return Conflict(f"Version {version} of {name!r} is already published.")
    return Conflict(f"Version {version} of {name!r} is not the open draft.")


def instruction_publish(
    *, name: str, version: int | None = None, published_by: str = ""
) -> InstructionVersion:
    """Publish the open draft (optionally naming it) and make it the current version.

    Under the instruction row lock, so a concurrent save either lands before (and is published)
    or after (and opens the next version). The status change is guarded by the expected status.
    """
    with transaction.atomic():
        instruction = _lock(name)
        draft = instruction_open_draft(instruction)
        if draft is None or (version is not None and draft.version != version):
            raise _refuse_publish(instruction, version)
        now = timezone.now()
        updated = InstructionVersion.objects.filter(pk=draft.pk, status=VersionStatus.DRAFT).update(
            status=VersionStatus.PUBLISHED,
            published_at=now,
            published_by=published_by,
            updated_at=now,
        )
        if updated != 1:
            raise Conflict(f"Draft {draft.version} of {name!r} was published concurrently.")
        instruction.current_version = draft
        instruction.save(update_fields=["current_version", "updated_at"])
        draft.refresh_from_db()
        return draft


# --- Reading for prompts ----------------------------------------------------------------------


def instruction_text(name: str, version: int | None) -> tuple[str, int]:
    """The text and number of ``name``'s version ``version`` (None: the current published one).

    The lookup ``runtime.prompt_template.render_prompt`` takes. A missing instruction, one never
    published, or a version that is missing or a draft raise InstructionNotFound (400).
    """
    if version is None:
        instruction = (
            Instruction.objects.select_related("current_version").filter(name=name).first()
        )
        if instruction is None:
            raise InstructionNotFound(f'instruction "{name}" does not exist')
        current = instruction.current_version
        if current is None:
            raise InstructionNotFound(f'instruction "{name}" has no published version')
        return current.text, current.version
    found = (
        InstructionVersion.objects.filter(
            instruction__name=name, version=version, status=VersionStatus.PUBLISHED
        )
        .values_list("text", flat=True)
        .first()
    )
    if found is None:
        if not Instruction.objects.filter(name=name).exists():
            raise InstructionNotFound(f'instruction "{name}" does not exist')
        raise InstructionNotFound(f'instruction "{name}" has no published version {version}')
    return found, version


def instruction_diff(name: str, a: int, b: int) -> str:
    """A unified diff of version ``a``'s text against version ``b``'s (drafts included),
    headed ``name@a`` / ``name@b``; empty when the texts are equal. NotFound for a missing one."""
    old = instruction_version_get(name=name, version=a)
    new = instruction_version_get(name=name, version=b)
    lines = difflib.unified_diff(
        old.text.splitlines(),
        new.text.splitlines(),
        fromfile=f"{name}@{a}",
        tofile=f"{name}@{b}",
        lineterm="",
    )
    out = "\n".join(lines)
    return out + "\n" if out else ""
