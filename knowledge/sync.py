"""Syncing a base from a tree of files: a server folder under ``LOOPWRIGHT_KNOWLEDGE_ROOT``, or a
path of a Git repository (checked out through the outbound guard, ``orchestrator.gitcheckout``).

Every supported, non-hidden file under the tree becomes a document named by its path within
the tree, with the tree as its ``source`` (``folder:<folder>`` or ``git:<repository>#<path>``);
documents an earlier sync of the same tree made whose files are gone are deleted. A file that
resolves outside the tree's root (a link) is skipped and reported; at most ``MAX_SYNC_FILES``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from django.conf import settings

from knowledge.ingest import SUPPORTED
from knowledge.models import KnowledgeBase, KnowledgeDocument
from knowledge.services import DocumentTooLarge, document_delete, document_put, max_document_bytes
from orchestrator.errors import DomainError, InvalidInput
from orchestrator.gitcheckout import GitImportError, git_checkout

#: Most files one sync reads.
MAX_SYNC_FILES = 5000
_SYNCED_SUFFIXES = frozenset(suffix for suffixes in SUPPORTED.values() for suffix in suffixes)


@dataclass
class FolderSynced:
    folder: str
    added: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: int = 0
    removed: list[str] = field(default_factory=list)
    #: ``{name, detail}`` of files that could not be stored.
    refused: list[dict[str, str]] = field(default_factory=list)
    embedding_errors: int = 0
    #: The commit a Git sync read ("" for a folder).
    commit: str = ""


def knowledge_root() -> Path:
    """The folder server-side syncs read under (``LOOPWRIGHT_KNOWLEDGE_ROOT``)."""
    configured = getattr(settings, "LOOPWRIGHT_KNOWLEDGE_ROOT", "") or ""
    return Path(configured) if configured else Path(settings.VAR_DIR) / "knowledge"


def _outside(pointer: str, detail: str, code: str) -> InvalidInput:
    return InvalidInput(detail, errors=[{"pointer": pointer, "detail": detail, "code": code}])


def folder_sync(*, base: KnowledgeBase, path: str) -> FolderSynced:
    """Sync ``path`` (a folder under the knowledge root, relative to it or absolute)."""
    root = knowledge_root().resolve()
    folder = (root / path).resolve()
    if not folder.is_relative_to(root):
        raise _outside(
            "/path", f"{path} is outside the knowledge root (LOOPWRIGHT_KNOWLEDGE_ROOT, {root}).",
            "outside_root",
        )  # fmt: skip
    if not folder.is_dir():
        raise _outside("/path", f"{path} is not a folder under the knowledge root.", "not_a_folder")
    relative = folder.relative_to(root).as_posix()
    report = FolderSynced(folder=relative)
    _sync_tree(base, folder, root, f"folder:{relative}", report, "the knowledge root")
    return report


def git_sync(
    *, base: KnowledgeBase, repository: str, ref: str = "HEAD", path: str = ""
) -> FolderSynced:
    """Sync ``path`` (a folder of the repository, "" for all of it) at ``ref``."""
    inner = PurePosixPath(path.strip("/") or ".")
    if inner.is_absolute() or ".." in inner.parts:
        raise _outside("/path", f"{path} is not a folder of the repository.", "outside_repository")
    with git_checkout(repository, ref) as (checkout, commit):
        root = checkout.resolve()
        folder = (root / inner).resolve()
        if not folder.is_relative_to(root) or not folder.is_dir():
            raise GitImportError(
                f"{path} is not a folder of {repository} at {ref}.",
                errors=[{"pointer": "/path", "detail": "Not a folder.", "code": "not_a_folder"}],
            )
        shown = inner.as_posix()
        report = FolderSynced(folder=shown, commit=commit)
        source = f"git:{repository}#{'' if shown == '.' else shown}"
        _sync_tree(base, folder, root, source, report, "the repository")
    return report


def _sync_tree(
    base: KnowledgeBase, folder: Path, root: Path, source: str, report: FolderSynced, where: str
) -> None:
    seen: set[str] = set()
    for file in _tree_files(folder, root, report, where):
        name = file.relative_to(folder).as_posix()
        seen.add(name)
        try:
            if file.stat().st_size > max_document_bytes():
                raise DocumentTooLarge(name, max_document_bytes())
            existed = KnowledgeDocument.objects.filter(base=base, name=name).exists()
            stored = document_put(base=base, name=name, raw=file.read_bytes(), source=source)
        except (DomainError, OSError) as exc:
            report.refused.append({"name": name, "detail": getattr(exc, "detail", str(exc))})
            continue
        if not stored.changed:
            report.unchanged += 1
        else:
            (report.updated if existed else report.added).append(name)
        report.embedding_errors += bool(stored.embedding_error)
    for document in KnowledgeDocument.objects.filter(base=base, source=source).exclude(
        name__in=seen
    ):
        report.removed.append(document.name)
        document_delete(document)


def _tree_files(folder: Path, root: Path, report: FolderSynced, where: str) -> list[Path]:
    """The supported, non-hidden regular files under ``folder`` that resolve inside ``root``,
    sorted, at most ``MAX_SYNC_FILES``."""
    found: list[Path] = []
    for file in sorted(folder.rglob("*")):
        parts = file.relative_to(folder).parts
        if any(part.startswith(".") for part in parts) or not file.is_file():
            continue
        if file.suffix.lower() not in _SYNCED_SUFFIXES:
            continue
        if not file.resolve().is_relative_to(root):
            report.refused.append({"name": file.relative_to(folder).as_posix(),
                                   "detail": f"a link out of {where}"})  # fmt: skip
            continue
        if len(found) >= MAX_SYNC_FILES:
            report.refused.append({"name": "...", "detail": f"more than {MAX_SYNC_FILES} files"})
            break
        found.append(file)
    return found
