"""Documents of a knowledge base: storing one (extract, chunk, embed, replace its chunks in one
transaction) and deleting one. Syncing folders and Git paths: ``knowledge.sync``.

A document is identified by its name within its base; storing the same bytes again changes
nothing (``sha256``). Vectors are made before the transaction; when the embedding endpoint
fails the chunks are stored without them (full text still finds them) and the failure is
returned, for ``knowledge_reembed`` to fill in later. Every change bumps the base's
``revision``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F
from rest_framework import status

from knowledge import vectors
from knowledge.embeddings import EmbeddingFailed, embed_passages
from knowledge.ingest import chunk_text, extract
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


def max_document_bytes() -> int:
    return int(
        getattr(settings, "LOOPWRIGHT_KNOWLEDGE_MAX_DOCUMENT_BYTES", 0)
        or DEFAULT_MAX_DOCUMENT_BYTES
    )


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
