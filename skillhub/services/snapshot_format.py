"""The Skill Hub snapshot file: writing it, and reading it back only when every check passes
(docs/skills.md, Snapshots).

A snapshot is a zip holding ``manifest.json``, ``manifest.json.sha256`` (``<hex>  manifest.json``,
as ``sha256sum`` writes it) and, per skill with files, ``skills/<tool_name>/archive.zip``: the
skill's own zip, byte for byte. The manifest names each archive's size and SHA-256 and each file
inside it (name, size, SHA-256). :func:`snapshot_read` checks sizes from the zip directories
before reading anything, then every checksum, and returns nothing unless all of them match.
"""

from __future__ import annotations

import hashlib
import io
import json
import lzma
import stat
import zipfile
import zlib
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from orchestrator.errors import InvalidInput
from orchestrator.jsonlimits import JsonRefused, loads_bounded
from skillhub.services.skills import ARCHIVE_MAX_BYTES, ARCHIVE_MAX_UNPACKED

FORMAT = "loopwright-skills-snapshot"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
MANIFEST_SUM = "manifest.json.sha256"
#: Largest snapshot file, total of its unpacked entries, entries, and manifest.
SNAPSHOT_MAX_BYTES = 256 * 1024 * 1024
SNAPSHOT_MAX_UNPACKED = 512 * 1024 * 1024
SNAPSHOT_MAX_ENTRIES = 5000
MANIFEST_MAX_BYTES = 16 * 1024 * 1024
#: What reading a damaged or unsupported zip raises (CRC, truncation, inflate errors, unknown
#: compression methods, encrypted entries).
_ZIP_ERRORS = (
    zipfile.BadZipFile, EOFError, zlib.error, lzma.LZMAError, OSError, ValueError,
    NotImplementedError, RuntimeError,
)  # fmt: skip
_MANIFEST_KEYS = {"format", "format_version", "created_at", "loopwright_version", "skills"}


@dataclass(frozen=True)
class Snapshot:
    """A verified snapshot: its manifest, the manifest's SHA-256 and its skills."""

    manifest: dict[str, Any]
    manifest_sha256: str
    skills: list[SnapshotSkill]


@dataclass(frozen=True)
class SnapshotSkill:
    """One skill of a verified snapshot: its manifest entry and its archive bytes (or None)."""

    entry: dict[str, Any]
    archive: bytes | None


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def archive_path(tool_name: str) -> str:
    return f"skills/{tool_name}/archive.zip"


def refuse(pointer: str, detail: str, code: str = "invalid_snapshot") -> InvalidInput:
    """The 400 of a snapshot that fails a check; ``pointer`` names the place in the manifest
    (or the zip entry)."""
    return InvalidInput(detail, errors=[{"pointer": pointer, "detail": detail, "code": code}])


def archive_files(archive: bytes, pointer: str) -> list[dict[str, Any]]:
    """Name, size and SHA-256 of each file of a skill's zip, sizes checked before reading."""
    try:
        with zipfile.ZipFile(io.BytesIO(archive)) as zf:
            infos = [i for i in zf.infolist() if not i.is_dir()]
            if sum(i.file_size for i in infos) > ARCHIVE_MAX_UNPACKED:
                raise refuse(pointer, f"unpacks to more than {ARCHIVE_MAX_UNPACKED} bytes")
            return [
                {"name": i.filename, "size": i.file_size, "sha256": sha256(_read(zf, i, pointer))}
                for i in infos
            ]
    except _ZIP_ERRORS as exc:
        raise refuse(pointer, f"is not a readable zip file ({exc})") from None


def _read(zf: zipfile.ZipFile, info: zipfile.ZipInfo, pointer: str) -> bytes:
    with zf.open(info) as handle:
        data = handle.read(info.file_size + 1)
    if len(data) != info.file_size:
        raise refuse(pointer, f"entry {info.filename!r} does not hold its declared size")
    return data


def snapshot_write(manifest: dict[str, Any], archives: dict[str, bytes]) -> tuple[bytes, str]:
    """The snapshot zip of ``manifest`` and the archives (by entry path), and the manifest's
    SHA-256."""
    text = json.dumps(manifest, indent=2, ensure_ascii=False).encode("utf-8")
    digest = sha256(text)
    stamp = datetime.now(UTC).timetuple()[:6]
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as zf:
        for name, data, method in [
            (MANIFEST, text, zipfile.ZIP_DEFLATED),
            (MANIFEST_SUM, f"{digest}  {MANIFEST}\n".encode(), zipfile.ZIP_STORED),
            *((path, data, zipfile.ZIP_STORED) for path, data in sorted(archives.items())),
        ]:
            info = zipfile.ZipInfo(name, date_time=stamp)
            info.compress_type = method
            info.external_attr = (stat.S_IFREG | 0o644) << 16
            zf.writestr(info, data)
    return out.getvalue(), digest


def snapshot_read(data: bytes) -> Snapshot:
    """The verified manifest and skills of a snapshot, or :class:`InvalidInput` naming the first
    failed check: size, entry names, the manifest's checksum, its format, each archive's and
    each file's checksum. Nothing is returned, or written, unless every check passes."""
    if len(data) > SNAPSHOT_MAX_BYTES:
        raise refuse("/", f"the snapshot is larger than {SNAPSHOT_MAX_BYTES} bytes", "too_large")
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            infos = _checked_entries(zf)
            manifest, digest = _manifest(zf, infos)
            skills = [_skill(zf, infos, entry, i) for i, entry in enumerate(manifest["skills"])]
    except _ZIP_ERRORS as exc:
        raise refuse("/", f"the snapshot is not a readable zip file ({exc})") from None
    expected = {MANIFEST, MANIFEST_SUM} | {
        archive_path(s.entry["tool_name"]) for s in skills if s.archive is not None
    }
    extra = sorted(set(infos) - expected)
    if extra:
        raise refuse(f"/{extra[0]}", f"unexpected entries in the snapshot: {', '.join(extra[:5])}")
    return Snapshot(manifest=manifest, manifest_sha256=digest, skills=skills)


def _checked_entries(zf: zipfile.ZipFile) -> dict[str, zipfile.ZipInfo]:
    """Entries by name, refused before anything is read: too many, too large unpacked,
    duplicated, absolute or ``..`` paths, symlinks and other non-regular files."""
    infos = zf.infolist()
    if len(infos) > SNAPSHOT_MAX_ENTRIES:
        raise refuse("/", f"the snapshot has more than {SNAPSHOT_MAX_ENTRIES} entries")
    if sum(i.file_size for i in infos) > SNAPSHOT_MAX_UNPACKED:
        raise refuse("/", f"the snapshot unpacks to more than {SNAPSHOT_MAX_UNPACKED} bytes")
    entries: dict[str, zipfile.ZipInfo] = {}
    for info in infos:
        name, kind = info.filename, stat.S_IFMT(info.external_attr >> 16)
        if name.startswith("/") or ".." in name.split("/") or "\\" in name or name in entries:
            raise refuse(f"/{name}", f"unsafe or repeated entry name {name!r}")
        if info.is_dir() or kind not in (0, stat.S_IFREG):  # 0: written without a type
            raise refuse(f"/{name}", f"entry {name!r} is not a regular file (symlink or folder)")
        entries[name] = info
    return entries


def _member(zf: zipfile.ZipFile, infos: dict[str, zipfile.ZipInfo], name: str, cap: int) -> bytes:
    info = infos.get(name)
    if info is None:
        raise refuse(f"/{name}", f"the snapshot has no {name}", "missing")
    if info.file_size > cap:
        raise refuse(f"/{name}", f"{name} is larger than {cap} bytes", "too_large")
    return _read(zf, info, f"/{name}")


def _manifest(zf: zipfile.ZipFile, infos: dict[str, zipfile.ZipInfo]) -> tuple[dict[str, Any], str]:
    text = _member(zf, infos, MANIFEST, MANIFEST_MAX_BYTES)
    wanted = _member(zf, infos, MANIFEST_SUM, 1024).decode("ascii", "replace").split()
    if not wanted or wanted[0] != sha256(text):
        raise refuse(f"/{MANIFEST_SUM}", "manifest.json does not match its SHA-256", "checksum")
    try:
        manifest = loads_bounded(text.decode("utf-8"))
    except (JsonRefused, UnicodeDecodeError, ValueError) as exc:
        raise refuse(f"/{MANIFEST}", f"manifest.json is not valid JSON ({exc})") from None
    return _manifest_checked(manifest), wanted[0]


def _manifest_checked(manifest: Any) -> dict[str, Any]:
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise refuse("/format", f"manifest.json is not a {FORMAT} manifest")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise refuse(
            "/format_version",
            f"unknown format version {manifest.get('format_version')!r} "
            f"(this instance reads {FORMAT_VERSION})",
            "unsupported",
        )
    unknown = sorted(set(manifest) - _MANIFEST_KEYS)
    if unknown:
        raise refuse(f"/{unknown[0]}", f"unknown manifest keys: {', '.join(unknown)}")
    skills = manifest.get("skills")
    if not isinstance(skills, list) or not all(isinstance(s, dict) for s in skills):
        raise refuse("/skills", "skills must be a list of objects")
    names = [s.get("tool_name") for s in skills]
    if not all(isinstance(n, str) and n for n in names):
        raise refuse("/skills", "every skill needs a tool_name")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise refuse("/skills", f"skills named more than once: {', '.join(repeated)}")
    return manifest


def _skill(
    zf: zipfile.ZipFile, infos: dict[str, zipfile.ZipInfo], entry: dict[str, Any], index: int
) -> SnapshotSkill:
    where = f"/skills/{index}/archive"
    meta = entry.get("archive")
    if meta is None:
        return SnapshotSkill(entry=entry, archive=None)
    if not isinstance(meta, dict) or set(meta) != {"path", "size", "sha256", "files"}:
        raise refuse(where, "archive must be null or {path, size, sha256, files}")
    if meta["path"] != archive_path(entry["tool_name"]):
        raise refuse(f"{where}/path", f"must be {archive_path(entry['tool_name'])!r}")
    data = _member(zf, infos, meta["path"], ARCHIVE_MAX_BYTES)
    if len(data) != meta["size"] or sha256(data) != meta["sha256"]:
        raise refuse(where, f"{meta['path']} does not match its size and SHA-256", "checksum")
    if archive_files(data, where) != meta["files"]:
        raise refuse(
            f"{where}/files", f"the files of {meta['path']} do not match the manifest", "checksum"
        )
    return SnapshotSkill(entry=entry, archive=data)
