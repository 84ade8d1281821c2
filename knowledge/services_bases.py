"""Knowledge bases, their access matrix, and re-embedding their chunks.

A base's key never changes (tools and retrievals name it). Changing what its vectors are made
with (endpoint, model, dimensions) queues ``knowledge.reembed``: until it has run, search uses
the chunks already embedded with the new model and full text for the rest.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models import F
from rest_framework import status

from knowledge import vectors
from knowledge.embeddings import embed_passages
from knowledge.models import (
    KnowledgeAccess,
    KnowledgeBase,
    KnowledgeBaseKind,
    KnowledgeChunk,
    RetrievalTool,
)
from knowledge.search import KnowledgeRefused, SearchOutcome, knowledge_search
from orchestrator.agents.models import Employee
from orchestrator.errors import (
    DomainError,
    InvalidInput,
    NotFound,
    full_clean_or_invalid,
    invalid_fields,
)
from orchestrator.queue import enqueue

EDITABLE = (
    "name", "description", "kind", "provider", "api_url", "api_key_env", "namespace", "top_k",
    "score_threshold", "embedding_url", "embedding_model", "embedding_key_env", "embedding_dims",
)  # fmt: skip
REEMBED_TASK = "knowledge.reembed"
#: Chunks embedded per request and transaction when re-embedding.
REEMBED_BATCH = 128


class SearchFailed(DomainError):
    status_code = status.HTTP_502_BAD_GATEWAY
    problem_type = "knowledge-provider-failed"
    title = "The knowledge provider failed"


def base_get(key: str) -> KnowledgeBase:
    base = KnowledgeBase.objects.filter(key=key).first()
    if base is None:
        raise NotFound(f'There is no knowledge base "{key}".')
    return base


def base_create(**fields: Any) -> KnowledgeBase:
    """A new base, checked by the secret rule (key variables) and the outbound guard (URLs)."""
    base = KnowledgeBase(**fields)
    full_clean_or_invalid(base)
    base.save()
    return base


def base_update(*, base: KnowledgeBase, **fields: Any) -> KnowledgeBase:
    """Change the given fields (not the key); a new embedding model queues re-embedding."""
    if "key" in fields and fields["key"] != base.key:
        raise invalid_fields(
            [{"pointer": "/key", "detail": "The key cannot change.", "code": "invalid"}]
        )
    stamp = base.model_stamp
    changed = [name for name in fields if name in EDITABLE]
    for name in changed:
        setattr(base, name, fields[name])
    full_clean_or_invalid(base)
    with transaction.atomic():
        base.save(update_fields=[*changed, "updated_at"])
        if base.model_stamp and base.model_stamp != stamp:
            enqueue(REEMBED_TASK, base.key)
    vectors.forget(base.pk)
    return base


def base_delete(*, base: KnowledgeBase) -> None:
    base_id = base.pk
    base.delete()
    vectors.forget(base_id)


def knowledge_base_create(*, actor: str = "", **fields: Any) -> KnowledgeBase:
    """:func:`base_create` (``actor`` is who asked; bases keep no author)."""
    return base_create(**fields)


def knowledge_base_test_search(
    *, base: KnowledgeBase, query: str, top_k: int, user: str
) -> SearchOutcome:
    """A person's search of one base (recorded as a retrieval with no employee); a refusal
    is a 400 problem, a failing provider a 502."""
    tool = (
        RetrievalTool.EXTERNAL_RAG_SEARCH
        if base.kind == KnowledgeBaseKind.EXTERNAL_RAG
        else RetrievalTool.KNOWLEDGE_SEARCH
    )
    try:
        return knowledge_search(
            employee="", user=user, query=query, bases=[base.key], top_k=top_k, tool=tool
        )
    except KnowledgeRefused as refused:
        if refused.code == "provider_failed":
            raise SearchFailed(refused.message, code=refused.code) from None
        raise InvalidInput(refused.message, code=refused.code) from None


def _base_of(base: KnowledgeBase | str) -> KnowledgeBase:
    return base if isinstance(base, KnowledgeBase) else base_get(base)


def knowledge_access_grant(*, employee: str, base: KnowledgeBase | str, actor: str = "") -> None:
    """Let AI employee ``employee`` read ``base`` (one pair of the access matrix). Any
    username is taken (the API's ``access_set`` checks that each is an employee)."""
    row = _base_of(base)
    if not employee or len(employee) > 150:
        raise InvalidInput("Name an AI employee (1 to 150 characters).", code="invalid")
    KnowledgeAccess.objects.get_or_create(
        employee=employee, base=row, defaults={"created_by": actor}
    )


def knowledge_access_revoke(*, employee: str, base: KnowledgeBase | str, actor: str = "") -> None:
    KnowledgeAccess.objects.filter(employee=employee, base=_base_of(base)).delete()


def access_list(base: KnowledgeBase) -> list[str]:
    """The employees that may read ``base``, sorted."""
    return sorted(KnowledgeAccess.objects.filter(base=base).values_list("employee", flat=True))


def access_set(*, base: KnowledgeBase, employees: list[str], by: str) -> list[str]:
    """Make ``employees`` (existing AI employees) exactly those that may read ``base``."""
    wanted = sorted(set(employees))
    known = set(Employee.objects.filter(username__in=wanted).values_list("username", flat=True))
    unknown = [name for name in wanted if name not in known]
    if unknown:
        raise invalid_fields(
            [
                {"pointer": f"/employees/{employees.index(name)}",
                 "detail": f'There is no AI employee "{name}".', "code": "unknown_employee"}
                for name in unknown
            ]
        )  # fmt: skip
    with transaction.atomic():
        KnowledgeAccess.objects.filter(base=base).exclude(employee__in=wanted).delete()
        have = set(access_list(base))
        KnowledgeAccess.objects.bulk_create(
            [
                KnowledgeAccess(base=base, employee=name, created_by=by)
                for name in wanted
                if name not in have
            ],
            ignore_conflicts=True,
        )
    return access_list(base)


def knowledge_reembed(base: KnowledgeBase) -> int:
    """Embed every chunk of ``base`` whose vector was not made with the base's model now (or
    has none); the count of chunks embedded. Raises ``EmbeddingFailed`` (the batches done
    stay done). Not for an event loop's thread."""
    stamp = base.model_stamp
    if not stamp:
        return 0
    done = 0
    last_id = 0
    while True:
        batch = list(
            KnowledgeChunk.objects.filter(base=base, pk__gt=last_id)
            .exclude(embedded_model=stamp)
            .order_by("pk")
            .values_list("pk", "text")[:REEMBED_BATCH]
        )
        if not batch:
            break
        made = embed_passages(base, [text for _, text in batch])
        rows = [
            KnowledgeChunk(pk=pk, embedding=vectors.pack(vector), embedded_model=stamp)
            for (pk, _), vector in zip(batch, made, strict=True)
        ]
        with transaction.atomic():
            KnowledgeChunk.objects.bulk_update(rows, ["embedding", "embedded_model"])
            KnowledgeBase.objects.filter(pk=base.pk).update(revision=F("revision") + 1)
        done += len(rows)
        last_id = batch[-1][0]
    KnowledgeBase.objects.filter(pk=base.pk).update(embedded_model=stamp)
    base.embedded_model = stamp
    vectors.forget(base.pk)
    return done


def knowledge_reembed_by_key(key: str) -> int:
    """:func:`knowledge_reembed` of base ``key`` if it still exists (the task's body)."""
    base = KnowledgeBase.objects.filter(key=key).first()
    return knowledge_reembed(base) if base is not None else 0
