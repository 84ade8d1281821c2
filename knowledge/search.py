"""Searching knowledge bases as an employee (or a person testing a base), checked against the
access matrix and recorded as one :class:`~knowledge.models.Retrieval` per call.

Local and ``e5-http`` bases answer from their chunks: full text always, plus an exact cosine
scan of the chunk vectors when the base embeds; the ranked lists (and any ``external-http``
base's answer) are fused by reciprocal rank (:mod:`knowledge.ranking`). Synchronous (ORM and
blocking HTTP): callers in an event loop run it on a database thread.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from knowledge import fulltext, ranking, vectors
from knowledge.embeddings import EmbeddingFailed, embed_query
from knowledge.external import ExternalFailed, ExternalResult, external_search
from knowledge.models import KnowledgeAccess, KnowledgeBase, KnowledgeChunk, Retrieval

logger = logging.getLogger(__name__)

MAX_QUERY_CHARS = 2000
MAX_TOP_K = 50
#: Candidates each ranked list brings to the fusion, at least.
MIN_CANDIDATES = 50
MATRIX = "knowledge access matrix"


@dataclass(frozen=True)
class Hit:
    """One result: the chunk's text and enough to cite it (``source``)."""

    base: str
    document: str
    chunk_id: str
    text: str
    score: float
    source: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SearchOutcome:
    hits: list[Hit]
    bases: list[str]
    latency_ms: int
    #: ``fulltext``, ``hybrid`` (vectors took part) or ``external`` (remote bases only).
    mode: str


class KnowledgeRefused(Exception):
    """A search that was not made (or failed): ``code`` is ``invalid``, ``unknown_base``,
    ``no_access``, ``wrong_kind`` or ``provider_failed``; ``message`` says why."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def knowledge_search(
    *,
    employee: str,
    query: str,
    bases: list[str] | None,
    top_k: int,
    user: str = "",
    run_id: uuid.UUID | None = None,
    invocation: str = "",
    chat: bool = False,
    tool: str = "knowledge_search",
    reach: Callable[[str], str] | None = None,
) -> SearchOutcome:
    """The ``top_k`` best chunks for ``query`` over ``bases`` (None: every base ``employee``
    may read; ``employee`` "" is a person, whose rights the caller checked). ``reach(url)`` says
    why the calling role's network may not reach an external base's service ("" when it may;
    None: no role, as for a person's test search). A refusal raises
    :class:`KnowledgeRefused`; either way one Retrieval row records the call."""
    started = time.monotonic()
    query = query.replace("\x00", "")  # no database text holds NUL
    record = {
        "run_id": run_id, "invocation": invocation[:200], "chat": chat, "employee": employee,
        "user": user, "tool": tool, "query": query[:MAX_QUERY_CHARS],
    }  # fmt: skip
    try:
        rows = _readable_bases(employee=employee, query=query, bases=bases, top_k=top_k)
        _refuse_unreachable(rows, reach)
        outcome = _search(rows, query.strip(), top_k, started)
    except KnowledgeRefused as refused:
        Retrieval.objects.create(
            **record, bases=list(bases or []), error=refused.message,
            latency_ms=_elapsed_ms(started),
        )  # fmt: skip
        raise
    Retrieval.objects.create(
        **record, bases=outcome.bases, mode=outcome.mode, latency_ms=outcome.latency_ms,
        hits=[hit_record(hit) for hit in outcome.hits],
    )  # fmt: skip
    return outcome


def hit_record(hit: Hit) -> dict[str, Any]:
    """How a hit is stored on its Retrieval (no text: the chunk id and the source cite it)."""
    return {
        "base": hit.base, "document": hit.document, "chunk": hit.chunk_id,
        "score": round(hit.score, 6), "source": hit.source,
    }  # fmt: skip


def readable_base_keys(employee: str) -> list[str]:
    """The keys of the bases ``employee`` may read (the access matrix), sorted."""
    return sorted(
        KnowledgeAccess.objects.filter(employee=employee).values_list("base__key", flat=True)
    )


def _readable_bases(
    *, employee: str, query: str, bases: list[str] | None, top_k: int
) -> list[KnowledgeBase]:
    if not query.strip():
        raise KnowledgeRefused("invalid", "The query is empty.")
    if len(query) > MAX_QUERY_CHARS:
        raise KnowledgeRefused("invalid", f"The query is over {MAX_QUERY_CHARS} characters.")
    if not 1 <= top_k <= MAX_TOP_K:
        raise KnowledgeRefused("invalid", f"top_k must be between 1 and {MAX_TOP_K}.")
    if bases is None:
        if not employee:
            return list(KnowledgeBase.objects.all())
        return list(KnowledgeBase.objects.filter(access__employee=employee).distinct())
    wanted = list(dict.fromkeys(bases))
    found = {base.key: base for base in KnowledgeBase.objects.filter(key__in=wanted)}
    for key in wanted:
        if key not in found:
            raise KnowledgeRefused("unknown_base", f'There is no knowledge base "{key}".')
    if employee:
        allowed = set(
            KnowledgeAccess.objects.filter(employee=employee, base__key__in=wanted).values_list(
                "base__key", flat=True
            )
        )
        for key in wanted:
            if key not in allowed:
                raise KnowledgeRefused(
                    "no_access",
                    f'employee "{employee}" may not read knowledge base "{key}" ({MATRIX})',
                )
    return [found[key] for key in wanted]


def _refuse_unreachable(rows: Sequence[KnowledgeBase], reach: Callable[[str], str] | None) -> None:
    """The role's ``isolation.networkAccess`` binds its calls to external RAG services."""
    for base in rows:
        why = reach(base.api_url) if reach is not None and base.is_remote else ""
        if why:
            raise KnowledgeRefused("network", f'knowledge base "{base.key}": {why}')


def _search(rows: Sequence[KnowledgeBase], query: str, top_k: int, started: float) -> SearchOutcome:
    keys = [base.key for base in rows]
    local = [base for base in rows if not base.is_remote]
    remote = [base for base in rows if base.is_remote]
    candidates = max(MIN_CANDIDATES, top_k * 4)
    lists: list[list[ranking.Ranked]] = []
    by_id = {base.pk: base for base in local}
    if local:
        lists.append(
            [
                ranking.Ranked(str(chunk_id), score, "fulltext")
                for chunk_id, score in fulltext.ranked_chunks(list(by_id), query, candidates)
            ]
        )
    vector_used = False
    for group in _embedding_groups(local):
        found = _vector_list(group, query, candidates)
        if found is not None:
            vector_used = True
            lists.append(found)
    externals: dict[str, Hit] = {}
    for base in remote:
        results = _external(base, query, top_k)
        ranked = []
        for result in results:
            hit = _external_hit(base, result)
            externals[hit.chunk_id] = hit
            ranked.append(ranking.Ranked(hit.chunk_id, hit.score, "external"))
        lists.append(ranked)
    fused = ranking.fuse(lists, top_k)
    hits = _hits(fused, by_id, externals, single=len(lists) == 1)
    mode = "external" if remote and not local else ("hybrid" if vector_used else "fulltext")
    return SearchOutcome(hits=hits, bases=keys, latency_ms=_elapsed_ms(started), mode=mode)


def _embedding_groups(bases: Sequence[KnowledgeBase]) -> list[list[KnowledgeBase]]:
    """Bases that embed, grouped by what a query vector for them is made with."""
    groups: dict[tuple[str, str, str, str, int], list[KnowledgeBase]] = {}
    for base in bases:
        if base.embeds:
            signature = (
                base.provider, base.embedding_url, base.embedding_model,
                base.embedding_key_env, base.embedding_dims,
            )  # fmt: skip
            groups.setdefault(signature, []).append(base)
    return list(groups.values())


def _vector_list(
    group: list[KnowledgeBase], query: str, candidates: int
) -> list[ranking.Ranked] | None:
    try:
        vector = embed_query(group[0], query)
    except EmbeddingFailed as exc:
        logger.warning("knowledge search: query embedding failed, full text only: %s", exc)
        return None
    scored: list[tuple[int, float]] = []
    for base in group:
        scored += vectors.nearest(base.pk, base.model_stamp, vector, candidates)
    scored.sort(key=lambda pair: (-pair[1], pair[0]))
    return [ranking.Ranked(str(chunk), score, "vector") for chunk, score in scored[:candidates]]


def _external(base: KnowledgeBase, query: str, top_k: int) -> list[ExternalResult]:
    try:
        return external_search(base, query, min(top_k, base.top_k))
    except ExternalFailed as exc:
        raise KnowledgeRefused(
            "provider_failed", f'knowledge base "{base.key}" ({base.provider}): {exc}'
        ) from exc


def _external_hit(base: KnowledgeBase, result: ExternalResult) -> Hit:
    document = str(
        result.metadata.get("filename") or result.metadata.get("title")
        or result.metadata.get("recordId") or result.id
    )  # fmt: skip
    source = {"base": base.key, "provider": base.provider, "id": result.id, **result.metadata}
    return Hit(
        base=base.key, document=document, chunk_id=f"{base.key}:{result.id}",
        text=result.content, score=result.score, source=source,
    )  # fmt: skip


def _hits(
    fused: list[ranking.Fused],
    bases: dict[int, KnowledgeBase],
    externals: dict[str, Hit],
    *,
    single: bool,
) -> list[Hit]:
    local_ids = [int(item.key) for item in fused if item.key not in externals]
    chunks = {
        chunk.pk: chunk
        for chunk in KnowledgeChunk.objects.filter(pk__in=local_ids).select_related("document")
    }
    hits: list[Hit] = []
    for item in fused:
        score = item.native if single else item.score
        if item.key in externals:
            hit = externals[item.key]
            hits.append(Hit(hit.base, hit.document, hit.chunk_id, hit.text, score, hit.source))
            continue
        chunk = chunks.get(int(item.key))
        if chunk is None:  # deleted since it was ranked
            continue
        base = bases[chunk.base_id]
        source = {
            "base": base.key, "document": chunk.document.name, "document_id": chunk.document_id,
            "seq": chunk.seq, "origin": chunk.document.source, "scores": item.scores,
        }  # fmt: skip
        hits.append(Hit(base.key, chunk.document.name, str(chunk.pk), chunk.text, score, source))
    return hits


def _elapsed_ms(started: float) -> int:
    return int((time.monotonic() - started) * 1000)
