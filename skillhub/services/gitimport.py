"""Git import: ``gitListSkills`` / ``gitSyncSkills`` over a repository's ``skills.json``.

The repository (an ``https://`` URL; the schemes and hosts are settings) is cloned with the
``git`` command into a temporary directory at ``ref``, through the outbound guard
(docs/security.md): the host's addresses are checked and pinned (``http.curloptResolve``), no
redirects, no other protocol, no credential helper, no user or system git configuration,
symlinks checked out as plain files, at most ``GIT_MAX_BYTES`` on disk and
``GIT_TIMEOUT_SECONDS`` in all. ``skills.json`` lists the skill folders::

    {"skills": [{"path": "skills/word_count"}, {"path": "skills/shout", "enabled": true}]}

Each folder has a ``SKILL.md`` whose YAML front matter describes the skill (camelCase names of
the spec: ``toolName``, ``title``, ``description``, ``language``, ``entry``, ``inputSchema``,
``interactionSchema``, ``packages``, ``timeoutSeconds``, ``maxOutputSizeMb``, ``autoCall``,
``toolScope``, ``employees``, ``enabled``); the Markdown body becomes ``instructions``, the entry
file (default ``main.py`` / ``main.js``) the ``codeTemplate``, and the folder's other files a
zip placed in the sandbox's working directory. Imported skills are disabled unless the
manifest or front matter says ``enabled: true``.

``gitSyncSkills`` first computes the diff against the local skills (create / update with the
changed fields / unchanged / conflict: a local skill of that name that did not come from this
repository is never overwritten) and applies it, in one transaction, only when asked.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import subprocess
import tempfile
import time
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from django.conf import settings
from django.db import transaction

from orchestrator import guard
from orchestrator.errors import InvalidInput
from runtime import outbound
from skillhub.models import Skill, SkillSource
from skillhub.services.skills import skill_create, skill_update

GIT_TIMEOUT_SECONDS = 120
#: Largest checkout (repository and working tree) a Git import may write.
GIT_MAX_BYTES = 256 * 1024 * 1024
#: A transfer slower than this many bytes/s for ``GIT_LOW_SPEED_SECONDS`` is aborted.
GIT_LOW_SPEED_BYTES, GIT_LOW_SPEED_SECONDS = 1000, 30
#: What a repository URL may look like: no userinfo, query or fragment; ASCII only, so that
#: git's URL parser (curl's) sees the host the guard checked and pinned.
_GIT_URL = re.compile(r"^(?P<scheme>[a-z]+)://(?P<authority>[A-Za-z0-9.\-]+|\[[0-9A-Fa-f:.]+\])"
                      r"(?::[0-9]{1,5})?(?:/[A-Za-z0-9._~!$&'()*+,;=:%/-]*)?$")  # fmt: skip
_FRONT_MATTER = re.compile(r"\A---\s*\n(.*?)\n---\s*(?:\n|\Z)(.*)\Z", re.DOTALL)
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


class GitImportError(InvalidInput):
    problem_type = "git-import-error"
    title = "Git import failed"


def _refused(detail: str) -> GitImportError:
    return GitImportError(
        detail, errors=[{"pointer": "/repository", "detail": detail, "code": "refused"}]
    )


@dataclass(frozen=True)
class _Remote:
    """A repository URL that passed the guard: git's options pin it to the checked addresses."""

    scheme: str
    options: tuple[str, ...]


def _check_repository(repository: str) -> _Remote:
    """The guard's verdict on ``repository``: allowed scheme (``LOOPWRIGHT_GIT_SCHEMES``) and
    host (``LOOPWRIGHT_GIT_HOSTS``), a canonical URL, and addresses the outbound policy allows."""
    policy = guard.git_policy()
    schemes = " or ".join(f"{s}://" for s in sorted(policy.schemes))
    match = _GIT_URL.match(repository)
    if match is None or match["scheme"] not in policy.schemes:
        raise _refused(
            f"the repository must be a plain {schemes} URL (LOOPWRIGHT_GIT_SCHEMES; no local "
            f"paths, file://, ssh, git:// or ext:: transports, no user@, query or fragment): "
            f"{repository[:200]!r} is not"
        )
    try:
        target = outbound.check_url(repository, policy)
        if target.host != match["authority"].lower().strip("[]") and target.literal is None:
            raise _refused(f"write the host in canonical form ({target.host})")
        hosts = settings.LOOPWRIGHT_OUTBOUND["GIT_HOSTS"]
        if hosts and not outbound.host_listed(target.host, hosts):
            raise _refused(f"{target.host} is not one of the hosts LOOPWRIGHT_GIT_HOSTS allows")
        addresses = outbound.resolve_checked(target.host, target.port, policy)
    except outbound.OutboundRefused as exc:
        raise _refused(f"repository refused: {exc}") from None
    except OSError as exc:
        raise GitImportError(f"cannot resolve {match['authority']}: {exc}") from None
    pinned = ",".join(f"[{a}]" if ":" in a else a for a in addresses)
    options = (
        "-c", f"protocol.{target.scheme}.allow=always",
        "-c", f"http.curloptResolve={target.host}:{target.port}:{pinned}",
    )  # fmt: skip
    return _Remote(target.scheme, options if target.literal is None else options[:2])


#: Every git command: no protocol but the one allowed per clone, no redirects, no credential
#: helpers or prompts, symlinks as plain files (a link to /etc/... stays a text file).
_GIT_OPTIONS = (
    "-c", "protocol.allow=never", "-c", "http.followRedirects=false", "-c", "credential.helper=",
    "-c", "core.symlinks=false", "-c", "core.hooksPath=/dev/null", "-c", "init.templateDir=",
    "-c", "submodule.recurse=false", "-c", f"http.lowSpeedLimit={GIT_LOW_SPEED_BYTES}",
    "-c", f"http.lowSpeedTime={GIT_LOW_SPEED_SECONDS}",
)  # fmt: skip


def _git_env(home: str, scheme: str) -> dict[str, str]:
    """A minimal environment: none of the server's variables (or proxies), no user config."""
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": home, "XDG_CONFIG_HOME": home,
        "LANG": "C", "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_TERMINAL_PROMPT": "0", "GIT_ASKPASS": "/bin/false", "SSH_ASKPASS": "/bin/false",
        "GIT_ALLOW_PROTOCOL": scheme,
    }  # fmt: skip


def _tree_size(root: str) -> int:
    total = 0
    for folder, _, files in os.walk(root):
        for name in files:
            with suppress(OSError):  # removed meanwhile
                total += os.lstat(os.path.join(folder, name)).st_size
    return total


def _git(*args: str, cwd: str | None = None, env: dict[str, str], watch: str) -> str:
    """Run git; kill it past ``GIT_TIMEOUT_SECONDS`` or when ``watch`` outgrows the cap."""
    command = ["git", *_GIT_OPTIONS, *args]
    name = next(a for a in args if not a.startswith("-") and "=" not in a)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        try:
            process = subprocess.Popen(command, cwd=cwd, env=env, stdout=out, stderr=err)
        except OSError as exc:
            raise GitImportError(f"git {name} failed: {exc}") from exc
        problem = _wait(process, watch)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(errors="replace"), err.read().decode(errors="replace")
    if problem:
        raise GitImportError(f"git {name} stopped: {problem}")
    if process.returncode != 0:
        raise GitImportError(f"git {name} failed: {stderr.strip()[-500:]}")
    return stdout.strip()


def _wait(process: subprocess.Popen[bytes], watch: str) -> str:
    deadline = time.monotonic() + GIT_TIMEOUT_SECONDS
    while True:
        try:
            process.wait(timeout=0.2)
            return ""
        except subprocess.TimeoutExpired:
            pass
        problem = ""
        if time.monotonic() > deadline:
            problem = f"it took longer than {GIT_TIMEOUT_SECONDS} s"
        elif _tree_size(watch) > GIT_MAX_BYTES:
            problem = f"the repository is larger than {GIT_MAX_BYTES // 2**20} MiB"
        if problem:
            process.kill()
            process.wait()
            return problem


@contextmanager
def _checkout(repository: str, ref: str) -> Iterator[tuple[Path, str]]:
    remote = _check_repository(repository)
    if ref.startswith("-"):
        raise GitImportError(f"not a ref: {ref!r}")
    with tempfile.TemporaryDirectory(prefix="loopwright-git-") as tmp:
        target = str(Path(tmp) / "repo")
        env = _git_env(tmp, remote.scheme)
        clone = ("clone", "--quiet", "--no-checkout", "--", repository, target)
        _git(*remote.options, *clone, env=env, watch=tmp)
        _git("checkout", "--quiet", "--detach", ref, "--", cwd=target, env=env, watch=tmp)
        commit = _git("rev-parse", "HEAD", cwd=target, env=env, watch=tmp)
        yield Path(target), commit


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
    entry = str(meta.get("entry") or ("main.js" if language == "node" else "main.py"))
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
    with _checkout(repository, ref) as (root, commit):
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
            skill = skill_create(
                actor=actor, tool_name=wanted["tool_name"], source=SkillSource.GIT,
                source_ref=repository, **fields,
            )  # fmt: skip
            Skill.objects.filter(pk=skill.pk).update(source_commit=commit)
        for item in plan["update"]:
            wanted = item["skill"]
            fields = {k: v for k, v in wanted.items() if k not in ("tool_name", "enabled")}
            skill = Skill.objects.get(tool_name=wanted["tool_name"])
            skill_update(skill=skill, **fields)
            Skill.objects.filter(pk=skill.pk).update(source_commit=commit)


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
