"""Skills directories (docs/skill-directories.md): folders of ``*/SKILL.md`` files whose YAML
front matter gives a skill's ``name`` and ``description`` and whose Markdown body is its
instructions, synced from a folder under ``LOOPWRIGHT_SKILLS_ROOT`` or a folder of a Git
repository (``orchestrator.gitcheckout``).

A sync reads the tree and replaces the directory's ``DirectorySkill`` rows in one transaction;
a SKILL.md that cannot be used (no front matter, no name or description, too large, a link out
of the tree, a duplicate name) is reported as refused with the reason, never fatal. Who may use
a directory is its ``employees`` list (empty: nobody); ``skills`` narrows it to some names.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import yaml
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from orchestrator.agents.models import Employee
from orchestrator.errors import InvalidInput, NotFound, full_clean_or_invalid, invalid_fields
from orchestrator.gitcheckout import GitImportError, git_checkout
from skillhub.models import (
    DIRECTORY_KEY,
    DIRECTORY_SKILL_NAME,
    DirectorySkill,
    DirectorySource,
    SkillDirectory,
)

#: Most skills one directory holds, and the largest SKILL.md read.
MAX_DIRECTORY_SKILLS = 500
MAX_SKILL_MD_BYTES = 256 * 1024
MAX_LISTED = 1000
EDITABLE = ("description", "source", "path", "repository", "ref", "employees", "skills")

_FRONT_MATTER = re.compile(r"\A---\s*\n(.*?)\n---\s*(?:\n|\Z)(.*)\Z", re.DOTALL)
_KEY = re.compile(DIRECTORY_KEY)
_NAME = re.compile(DIRECTORY_SKILL_NAME)


def skills_root() -> Path:
    """The folder directories of source ``folder`` live under (``LOOPWRIGHT_SKILLS_ROOT``)."""
    configured = settings.LOOPWRIGHT_SKILLS_ROOT
    return Path(configured) if configured else Path(settings.VAR_DIR) / "skills"


def _err(pointer: str, detail: str, code: str = "invalid") -> dict[str, str]:
    return {"pointer": pointer, "detail": detail, "code": code}


def _names(value: Any, pointer: str, pattern: re.Pattern[str]) -> list[dict[str, str]]:
    if not isinstance(value, list) or len(value) > MAX_LISTED:
        return [_err(pointer, f"must be a list of at most {MAX_LISTED} names")]
    return [
        _err(f"{pointer}/{i}", f"{item!r} is not a valid name ({pattern.pattern})")
        for i, item in enumerate(value)
        if not isinstance(item, str) or not pattern.match(item)
    ]


def _inner_path(path: str) -> PurePosixPath | None:
    inner = PurePosixPath(path.strip("/") or ".")
    return None if inner.is_absolute() or ".." in inner.parts else inner


def _check(directory: SkillDirectory) -> None:
    errors: list[dict[str, str]] = []
    if not _KEY.match(directory.key or ""):
        errors.append(_err("/key", "Use lower-case words joined by - or _."))
    if directory.source not in DirectorySource.values:
        errors.append(_err("/source", "Must be folder or git."))
    if _inner_path(directory.path) is None:
        errors.append(_err("/path", f"{directory.path!r} leaves the folder (.. or absolute)."))
    if directory.source == DirectorySource.FOLDER and not directory.path.strip("/"):
        errors.append(_err("/path", "A folder directory names its folder under the skills root."))
    if directory.source == DirectorySource.GIT and not directory.repository:
        errors.append(_err("/repository", "A git directory names its repository."))
    if directory.source == DirectorySource.FOLDER and directory.repository:
        errors.append(_err("/repository", "Only a git directory has a repository."))
    errors += _names(directory.employees, "/employees", re.compile(r"^[-a-zA-Z0-9_]{1,150}$"))
    errors += _names(directory.skills, "/skills", _NAME)
    if not errors and directory.employees:
        known = set(
            Employee.objects.filter(username__in=directory.employees).values_list(
                "username", flat=True
            )
        )
        errors += [
            _err(f"/employees/{i}", f"no employee {name!r}", "unknown")
            for i, name in enumerate(directory.employees)
            if name not in known
        ]
    if errors:
        raise invalid_fields(errors)
    full_clean_or_invalid(directory)


def skill_directory_get(*, key: str) -> SkillDirectory:
    directory = SkillDirectory.objects.filter(key=key).first()
    if directory is None:
        raise NotFound(f'There is no skills directory "{key}".')
    return directory


def skill_directory_create(**fields: Any) -> SkillDirectory:
    """A new directory (nothing is read until it is synced)."""
    directory = SkillDirectory(**fields)
    if not directory.ref:
        directory.ref = "HEAD"
    _check(directory)
    directory.save()
    return directory


def skill_directory_update(*, directory: SkillDirectory, **fields: Any) -> SkillDirectory:
    """Change the given fields (never the key); a new source takes effect at the next sync."""
    if "key" in fields and fields["key"] != directory.key:
        raise invalid_fields([_err("/key", "The key cannot change.")])
    changed = [name for name in fields if name in EDITABLE]
    for name in changed:
        setattr(directory, name, fields[name])
    _check(directory)
    directory.save(update_fields=[*changed, "updated_at"])
    return directory


def skill_directory_delete(*, directory: SkillDirectory) -> None:
    directory.delete()


@dataclass
class DirectorySynced:
    """What a sync changed: skill names, and ``{path, detail}`` of the SKILL.md files refused."""

    key: str
    commit: str = ""
    added: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    unchanged: int = 0
    refused: list[dict[str, str]] = field(default_factory=list)


def _parse(text: str) -> tuple[dict[str, Any], str]:
    """The SKILL.md's front matter and body; ``ValueError`` naming what is wrong."""
    match = _FRONT_MATTER.match(text)
    if not match:
        raise ValueError("no front matter (--- ... --- at the top)")
    try:
        meta = yaml.safe_load(match.group(1)) or {}
    except yaml.YAMLError as exc:
        raise ValueError(f"the front matter is not valid YAML: {str(exc)[:200]}") from None
    if not isinstance(meta, dict):
        raise ValueError("the front matter is not a mapping")
    name, description = meta.get("name"), meta.get("description")
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"the front matter has no valid name ({DIRECTORY_SKILL_NAME})")
    if not isinstance(description, str) or not description.strip():
        raise ValueError("the front matter has no description")
    return {"name": name, "description": " ".join(description.split())}, match.group(2).strip()


def _read_entry(file: Path, root: Path) -> dict[str, str]:
    if not file.resolve().is_relative_to(root) or not file.is_file():
        raise ValueError("a link out of the directory's root")
    raw = file.read_bytes()
    if len(raw) > MAX_SKILL_MD_BYTES:
        raise ValueError(f"larger than {MAX_SKILL_MD_BYTES // 1024} KB")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("not UTF-8 text") from None
    meta, body = _parse(text)
    return {**meta, "instructions": body, "sha256": hashlib.sha256(raw).hexdigest()}


def read_tree(folder: Path, root: Path, report: DirectorySynced) -> list[dict[str, str]]:
    """The usable ``*/SKILL.md`` of ``folder`` (hidden folders skipped), sorted by path; the
    others go to ``report.refused``."""
    found: dict[str, dict[str, str]] = {}
    for file in sorted(folder.glob("*/SKILL.md")):
        where = file.relative_to(folder).as_posix()
        if where.startswith("."):
            continue
        if len(found) >= MAX_DIRECTORY_SKILLS:
            report.refused.append({"path": where, "detail": f"over {MAX_DIRECTORY_SKILLS} skills"})
            break
        try:
            entry = _read_entry(file, root)
        except (ValueError, OSError) as exc:
            report.refused.append({"path": where, "detail": str(exc)})
            continue
        if entry["name"] in found:
            detail = f"the name {entry['name']!r} is taken by {found[entry['name']]['source_path']}"
            report.refused.append({"path": where, "detail": detail})
            continue
        found[entry["name"]] = {**entry, "source_path": where}
    return list(found.values())


def _store(
    directory: SkillDirectory, entries: list[dict[str, str]], report: DirectorySynced
) -> None:
    """Replace the directory's rows with ``entries`` (one transaction) and fill ``report``."""
    with transaction.atomic():
        locked = SkillDirectory.objects.select_for_update().get(pk=directory.pk)
        before = dict(locked.entries.values_list("name", "sha256"))
        wanted = {e["name"]: e for e in entries}
        for name, entry in wanted.items():
            if name not in before:
                report.added.append(name)
            elif before[name] != entry["sha256"]:
                report.updated.append(name)
            else:
                report.unchanged += 1
        report.removed = sorted(set(before) - set(wanted))
        locked.entries.all().delete()
        DirectorySkill.objects.bulk_create(DirectorySkill(directory=locked, **e) for e in entries)
        locked.commit, locked.synced_at = report.commit, timezone.now()
        locked.save(update_fields=["commit", "synced_at"])
    directory.commit, directory.synced_at = locked.commit, locked.synced_at


def _outside(detail: str, code: str) -> InvalidInput:
    return InvalidInput(detail, errors=[_err("/path", detail, code)])


def skill_directory_sync(*, directory: SkillDirectory) -> DirectorySynced:
    """Read the directory's folder or Git checkout and replace its catalogue."""
    report = DirectorySynced(key=directory.key)
    inner = _inner_path(directory.path)
    if inner is None:
        raise _outside(f"{directory.path} leaves the directory's root.", "outside_root")
    if directory.source == DirectorySource.GIT:
        with git_checkout(directory.repository, directory.ref or "HEAD") as (checkout, commit):
            root = checkout.resolve()
            folder = (root / inner).resolve()
            if not folder.is_relative_to(root) or not folder.is_dir():
                raise GitImportError(
                    f"{directory.path} is not a folder of {directory.repository}.",
                    errors=[_err("/path", "Not a folder.", "not_a_folder")],
                )
            report.commit = commit
            entries = read_tree(folder, root, report)
    else:
        root = skills_root().resolve()
        folder = (root / inner).resolve()
        if not folder.is_relative_to(root):
            raise _outside(f"{directory.path} is outside LOOPWRIGHT_SKILLS_ROOT.", "outside_root")
        if not folder.is_dir():
            raise _outside(
                f"{directory.path} is not a folder under the skills root.", "not_a_folder"
            )
        entries = read_tree(folder, root, report)
    _store(directory, entries, report)
    return report


@dataclass(frozen=True)
class AllowedSkill:
    name: str
    description: str
    directory: str


def _allows(directory: SkillDirectory, name: str) -> bool:
    return not directory.skills or name in directory.skills


def allowed_skills(employee: str) -> list[AllowedSkill]:
    """The skills ``employee`` may load: of directories listing it, within their allowlists,
    sorted by name (a name in two directories: the first directory by key)."""
    directories = [d for d in SkillDirectory.objects.all() if employee in (d.employees or [])]
    if not directories:
        return []
    by_id = {d.pk: d for d in directories}
    found: dict[str, AllowedSkill] = {}
    rows = DirectorySkill.objects.filter(directory__in=directories).order_by("directory__key")
    for directory_id, name, description in rows.values_list("directory_id", "name", "description"):
        directory = by_id[directory_id]
        if _allows(directory, name) and name not in found:
            found[name] = AllowedSkill(name, description, directory.key)
    return sorted(found.values(), key=lambda s: s.name)


def skill_instructions(employee: str, name: str) -> DirectorySkill | None:
    """The skill ``name`` as ``employee`` may load it (None: unknown or not allowed)."""
    for allowed in allowed_skills(employee):
        if allowed.name == name:
            return DirectorySkill.objects.select_related("directory").get(
                directory__key=allowed.directory, name=name
            )
    return None


def employee_binds(employee: str, tool: str) -> bool:
    tools = Employee.objects.filter(username=employee).values_list("tools", flat=True).first()
    return isinstance(tools, list) and tool in tools
