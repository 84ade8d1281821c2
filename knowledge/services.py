"""Documents of a knowledge base: storing one (extract, chunk, embed, replace its chunks in one
transaction), deleting one, and syncing a server folder under ``LOOPWRIGHT_KNOWLEDGE_ROOT``.

A document is identified by its name within its base; storing the same bytes again changes
nothing (``sha256``). Vectors are made before the transaction; when the embedding endpoint
fails the chunks are stored without them (full text still finds them) and the failure is
returned, for ``knowledge_reembed`` to fill in later. Every change bumps the base's
``revision``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F
from rest_framework import status

from knowledge import vectors
from knowledge.embeddings import EmbeddingFailed, embed_passages
from knowledge.ingest import SUPPORTED, chunk_text, extract
from knowledge.models import (
    MAX_DOCUMENT_NAME,
    KnowledgeBase,
    KnowledgeChunk,
    KnowledgeDocument,
)
from knowledge.services_bases import knowledge_access_grant as knowledge_access_grant
from knowledge.services_bases import knowledge_access_revoke as knowledge_access_revoke
from knowledge.services_bases import knowledge_base_create as knowledge_base_create
from knowledge.services_bases import knowledge_base_test_search as knowledge_base_test_search
from orchestrator.errors import Conflict, DomainError, InvalidInput, NotFound

logger = logging.getLogger(__name__)
DEFAULT_MAX_DOCUMENT_BYTES = 20 * 1024 * 1024
#: Most files one folder sync reads.
MAX_SYNC_FILES = 5000
_SYNCED_SUFFIXES = frozenset(suffix for suffixes in SUPPORTED.values() for suffix in suffixes)


class DocumentTooLarge(DomainError):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    problem_type = "payload-too-large"
    title = "Document too large"

    def __init__(self, name: str, limit: int) -> None:
        super().__init__(
            f"{name}: the document is larger than {limit} bytes, the limit "
            "(LOOPWRIGHT_KNOWLEDGE_MAX_DOCUMENT_BYTES).",
            limit_bytes=limit,
        )


@dataclass(frozen=True)
class DocumentStored:
    document: KnowledgeDocument
    #: False when the same bytes were stored already (nothing was done).
    changed: bool
    chunks: int
    #: Why the chunks have no vectors ("" when they have, or the base has no embeddings).
    embedding_error: str = ""


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


def max_document_bytes() -> int:
    return int(
        getattr(settings, "LOOPWRIGHT_KNOWLEDGE_MAX_DOCUMENT_BYTES", 0)
        or DEFAULT_MAX_DOCUMENT_BYTES
    )


def knowledge_root() -> Path:
    """The folder server-side syncs read under (``LOOPWRIGHT_KNOWLEDGE_ROOT``)."""
    configured = getattr(settings, "LOOPWRIGHT_KNOWLEDGE_ROOT", "") or ""
    return Path(configured) if configured else Path(settings.VAR_DIR) / "knowledge"


def document_get(base: KnowledgeBase, document_id: int) -> KnowledgeDocument:
    document = KnowledgeDocument.objects.filter(base=base, pk=document_id).first()
    if document is None:
        raise NotFound(f'Knowledge base "{base.key}" has no document {document_id}.')
    return document


def document_put(
    *, base: KnowledgeBase, name: str, raw: bytes, content_type: str = "", source: str = "upload"
) -> DocumentStored:
    """Store ``raw`` as the document ``name`` of ``base`` (replacing its chunks), unless the
    same bytes are stored already."""
    if base.is_remote:
        raise Conflict(
            f'Knowledge base "{base.key}" is searched by its provider: it holds no documents.'
        )
    name = _document_name(name)
    limit = max_document_bytes()
    if len(raw) > limit:
        raise DocumentTooLarge(name, limit)
    extracted = extract(name, raw, content_type)
    existing = KnowledgeDocument.objects.filter(base=base, name=name).first()
    if existing is not None and existing.sha256 == extracted.sha256:
        if existing.source != source:
            existing.source = source
            existing.save(update_fields=["source", "updated_at"])
        return DocumentStored(existing, changed=False, chunks=existing.chunks.count())
    texts = chunk_text(extracted.text)
    if not texts:
        raise InvalidInput(f"{name}: the document has no text.")
    embedded, error = _embeddings(base, texts)
    stamp = base.model_stamp if embedded is not None else ""
    with transaction.atomic():
        document, _ = KnowledgeDocument.objects.update_or_create(
            base=base, name=name,
            defaults={
                "source": source[:1000], "content_type": extracted.content_type,
                "sha256": extracted.sha256, "chars": len(extracted.text),
            },
        )  # fmt: skip
        KnowledgeChunk.objects.filter(document=document).delete()
        KnowledgeChunk.objects.bulk_create(
            [
                KnowledgeChunk(
                    document=document,
                    base=base,
                    seq=seq,
                    text=text,
                    embedding=vectors.pack(embedded[seq]) if embedded is not None else None,
                    embedded_model=stamp,
                )
                for seq, text in enumerate(texts)
            ],
            batch_size=500,
        )
        changes: dict[str, Any] = {"revision": F("revision") + 1}
        if stamp:
            changes["embedded_model"] = stamp
        KnowledgeBase.objects.filter(pk=base.pk).update(**changes)
    return DocumentStored(document, changed=True, chunks=len(texts), embedding_error=error)


def document_add(
    *,
    base: KnowledgeBase,
    name: str,
    text: str,
    content_type: str = "",
    source: str = "upload",
    actor: str = "",
) -> KnowledgeDocument:
    """:func:`document_put` of a text (a ``source`` that is not ``upload``, ``folder:...`` or
    ``git:...`` is stored as ``upload``)."""
    if source != "upload" and not source.startswith(("folder:", "git:")):
        source = "upload"
    raw = text.encode("utf-8")
    return document_put(
        base=base, name=name, raw=raw, content_type=content_type, source=source
    ).document


def document_delete(document: KnowledgeDocument) -> None:
    with transaction.atomic():
        base_id = document.base_id
        document.delete()
        KnowledgeBase.objects.filter(pk=base_id).update(revision=F("revision") + 1)
    vectors.forget(base_id)


def _document_name(name: str) -> str:
    name = name.strip()
    if not name or len(name) > MAX_DOCUMENT_NAME or "\x00" in name:
        raise InvalidInput(
            f"A document needs a name of 1 to {MAX_DOCUMENT_NAME} characters.",
            errors=[{"pointer": "/name", "detail": "Invalid document name.", "code": "invalid"}],
        )
    return name


def _embeddings(base: KnowledgeBase, texts: list[str]) -> tuple[list[list[float]] | None, str]:
    if not base.embeds:
        return None, ""
    try:
        return embed_passages(base, texts), ""
    except EmbeddingFailed as exc:
        logger.warning("knowledge base %s: chunks stored without vectors: %s", base.key, exc)
        return None, str(exc)


def folder_sync(*, base: KnowledgeBase, path: str) -> FolderSynced:
    """Store every supported file under ``path`` (a folder under the knowledge root) as a
    document named by its path within that folder, and delete the documents an earlier sync
    of the same folder made whose files are gone."""
    root = knowledge_root().resolve()
    folder = (root / path).resolve()
    if not folder.is_relative_to(root):
        raise InvalidInput(
            f"{path} is outside the knowledge root (LOOPWRIGHT_KNOWLEDGE_ROOT, {root}).",
            errors=[
                {
                    "pointer": "/path",
                    "detail": "Outside the knowledge root.",
                    "code": "outside_root",
                }
            ],
        )
    if not folder.is_dir():
        raise InvalidInput(
            f"{path} is not a folder under the knowledge root.",
            errors=[{"pointer": "/path", "detail": "Not a folder.", "code": "not_a_folder"}],
        )
    relative = folder.relative_to(root).as_posix()
    source = f"folder:{relative}"
    report = FolderSynced(folder=relative)
    seen: set[str] = set()
    for file in _folder_files(folder, root, report):
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
    return report


def _folder_files(folder: Path, root: Path, report: FolderSynced) -> list[Path]:
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
                                   "detail": "a link out of the knowledge root"})  # fmt: skip
            continue
        if len(found) >= MAX_SYNC_FILES:
            report.refused.append({"name": "...", "detail": f"more than {MAX_SYNC_FILES} files"})
            break
        found.append(file)
    return found
