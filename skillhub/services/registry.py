"""Registry install: skill packages listed by an HTTP(S) index (docs/skills.md, "Registry").

The index is JSON ``{"skills": [{"name", "version", "url", "sha256"}]}``; each package is a zip
laid out like a Git import folder (``SKILL.md`` front matter, the entry file, other files; at
the zip's root or in one top folder), parsed by ``skillhub.services.gitimport``. Every download
goes through the outbound guard. An install downloads and checks every named package first
(sha256 of the zip as the index lists it, the definition validated like the API) and only then
writes, in one transaction: any refusal changes nothing. An install or an update leaves the
skill **disabled** until a person enables it, and is recorded as a version (so a rollback
restores the state before it).
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import tempfile
import zipfile
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urljoin

import httpx2
from django.db import transaction

from orchestrator.errors import InvalidInput
from orchestrator.gitcheckout import GitImportError
from runtime import outbound, outbound_http
from runtime.outbound import OutboundRefused, ResponseTooLarge
from skillhub.models import TOOL_NAME_PATTERN, Skill, SkillSource
from skillhub.services.gitimport import _read_skill
from skillhub.services.skills import (
    ARCHIVE_MAX_BYTES,
    ARCHIVE_MAX_UNPACKED,
    EDITABLE,
    skill_create,
    skill_update,
)

INDEX_MAX_BYTES = 1024 * 1024
MAX_PACKAGES = 500
MAX_INSTALL = 50
MAX_ZIP_FILES = 1000
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_NAME = re.compile(TOOL_NAME_PATTERN)
_VERSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,63}$")


class RegistryError(InvalidInput):
    problem_type = "registry-error"
    title = "Registry install failed"


def _get(url: str, what: str, limit: int) -> bytes:
    """``url``'s body through the outbound guard (no redirects), at most ``limit`` bytes."""
    try:
        policy, http = outbound_http.shared_client()
        outbound.check_url(url, policy)
        response = http.get(url)
        if response.status_code != 200:
            raise RegistryError(f"{what}: {url} answered HTTP {response.status_code}")
        body = response.content
    except OutboundRefused as exc:
        raise RegistryError(f"{what}: refused by the outbound guard: {exc}") from None
    except ResponseTooLarge as exc:
        raise RegistryError(f"{what}: {exc}") from None
    except httpx2.HTTPError as exc:
        raise RegistryError(f"{what}: {type(exc).__name__}: {exc}"[:500]) from None
    if len(body) > limit:
        raise RegistryError(f"{what}: larger than {limit} bytes")
    return body


def _entry(index_url: str, position: int, item: Any) -> dict[str, str]:
    where = f"index skills[{position}]"
    if not isinstance(item, dict):
        raise RegistryError(f"{where} is not an object")
    name, version, url, sha = (item.get(k) for k in ("name", "version", "url", "sha256"))
    if not isinstance(name, str) or not _NAME.match(name):
        raise RegistryError(f"{where}.name must match {TOOL_NAME_PATTERN}")
    if not isinstance(version, str) or not _VERSION.match(version):
        raise RegistryError(f"{where}.version must be a short version string")
    if not isinstance(url, str) or not url or len(url) > 2000:
        raise RegistryError(f"{where}.url must be the package's URL")
    if not isinstance(sha, str) or not _SHA256.match(sha.lower()):
        raise RegistryError(f"{where}.sha256 must be 64 hex digits")
    return {"name": name, "version": version, "url": urljoin(index_url, url), "sha256": sha.lower()}


def registry_index(index_url: str) -> list[dict[str, str]]:
    """The index's packages (checked; a name listed twice is refused)."""
    try:
        data = json.loads(_get(index_url, "index", INDEX_MAX_BYTES))
    except ValueError:
        raise RegistryError("index: not JSON") from None
    items = data.get("skills") if isinstance(data, dict) else None
    if not isinstance(items, list) or len(items) > MAX_PACKAGES:
        raise RegistryError(f'index: expected {{"skills": [...]}} of at most {MAX_PACKAGES}')
    entries = [_entry(index_url, i, item) for i, item in enumerate(items)]
    names = [e["name"] for e in entries]
    if len(set(names)) != len(names):
        raise RegistryError("index: a name is listed twice")
    return entries


def _installed(entry: dict[str, str], index_url: str) -> dict[str, Any]:
    local = Skill.objects.filter(tool_name=entry["name"]).first()
    if local is None:
        return {"installed": None, "status": "new"}
    installed = {"source": local.source, "source_ref": local.source_ref,
                 "version": local.source_path.partition("@")[2] or None,
                 "sha256": local.source_commit or None, "enabled": local.enabled}  # fmt: skip
    if local.source != SkillSource.REGISTRY or local.source_ref != index_url:
        return {"installed": installed, "status": "conflict"}
    same = local.source_commit == entry["sha256"]
    return {"installed": installed, "status": "unchanged" if same else "update"}


def registry_list(*, index_url: str) -> dict[str, Any]:
    """The index, each package with the installed skill of its name and what an install would
    do: ``new``, ``update``, ``unchanged`` or ``conflict`` (a skill not from this index)."""
    entries = registry_index(index_url)
    return {"index_url": index_url,
            "skills": [{**e, **_installed(e, index_url)} for e in entries]}  # fmt: skip


def _unpack(data: bytes, root: Path, name: str) -> None:
    """The zip into ``root/name``: safe relative paths only, within the archive limits; a
    single top folder holding ``SKILL.md`` is stripped."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            infos = [i for i in zf.infolist() if not i.is_dir()]
            if len(infos) > MAX_ZIP_FILES or sum(i.file_size for i in infos) > ARCHIVE_MAX_UNPACKED:
                raise RegistryError(f"package {name}: too many or too large files")
            paths = [PurePosixPath(i.filename) for i in infos]
            if any(p.is_absolute() or ".." in p.parts or "\\" in str(p) for p in paths):
                raise RegistryError(f"package {name}: holds unsafe paths")
            tops = {p.parts[0] for p in paths if len(p.parts) > 1}
            strip = len(tops) == 1 and all(len(p.parts) > 1 for p in paths)
            for info, path in zip(infos, paths, strict=True):
                parts = path.parts[1:] if strip else path.parts
                target = root.joinpath(name, *parts)
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(zf.read(info))
    except (zipfile.BadZipFile, ValueError, OSError) as exc:
        raise RegistryError(f"package {name}: not a readable zip ({exc})") from None


def _package(entry: dict[str, str]) -> dict[str, Any]:
    """The package's skill definition: downloaded, checksum verified, parsed."""
    name = entry["name"]
    data = _get(entry["url"], f"package {name}", ARCHIVE_MAX_BYTES)
    digest = hashlib.sha256(data).hexdigest()
    if digest != entry["sha256"]:
        raise RegistryError(
            f"package {name}: sha256 mismatch (the index lists {entry['sha256']}, the download "
            f"is {digest}); nothing was installed"
        )
    with tempfile.TemporaryDirectory(prefix="lw-registry-") as tmp:
        _unpack(data, Path(tmp), name)
        try:
            skill = _read_skill(Path(tmp), {"path": name})
        except GitImportError as exc:
            raise RegistryError(f"package {exc.detail}") from None
    if skill["tool_name"] != name:
        raise RegistryError(f"package {name}: its SKILL.md names {skill['tool_name']!r}")
    fields: dict[str, Any] = {
        f.name: f.get_default()
        for f in Skill._meta.concrete_fields
        if f.name in EDITABLE and f.name != "source"
    }
    fields.update({k: v for k, v in skill.items() if k in EDITABLE})
    fields.update(source_path=f"{name}@{entry['version']}", enabled=False)
    fields["language"] = fields["language"] or "python"
    fields["title"] = fields["title"] or name
    return fields


def registry_install(*, index_url: str, names: list[str], actor: str) -> dict[str, Any]:
    """Install or update the named packages (all or nothing), each disabled and versioned;
    a skill of the name not installed from this index is refused, an unchanged one skipped."""
    if not names or len(names) > MAX_INSTALL or len(set(names)) != len(names):
        raise RegistryError(f"names: 1 to {MAX_INSTALL} distinct names")
    listed = {e["name"]: e for e in registry_index(index_url)}
    plan: list[tuple[dict[str, str], str]] = []
    for i, name in enumerate(names):
        if name not in listed:
            raise RegistryError(f"names[{i}]: {name!r} is not in the index")
        status = _installed(listed[name], index_url)["status"]
        if status == "conflict":
            raise RegistryError(f"names[{i}]: a skill {name!r} exists that is not from this index")
        plan.append((listed[name], status))
    packages = {e["name"]: _package(e) for e, status in plan if status != "unchanged"}
    done: dict[str, list[str]] = {"installed": [], "updated": [], "unchanged": []}
    with transaction.atomic():
        for entry, status in plan:
            name, reason = entry["name"], f"registry {entry['name']} {entry['version']}"
            if status == "unchanged":
                done["unchanged"].append(name)
                continue
            common = {**packages[name], "actor": actor, "kind": "registry", "reason": reason,
                      "source_commit": entry["sha256"], "source": SkillSource.REGISTRY,
                      "source_ref": index_url}  # fmt: skip
            if status == "new":
                skill_create(tool_name=name, **common)
                done["installed"].append(name)
            else:
                skill_update(skill=Skill.objects.get(tool_name=name), **common)
                done["updated"].append(name)
    return {"index_url": index_url, **done}
