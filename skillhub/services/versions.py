"""The version chain of a skill: each change appends the skill's new full state as a
:class:`SkillVersion` in the change's transaction; a rollback (``skillhub.services.rollback``)
restores an earlier state and is itself a new version (docs/skills.md, "Versions and rollback").

Number ``n`` is the state after the ``n``-th recorded change. A skill changed before it had any
version (created before the chain existed) first gets a ``baseline`` version of its state then.
The default rollback target is the version before the one the current state came from: after
"rollback to 2", the next default rollback goes to 1 (further back, never forth and back).
"""

from __future__ import annotations

import hashlib

from django.db.models import Max

from orchestrator.errors import InvalidInput
from skillhub.models import Skill, SkillVersion

#: The fields a version keeps (and a rollback restores); the archive is stored beside them.
VERSIONED = (
    "title", "description", "instructions", "code_template", "language", "input_schema",
    "interaction_schema", "packages", "timeout_seconds", "max_output_size_mb", "enabled",
    "auto_call", "tool_scope", "employees", "source", "source_ref", "source_path",
    "source_commit",
)  # fmt: skip
KINDS = ("baseline", "create", "update", "git-sync", "registry", "rollback")
REASON_MAX = 2000


def _archive(skill: Skill) -> bytes | None:
    return bytes(skill.archive) if skill.archive is not None else None


def version_record(
    skill: Skill, *, actor: str, kind: str, reason: str = "", restored_from: int | None = None
) -> SkillVersion:
    """Append ``skill``'s current state (the caller holds its row lock or just created it)."""
    assert kind in KINDS, kind
    last = SkillVersion.objects.filter(skill=skill).aggregate(n=Max("number"))["n"] or 0
    archive = _archive(skill)
    return SkillVersion.objects.create(
        skill=skill, number=last + 1, state={f: getattr(skill, f) for f in VERSIONED},
        archive=archive, archive_sha256=hashlib.sha256(archive).hexdigest() if archive else "",
        actor=actor, kind=kind, reason=reason[:REASON_MAX],
        restored_from=restored_from,
    )  # fmt: skip


def version_baseline(skill: Skill) -> None:
    """Record the state of a skill that has no version yet, before it is changed."""
    if not SkillVersion.objects.filter(skill=skill).exists():
        version_record(skill, actor=skill.created_by, kind="baseline")


def versions_list(skill: Skill) -> list[SkillVersion]:
    """The chain, newest first (no archives loaded)."""
    return list(SkillVersion.objects.filter(skill=skill).defer("archive").order_by("-number"))


def default_target(skill: Skill) -> int:
    latest = SkillVersion.objects.filter(skill=skill).order_by("-number").first()
    target = (latest.restored_from or latest.number) - 1 if latest is not None else 0
    if target < 1:
        raise InvalidInput(
            f"Skill {skill.tool_name!r} has no earlier version to roll back to.",
            errors=[{"pointer": "/version", "detail": "no earlier version", "code": "invalid"}],
        )
    return target
