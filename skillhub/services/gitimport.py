"""Git import: ``gitListSkills`` / ``gitSyncSkills`` over a repository's ``skills.json``.

The repository is checked out by ``orchestrator.gitcheckout`` (through the outbound guard;
its limits and options are described there). ``skills.json`` lists the skill folders::

    {"skills": [{"path": "skills/word_count"}, {"path": "skills/shout", "enabled": true}]}

Each folder has a ``SKILL.md`` whose YAML front matter describes the skill (camelCase names of
the spec: ``toolName``, ``title``, ``description``, ``language``, ``entry``, ``inputSchema``,
``interactionSchema``, ``packages``, ``timeoutSeconds``, ``maxOutputSizeMb``, ``autoCall``,
``toolScope``, ``employees``, ``enabled``); the Markdown body becomes ``instructions``, the entry
file (default ``main.py`` / ``main.js`` / ``main.ts`` by language) the ``codeTemplate``, and the
folder's other files a zip placed in the sandbox's working directory. Imported skills are
disabled unless the manifest or front matter says ``enabled: true``.

``gitSyncSkills`` first computes the diff against the local skills (create / update with the
changed fields / unchanged / conflict: a local skill of that name that did not come from this
repository is never overwritten) and applies it, in one transaction, only when asked.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import zipfile
from pathlib import Path
from typing import Any

import yaml
from django.db import transaction

from orchestrator.gitcheckout import GitImportError, git_checkout
from skillhub.models import Skill, SkillSource
from skillhub.services.skills import skill_create, skill_update

_FRONT_MATTER = re.compile(r"\A---\s*\n(.*?)\n---\s*(?:\n|\Z)(.*)\Z", re.DOTALL)
#: The entry file of a skill folder whose front matter names none, by language.
_ENTRIES = {"python": "main.py", "node": "main.js", "deno": "main.ts"}
_FIELDS = {
    "title": "title", "description": "description", "language": "language",
    "inputSchema": "input_schema", "interactionSchema": "interaction_schema",
    "packages": "packages", "timeoutSeconds": "timeout_seconds",
    "maxOutputSizeMb": "max_output_size_mb", "autoCall": "auto_call",
    "toolScope": "tool_scope", "employees": "employees", "enabled": "enabled",
}  # fmt: skip
#: Fields compared for the diff (the archive is compared by digest).
_COMPARED = (
    "title", "description", "instructions", "code_template", "language", "input_schema",
    "interaction_schema", "packages", "timeout_seconds", "max_output_size_mb", "auto_call",
    "tool_scope", "employees", "source_path",
)  # fmt: skip


def _front_matter(text: str, where: str) -> tuple[dict[str, Any], str]:
    match = _FRONT_MATTER.match(text)
    if not match:
        raise GitImportError(f"{where}: SKILL.md has no front matter (--- ... ---)")
    try:
        meta = yaml.safe_load(match.group(1)) or {}
    except yaml.YAMLError as exc:
        raise GitImportError(f"{where}: front matter is not valid YAML: {exc}") from exc
    if not isinstance(meta, dict):
        raise GitImportError(f"{where}: front matter must be a mapping")
    return meta, match.group(2).strip()


def _folder_zip(folder: Path, entry: str) -> bytes | None:
    names = sorted(
        p for p in folder.rglob("*")
        if p.is_file() and not p.is_symlink() and p.name not in (entry, "SKILL.md")
    )  # fmt: skip
    if not names:
        return None
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in names:
            info = zipfile.ZipInfo(path.relative_to(folder).as_posix(), (2000, 1, 1, 0, 0, 0))
            zf.writestr(info, path.read_bytes())
    return buffer.getvalue()


def _read_skill(root: Path, entry_spec: dict[str, Any]) -> dict[str, Any]:
    rel = str(entry_spec.get("path") or "")
    folder = (root / rel).resolve()
    if not rel or root.resolve() not in folder.parents or not (folder / "SKILL.md").is_file():
        raise GitImportError(f"skills.json: {rel!r} is not a skill folder with a SKILL.md")
    meta, body = _front_matter((folder / "SKILL.md").read_text(), rel)
    meta = {**meta, **{k: v for k, v in entry_spec.items() if k != "path"}}
    language = meta.get("language", "python")
    entry = str(meta.get("entry") or _ENTRIES.get(str(language), "main.py"))
    entry_path = (folder / entry).resolve()
    if folder not in entry_path.parents or not entry_path.is_file():
        raise GitImportError(f"{rel}: entry file {entry!r} is missing")
    skill: dict[str, Any] = {_FIELDS[k]: v for k, v in meta.items() if k in _FIELDS}
    skill.update(
        tool_name=str(meta.get("toolName") or folder.name),
        instructions=body,
        code_template=entry_path.read_text(),
        source_path=rel,
        archive=_folder_zip(folder, entry),
    )
    skill.setdefault("enabled", False)
    skill.setdefault("language", language)  # the default that chose the entry file, stored
    skill.setdefault("input_schema", {"type": "object", "properties": {}})
    return skill


def _manifest(root: Path) -> list[dict[str, Any]]:
    path = root / "skills.json"
    if not path.is_file():
        raise GitImportError("the repository has no skills.json at its root")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise GitImportError(f"skills.json is not valid JSON: {exc}") from exc
    entries = data.get("skills") if isinstance(data, dict) else data
    if not isinstance(entries, list):
        raise GitImportError('skills.json must be a list or {"skills": [...]}')
    return [e if isinstance(e, dict) else {"path": str(e)} for e in entries]


def _read_repository(repository: str, ref: str) -> tuple[str, list[dict[str, Any]]]:
    with git_checkout(repository, ref) as (root, commit):
        return commit, [_read_skill(root, entry) for entry in _manifest(root)]


def _public(skill: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in skill.items() if k != "archive"}
    out["archive_sha256"] = _digest(skill.get("archive"))
    return out


def _digest(data: Any) -> str | None:
    return hashlib.sha256(bytes(data)).hexdigest() if data else None


def git_list_skills(*, repository: str, ref: str = "HEAD") -> dict[str, Any]:
    """``gitListSkills``: the skills the repository describes at ``ref`` (nothing is written)."""
    commit, skills = _read_repository(repository, ref)
    return {"repository": repository, "commit": commit, "skills": [_public(s) for s in skills]}


def _changes(local: Skill, wanted: dict[str, Any]) -> dict[str, Any]:
    changes = {
        name: {"from": getattr(local, name), "to": wanted[name]}
        for name in _COMPARED
        if name in wanted and getattr(local, name) != wanted[name]
    }
    if _digest(local.archive) != _digest(wanted.get("archive")):
        changes["archive_sha256"] = {
            "from": _digest(local.archive),
            "to": _digest(wanted.get("archive")),
        }
    return changes


def _plan(repository: str, skills: list[dict[str, Any]]) -> dict[str, list[Any]]:
    plan: dict[str, list[Any]] = {"create": [], "update": [], "unchanged": [], "conflict": []}
    for wanted in skills:
        local = Skill.objects.filter(tool_name=wanted["tool_name"]).first()
        if local is None:
            plan["create"].append(wanted)
        elif local.source != SkillSource.GIT or local.source_ref != repository:
            plan["conflict"].append(
                {"tool_name": local.tool_name, "reason": "a local skill of this name exists "
                 f"(source {local.source} {local.source_ref!r}); it is not overwritten"}
            )  # fmt: skip
        elif changes := _changes(local, wanted):
            plan["update"].append({"skill": wanted, "changes": changes})
        else:
            plan["unchanged"].append(wanted["tool_name"])
    return plan


def _apply(plan: dict[str, list[Any]], repository: str, commit: str, actor: str) -> None:
    with transaction.atomic():
        for wanted in plan["create"]:
            fields = {k: v for k, v in wanted.items() if k != "tool_name"}
            skill_create(
                actor=actor, tool_name=wanted["tool_name"], source=SkillSource.GIT,
                source_ref=repository, kind="git-sync", reason=f"git sync {commit}",
                source_commit=commit, **fields,
            )  # fmt: skip
        for item in plan["update"]:
            wanted = item["skill"]
            fields = {k: v for k, v in wanted.items() if k not in ("tool_name", "enabled")}
            skill = Skill.objects.get(tool_name=wanted["tool_name"])
            skill_update(
                skill=skill, actor=actor, kind="git-sync", reason=f"git sync {commit}",
                source_commit=commit, **fields,
            )  # fmt: skip


def _diff_view(plan: dict[str, list[Any]]) -> dict[str, Any]:
    def jsonable(value: Any) -> Any:
        return _digest(value) if isinstance(value, (bytes, memoryview)) else value

    return {
        "create": [_public(s) for s in plan["create"]],
        "update": [
            {
                "tool_name": u["skill"]["tool_name"],
                "changes": {
                    k: {"from": jsonable(v["from"]), "to": jsonable(v["to"])}
                    for k, v in u["changes"].items()
                },
            }
            for u in plan["update"]
        ],
        "unchanged": plan["unchanged"],
        "conflict": plan["conflict"],
    }


def git_sync_skills(
    *, repository: str, ref: str = "HEAD", apply: bool = False, actor: str = "git-sync"
) -> dict[str, Any]:
    """``gitSyncSkills``: the diff between the repository and the local skills; with
    ``apply=True`` also create and update them (one transaction, validated like the API)."""
    commit, skills = _read_repository(repository, ref)
    plan = _plan(repository, skills)
    if apply:
        _apply(plan, repository, commit, actor)
    return {"repository": repository, "commit": commit, "applied": apply, **_diff_view(plan)}
