"""Skill definitions: create, update (``tool_name`` immutable), delete, with full validation."""

from __future__ import annotations

import io
import re
import zipfile
from collections.abc import Mapping
from typing import Any

from django.db import transaction
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from orchestrator.agents.models import Employee
from orchestrator.errors import Conflict, InvalidInput, NotFound
from skillhub.models import TOOL_NAME_PATTERN, Skill, SkillLanguage, SkillSource, ToolScope
from skillhub.render import placeholders
from skillhub.services.localdir import LocalDirRefused, local_dir_validate
from skillhub.services.packages import package_errors
from skillhub.services.s3ref import S3Refused, s3_check
from skillhub.services.versions import version_baseline, version_record

_TOOL_NAME = re.compile(TOOL_NAME_PATTERN)
#: Names that are collection actions under ``/api/v1/skills/`` (a skill of that name could not
#: be addressed there).
RESERVED_TOOL_NAMES = frozenset({"snapshot"})
#: Largest zip upload and largest total of its unpacked files.
ARCHIVE_MAX_BYTES = 20 * 1024 * 1024
ARCHIVE_MAX_UNPACKED = 50 * 1024 * 1024

EDITABLE = (
    "title", "description", "instructions", "code_template", "language", "input_schema",
    "interaction_schema", "packages", "timeout_seconds", "max_output_size_mb", "enabled",
    "auto_call", "tool_scope", "employees", "source", "source_ref", "source_path", "archive",
)  # fmt: skip

Errors = list[dict[str, str]]


def _err(pointer: str, detail: str, code: str = "invalid") -> dict[str, str]:
    return {"pointer": pointer, "detail": detail, "code": code}


def _raise(errors: Errors) -> None:
    if errors:
        detail = errors[0]["detail"] if len(errors) == 1 else f"{len(errors)} fields are invalid."
        raise InvalidInput(detail, errors=errors)


def _schema_errors(schema: Any, pointer: str, *, object_only: bool) -> Errors:
    if not isinstance(schema, dict):
        return [_err(pointer, "must be a JSON Schema object")]
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        return [_err(pointer, f"not a valid JSON Schema (2020-12): {exc.message}", "schema")]
    if object_only and schema.get("type") != "object":
        return [_err(pointer, 'must describe an object ("type": "object")', "schema")]
    return []


def _placeholder_errors(template: str, schema: Mapping[str, Any]) -> Errors:
    declared = set((schema.get("properties") or {}).keys())
    return [
        _err("/code_template", f"placeholder {{{{{name}}}}} is not a property of input_schema")
        for name in placeholders(template)
        if name not in declared
    ]


def _archive_errors(archive: bytes | None) -> Errors:
    if archive is None:
        return []
    if len(archive) > ARCHIVE_MAX_BYTES:
        return [_err("/archive", f"is larger than {ARCHIVE_MAX_BYTES} bytes", "too_large")]
    try:
        with zipfile.ZipFile(io.BytesIO(archive)) as zf:
            total = sum(info.file_size for info in zf.infolist())
            names = [info.filename for info in zf.infolist() if not info.is_dir()]
    except zipfile.BadZipFile:
        return [_err("/archive", "is not a zip file")]
    if total > ARCHIVE_MAX_UNPACKED:
        return [_err("/archive", f"unpacks to more than {ARCHIVE_MAX_UNPACKED} bytes")]
    bad = [n for n in names if n.startswith("/") or ".." in n.split("/") or "\\" in n]
    return [_err("/archive", f"holds unsafe paths: {', '.join(bad[:5])}")] if bad else []


def _package_errors(values: Any, language: Any) -> Errors:
    """Specs installed into the skill's package environment (``skillhub.services.packages``):
    names with an optional exact version, nothing an installer could be tricked with."""
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        return [_err("/packages", "must be a list of package names")]
    if len(values) > 50:
        return [_err("/packages", "may name at most 50 packages")]
    if values and language == SkillLanguage.DENO:
        # Nothing would provide or check them: Deno runs with no npm, JSR or remote imports.
        return [_err("/packages", "deno skills take no packages (no npm, JSR or remote imports)",
                     "not_supported")]  # fmt: skip
    return [_err(f"/packages/{i}", detail) for i, detail in package_errors(values, language)]


def _source_errors(data: Mapping[str, Any]) -> Errors:
    """A local-dir folder must pass the roots rule (``skillhub.services.localdir``), an s3
    location the bucket rule (``skillhub.services.s3ref``: format and allow list, no network);
    both are checked again each time the files are fetched into the sandbox."""
    source, ref = data.get("source"), data.get("source_ref") or ""
    try:
        if source == SkillSource.LOCAL_DIR:
            local_dir_validate(ref)
        elif source == SkillSource.S3:
            s3_check(ref)
    except (LocalDirRefused, S3Refused) as exc:
        return [_err("/source_ref", str(exc), "not_allowed")]
    if source == SkillSource.GIT and not ref:
        return [_err("/source_ref", "a git skill needs the repository path or URL")]
    return []


def _nul_errors(data: Mapping[str, Any]) -> Errors:
    """PostgreSQL text and JSON cannot hold U+0000: refuse it in any text or JSON value."""
    return [
        _err(pointer, "may not contain NUL characters (U+0000)")
        for name in EDITABLE
        if name != "archive"
        for pointer in nul_pointers(data.get(name), f"/{name}")
    ]


def nul_pointers(value: Any, pointer: str) -> list[str]:
    """JSON Pointers of the strings (keys too) in ``value`` that contain NUL."""
    if isinstance(value, str):
        return [pointer] if "\x00" in value else []
    if isinstance(value, dict):
        found = []
        for key, item in value.items():
            sub = f"{pointer}/{str(key).replace('~', '~0').replace('/', '~1')}"
            found += [sub] if "\x00" in str(key) else nul_pointers(item, sub)
        return found
    if isinstance(value, list):
        return [p for i, item in enumerate(value) for p in nul_pointers(item, f"{pointer}/{i}")]
    return []


def _field_errors(data: Mapping[str, Any]) -> Errors:
    nul = _nul_errors(data)
    if nul:
        return nul
    errors: Errors = []
    errors += _schema_errors(data.get("input_schema"), "/input_schema", object_only=True)
    if data.get("interaction_schema") is not None:
        errors += _schema_errors(
            data["interaction_schema"], "/interaction_schema", object_only=False
        )
    if not errors:
        errors += _placeholder_errors(str(data.get("code_template") or ""), data["input_schema"])
    if not str(data.get("code_template") or "").strip():
        errors.append(_err("/code_template", "may not be empty", "required"))
    if data.get("language") not in SkillLanguage.values:
        errors.append(_err("/language", "must be python, node or deno"))
    if not 1 <= int(data.get("timeout_seconds") or 0) <= 600:
        errors.append(_err("/timeout_seconds", "must be between 1 and 600"))
    if not 1 <= int(data.get("max_output_size_mb") or 0) <= 100:
        errors.append(_err("/max_output_size_mb", "must be between 1 and 100"))
    errors += _package_errors(data.get("packages", []), data.get("language"))
    errors += _scope_errors(data)
    errors += _source_errors(data)
    errors += _archive_errors(data.get("archive"))
    return errors


def _scope_errors(data: Mapping[str, Any]) -> Errors:
    scope, employees = data.get("tool_scope"), data.get("employees", [])
    if scope not in {s.value for s in ToolScope}:
        return [_err("/tool_scope", "must be custom, general or specified")]
    if not isinstance(employees, list) or not all(isinstance(e, str) for e in employees):
        return [_err("/employees", "must be a list of employee usernames")]
    if scope == ToolScope.SPECIFIED and not employees:
        return [_err("/employees", "a specified skill must name at least one employee")]
    known = set(Employee.objects.filter(username__in=employees).values_list("username", flat=True))
    return [_err(f"/employees/{i}", f"no employee {e!r}", "unknown")
            for i, e in enumerate(employees) if e not in known]  # fmt: skip


def _defaults() -> dict[str, Any]:
    return {
        f.name: f.get_default()
        for f in Skill._meta.concrete_fields
        if f.name in EDITABLE and f.has_default()
    }


def skill_validate(data: Mapping[str, Any]) -> None:
    """Raise InvalidInput listing every problem of a complete skill definition."""
    _raise(_field_errors(data))


@transaction.atomic
def skill_create(
    *, actor: str, tool_name: str, kind: str = "create", reason: str = "",
    source_commit: str = "", **fields: Any,
) -> Skill:  # fmt: skip
    """Create a skill; ``tool_name`` must match ``TOOL_NAME_PATTERN`` and be unused. Its first
    version (``kind``, ``reason``) is recorded with it."""
    unknown = sorted(set(fields) - set(EDITABLE))
    if unknown:
        raise InvalidInput(f"unknown fields: {', '.join(unknown)}")
    if not _TOOL_NAME.match(tool_name or ""):
        _raise([_err("/tool_name", f"must match {TOOL_NAME_PATTERN}")])
    if tool_name in RESERVED_TOOL_NAMES:
        _raise([_err("/tool_name", f"{tool_name!r} is reserved (/api/v1/skills/{tool_name})")])
    data = {**_defaults(), **fields}
    skill_validate(data)
    if Skill.objects.filter(tool_name=tool_name).exists():
        _raise([_err("/tool_name", f"a skill named {tool_name!r} already exists", "unique")])
    skill = Skill.objects.create(
        tool_name=tool_name, created_by=actor, source_commit=source_commit, **data
    )
    version_record(skill, actor=actor, kind=kind, reason=reason)
    return skill


@transaction.atomic
def skill_update(
    *, skill: Skill, actor: str = "", kind: str = "update", reason: str = "",
    source_commit: str | None = None, **fields: Any,
) -> Skill:  # fmt: skip
    """Change a skill's editable fields; ``tool_name`` cannot change (409). The new state is
    recorded as a version (``actor``, ``kind``, ``reason``) in the same transaction."""
    if "tool_name" in fields and fields.pop("tool_name") != skill.tool_name:
        raise Conflict(
            "tool_name is immutable: agents and MCP clients call the skill by it. "
            "Create a new skill instead."
        )
    unknown = sorted(set(fields) - set(EDITABLE))
    if unknown:
        raise InvalidInput(f"unknown fields: {', '.join(unknown)}")
    locked = Skill.objects.select_for_update().get(pk=skill.pk)
    data = {name: getattr(locked, name) for name in EDITABLE}
    if isinstance(data.get("archive"), memoryview):
        data["archive"] = bytes(data["archive"])
    data.update(fields)
    skill_validate(data)
    version_baseline(locked)
    if source_commit is not None:
        fields["source_commit"] = source_commit
    for name, value in fields.items():
        setattr(locked, name, value)
    locked.save(update_fields=[*fields, "updated_at"])
    version_record(locked, actor=actor, kind=kind, reason=reason)
    return locked


def skill_delete(*, skill: Skill) -> None:
    if skill.executions.exists():
        raise Conflict(
            f"Skill {skill.tool_name!r} has executions and cannot be deleted; disable it instead."
        )
    skill.delete()


def skill_get(*, tool_name: str) -> Skill:
    try:
        return Skill.objects.get(tool_name=tool_name)
    except Skill.DoesNotExist:
        raise NotFound(f"No skill named {tool_name!r}.") from None
