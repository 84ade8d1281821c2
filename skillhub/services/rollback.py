"""Rollback: restore a skill's earlier version in one action, recorded as a new version
(``skillhub.services.versions`` describes the chain and the default target)."""

from __future__ import annotations

from typing import Any

from django.db import transaction

from orchestrator.errors import InvalidInput, NotFound
from skillhub.models import Skill, SkillVersion
from skillhub.services.skills import skill_validate
from skillhub.services.versions import VERSIONED, default_target, version_record


@transaction.atomic
def skill_rollback(*, skill: Skill, actor: str, reason: str, to: int | None = None) -> Skill:
    """Restore every versioned field (and the archive) of version ``to`` (default: see the
    module), validated like an edit, and record it as a new ``rollback`` version."""
    if not reason.strip():
        raise InvalidInput(
            "A rollback needs a reason.",
            errors=[{"pointer": "/reason", "detail": "may not be empty", "code": "required"}],
        )
    locked = Skill.objects.select_for_update().get(pk=skill.pk)
    number = default_target(locked) if to is None else to
    target = SkillVersion.objects.filter(skill=locked, number=number).first()
    if target is None:
        raise NotFound(f"Skill {locked.tool_name!r} has no version {number}.")
    fields: dict[str, Any] = {f: target.state[f] for f in VERSIONED if f in target.state}
    fields["archive"] = bytes(target.archive) if target.archive is not None else None
    skill_validate({k: v for k, v in fields.items() if k != "source_commit"})
    for name, value in fields.items():
        setattr(locked, name, value)
    locked.save(update_fields=[*fields, "updated_at"])
    version_record(locked, actor=actor, kind="rollback", reason=reason, restored_from=number)
    return locked
