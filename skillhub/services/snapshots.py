"""Skill Hub snapshots: every skill (or a chosen few) exported as one verified zip, and imported
back through the same validation as the API (docs/skills.md, Snapshots).

An import writes nothing unless the whole snapshot passes: checksums first
(:mod:`skillhub.services.snapshot_format`), then a skill of the same name that differs is a 409
unless ``replace`` is true, then each skill through the API's serializer and
:func:`skill_create` / :func:`skill_update` in one transaction. ``dry_run`` runs all of it and
rolls the transaction back, so its report is exactly what an import would do.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from django.db import transaction
from rest_framework.exceptions import ValidationError

from orchestrator.errors import Conflict, DomainError, InvalidInput, NotFound, flatten_field_errors
from skillhub.models import Skill, SkillLoopConfig
from skillhub.serializers import LoopConfigSerializer, SkillSerializer, SkillUpdateSerializer
from skillhub.services.skills import EDITABLE, skill_create, skill_update
from skillhub.services.snapshot_format import (
    FORMAT,
    FORMAT_VERSION,
    SnapshotSkill,
    archive_files,
    archive_path,
    refuse,
    sha256,
    snapshot_read,
    snapshot_write,
)

#: The definition fields of a skill in a manifest, in order (``archive`` is described apart).
DEFINITION = (*(name for name in EDITABLE if name != "archive"), "source_commit")
#: Facts about the exporting instance's row, kept for people; an import ignores them.
INFORMATIONAL = ("created_by", "created_at", "updated_at")
_REVIEW = ("requires_review", "review_prompt", "review_schema")
_ENTRY_KEYS = {"tool_name", *DEFINITION, *INFORMATIONAL, "review", "archive"}


@dataclass(frozen=True)
class Export:
    """A snapshot file, its manifest's SHA-256 and the names of the skills it holds."""

    data: bytes
    manifest_sha256: str
    tool_names: list[str]

    @property
    def filename(self) -> str:
        return f"loopwright-skills-{self.manifest_sha256[:16]}.zip"


@dataclass
class ImportReport:
    dry_run: bool
    replace: bool
    manifest_sha256: str = ""
    created: list[str] = field(default_factory=list)
    updated: list[dict[str, Any]] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "format_version": FORMAT_VERSION, "dry_run": self.dry_run, "replace": self.replace,
            "manifest_sha256": self.manifest_sha256, "created": self.created,
            "updated": self.updated, "unchanged": self.unchanged,
        }  # fmt: skip


def _instance_version() -> str | None:
    try:
        return importlib.metadata.version("loopwright")
    except importlib.metadata.PackageNotFoundError:
        return None


def _entry(skill: Skill) -> dict[str, Any]:
    """A skill as a manifest entry: every definition field, the review settings, the files."""
    archive = bytes(skill.archive) if skill.archive is not None else None
    config = SkillLoopConfig.objects.filter(skill=skill).first()
    return {
        "tool_name": skill.tool_name,
        **{name: getattr(skill, name) for name in DEFINITION},
        "created_by": skill.created_by,
        "created_at": skill.created_at.isoformat(),
        "updated_at": skill.updated_at.isoformat(),
        "review": None if config is None else {n: getattr(config, n) for n in _REVIEW},
        "archive": None if archive is None else _archive_meta(skill.tool_name, archive),
    }


def _archive_meta(tool_name: str, archive: bytes) -> dict[str, Any]:
    files = archive_files(archive, f"/{tool_name}/archive")
    return {
        "path": archive_path(tool_name), "size": len(archive), "sha256": sha256(archive),
        "files": files,
    }  # fmt: skip


def snapshot_export(*, tool_names: Sequence[str] | None = None) -> Export:
    """Every skill (or those named) as a snapshot zip; an unknown name is a 404."""
    skills = list(Skill.objects.order_by("tool_name"))
    if tool_names:
        known = {s.tool_name for s in skills}
        missing = sorted(set(tool_names) - known)
        if missing:
            raise NotFound(f"No skill named {', '.join(repr(n) for n in missing)}.")
        skills = [s for s in skills if s.tool_name in set(tool_names)]
    entries = [_entry(skill) for skill in skills]
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "created_at": datetime.now(UTC).isoformat(),
        "loopwright_version": _instance_version(),
        "skills": entries,
    }
    archives = {
        archive_path(s.tool_name): bytes(s.archive) for s in skills if s.archive is not None
    }
    data, digest = snapshot_write(manifest, archives)
    return Export(data=data, manifest_sha256=digest, tool_names=[s.tool_name for s in skills])


def _comparable(entry: dict[str, Any]) -> dict[str, Any]:
    """What an import sets: the definition, the review settings and the archive's checksum."""
    archive = entry.get("archive")
    return {
        **{name: entry.get(name) for name in DEFINITION},
        "review": entry.get("review"),
        "archive": None if archive is None else archive.get("sha256"),
    }


def _changed_fields(local: Skill, wanted: dict[str, Any]) -> list[str]:
    have, want = _comparable(_entry(local)), _comparable(wanted)
    return [name for name in want if have[name] != want[name]]


def _prefixed(exc: DomainError, index: int, tool_name: str, where: str = "") -> InvalidInput:
    """``exc`` naming the skill, its pointers under ``/skills/<index><where>``."""
    errors = exc.extra.get("errors") or [{"pointer": "", "detail": exc.detail, "code": "invalid"}]
    errors = [{**e, "pointer": f"/skills/{index}{where}{e['pointer']}"} for e in errors]
    detail = f"skill {tool_name!r}: {exc.detail}"
    return InvalidInput(detail, errors=errors)


def _shape_errors(entry: dict[str, Any], index: int) -> None:
    unknown = sorted(set(entry) - _ENTRY_KEYS)
    if unknown:
        raise refuse(f"/skills/{index}/{unknown[0]}", f"unknown skill keys: {', '.join(unknown)}")
    commit = entry.get("source_commit", "")
    if not isinstance(commit, str) or len(commit) > 64:
        raise refuse(f"/skills/{index}/source_commit", "must be a string of at most 64 characters")
    review = entry.get("review")
    if review is not None and (not isinstance(review, dict) or set(review) - set(_REVIEW)):
        raise refuse(f"/skills/{index}/review", f"must be null or {{{', '.join(_REVIEW)}}}")


def _validated(serializer: Any, index: int, tool_name: str, where: str = "") -> None:
    """``serializer``'s errors as a 400 naming the skill (and ``where`` in its entry)."""
    try:
        serializer.is_valid(raise_exception=True)
    except ValidationError as exc:
        errors = flatten_field_errors(exc.detail)
        invalid = InvalidInput(errors[0]["detail"], errors=errors)
        raise _prefixed(invalid, index, tool_name, where) from None


def _apply(item: SnapshotSkill, index: int, local: Skill | None, actor: str) -> Skill:
    """Create or replace one skill: its shape checked by the API's serializer (types, lengths,
    choices), then by the skill services' validation. Values are stored as the snapshot holds
    them: the serializer's whitespace trimming would change a program."""
    entry, tool_name = item.entry, item.entry["tool_name"]
    body = {k: v for k, v in entry.items() if k not in ("review", "archive")}
    fields = {n: entry[n] for n in EDITABLE if n in entry and n != "archive"}
    fields["archive"] = item.archive
    try:
        if local is None:
            _validated(SkillSerializer(data=body), index, tool_name)
            skill = skill_create(actor=actor, tool_name=tool_name, **fields)
        else:
            fields = {**{n: f.get_default() for n, f in _fields()}, **fields}
            _validated(SkillUpdateSerializer(local, data=body), index, tool_name)
            skill = skill_update(skill=local, **fields)
    except DomainError as exc:
        raise _prefixed(exc, index, tool_name) from None
    Skill.objects.filter(pk=skill.pk).update(source_commit=entry.get("source_commit", ""))
    _apply_review(skill, entry.get("review"), index)
    return skill


def _fields() -> list[tuple[str, Any]]:
    """Editable fields with a default: a replaced skill takes the default of a field the
    snapshot leaves out, so replace means "becomes exactly the snapshot's skill"."""
    fields = Skill._meta.concrete_fields
    return [(f.name, f) for f in fields if f.name in EDITABLE and f.has_default()]


def _apply_review(skill: Skill, review: dict[str, Any] | None, index: int) -> None:
    """The review config as the snapshot has it (checked by the review API's serializer);
    ``None`` removes it."""
    if review is None:
        SkillLoopConfig.objects.filter(skill=skill).delete()
        return
    _validated(LoopConfigSerializer(data=review), index, skill.tool_name, "/review")
    defaults = {n: f.get_default() for n, f in _review_fields()}
    SkillLoopConfig.objects.update_or_create(skill=skill, defaults={**defaults, **review})


def _review_fields() -> list[tuple[str, Any]]:
    return [(f.name, f) for f in SkillLoopConfig._meta.concrete_fields if f.name in _REVIEW]


def _plan(skills: list[SnapshotSkill], replace: bool) -> list[tuple[int, Skill | None, list[str]]]:
    """Per skill: the local skill of that name (None: create) and the fields that differ. A
    differing local skill without ``replace`` is a 409 naming every such skill."""
    plan, conflicts = [], []
    for index, item in enumerate(skills):
        _shape_errors(item.entry, index)
        local = Skill.objects.select_for_update().filter(tool_name=item.entry["tool_name"]).first()
        changed = [] if local is None else _changed_fields(local, item.entry)
        if local is not None and changed and not replace:
            conflicts.append(local.tool_name)
        plan.append((index, local, changed))
    if conflicts:
        raise Conflict(
            f"Skills of these names exist and differ from the snapshot: {', '.join(conflicts)}; "
            "import with replace=true to overwrite them.",
            conflicts=conflicts,
        )
    return plan


def snapshot_import(
    *, data: bytes, actor: str, replace: bool = False, dry_run: bool = False
) -> ImportReport:
    """Verify a snapshot, then create, replace (``replace``) or leave each of its skills, all in
    one transaction; ``dry_run`` rolls it back. Skills missing from the snapshot are kept."""
    snapshot = snapshot_read(data)
    skills, digest = snapshot.skills, snapshot.manifest_sha256
    report = ImportReport(dry_run=dry_run, replace=replace, manifest_sha256=digest)
    with transaction.atomic():
        for index, local, changed in _plan(skills, replace):
            name = skills[index].entry["tool_name"]
            if local is not None and not changed:
                report.unchanged.append(name)
                continue
            _apply(skills[index], index, local, actor)
            if local is None:
                report.created.append(name)
            else:
                report.updated.append({"tool_name": name, "fields": changed})
        if dry_run:
            transaction.set_rollback(True)
    return report
