"""Agent memory's business rules (docs/memory.md): saving, editing and deleting items, which
items an employee working for a person may see, searching them, and the prompt's
``<agent_memory_context>`` block. Every multi-row write is one transaction.

Visibility: under ``scopes``, ``public`` items are everyone's, ``user`` items are the person's
(``username == user``) and ``agent_user`` items are the employee's memory of that person
(``employee`` and ``username``). Without a person (``user == ""``) only public items are seen.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Q, QuerySet

from memory.models import MemoryItem, MemoryItemScope, MemoryUse, MemoryUseKind
from orchestrator.errors import full_clean_or_invalid
from orchestrator.sql import fetch_all_prepared

#: The block's opening and closing tags.
BLOCK_OPEN, BLOCK_CLOSE = "<agent_memory_context>", "</agent_memory_context>"
#: Most terms of one search query; most candidate rows one search ranks.
MAX_TERMS = 20
MAX_CANDIDATES = 500
EDITABLE = ("content", "tags")


@dataclass(frozen=True)
class UseOrigin:
    """Who used items, as a :class:`MemoryUse` records it."""

    actor: str
    run_id: uuid.UUID | None = None
    invocation: str = ""
    chat: bool = False


def agent_actor(employee: str) -> str:
    """How an employee appears as ``created_by`` and ``actor``."""
    return f"agent:{employee}"


# --- visibility ----------------------------------------------------------------------------


def visible_q(*, employee: str, user: str, scopes: Collection[str]) -> Q:
    """The items ``employee`` working for ``user`` may see under ``scopes`` (nothing: no row)."""
    found = Q(pk__in=[])
    if MemoryItemScope.PUBLIC in scopes:
        found |= Q(scope=MemoryItemScope.PUBLIC)
    if user and MemoryItemScope.USER in scopes:
        found |= Q(scope=MemoryItemScope.USER, username=user)
    if user and employee and MemoryItemScope.AGENT_USER in scopes:
        found |= Q(scope=MemoryItemScope.AGENT_USER, username=user, employee=employee)
    return found


def memory_visible(*, employee: str, user: str, scopes: Collection[str]) -> QuerySet[MemoryItem]:
    """Those items, newest first."""
    return MemoryItem.objects.filter(visible_q(employee=employee, user=user, scopes=scopes))


# --- writes --------------------------------------------------------------------------------


def _record_uses(items: Iterable[MemoryItem], kind: str, origin: UseOrigin) -> None:
    MemoryUse.objects.bulk_create(
        MemoryUse(
            item=item,
            kind=kind,
            run_id=origin.run_id,
            invocation=origin.invocation,
            chat=origin.chat,
            actor=origin.actor,
        )
        for item in items
    )


def memory_uses_record(items: Sequence[MemoryItem], kind: str, origin: UseOrigin) -> None:
    """One :class:`MemoryUse` of ``kind`` per item, in one transaction."""
    with transaction.atomic():
        _record_uses(items, kind, origin)


def memory_create(
    *,
    scope: str,
    content: str,
    created_by: str,
    username: str = "",
    employee: str = "",
    tags: list[str] | None = None,
    source_run: uuid.UUID | None = None,
    origin: UseOrigin | None = None,
) -> MemoryItem:
    """Save an item (validated: InvalidInput names the field) and its ``saved`` use."""
    item = MemoryItem(
        scope=scope,
        username=username,
        employee=employee,
        content=content,
        tags=list(tags or []),
        created_by=created_by,
        source_run=source_run,
    )
    full_clean_or_invalid(item)
    with transaction.atomic():
        item.save(force_insert=True)
        _record_uses([item], MemoryUseKind.SAVED, origin or UseOrigin(actor=created_by))
    return item


def memory_save_once(*, call_key: str, origin: UseOrigin, **fields: Any) -> tuple[MemoryItem, bool]:
    """The item the tool call ``call_key`` saved: saved now (``True``), or found because the
    call saved it before a crash and was issued again (``False``); never two items."""
    known = MemoryItem.objects.filter(call_key=call_key).first()
    if known is not None:
        return known, False
    item = MemoryItem(call_key=call_key, **fields)
    full_clean_or_invalid(item)
    try:
        with transaction.atomic():
            item.save(force_insert=True)
            _record_uses([item], MemoryUseKind.SAVED, origin)
    except IntegrityError:
        # The same call, concurrently (a re-issue racing the original): its item stands.
        known = MemoryItem.objects.filter(call_key=call_key).first()
        if known is None:
            raise
        return known, False
    return item, True


def memory_update(item: MemoryItem, *, actor: str, **fields: Any) -> MemoryItem:
    """Change the item's content and/or tags (validated) and record an ``edited`` use."""
    changed = [name for name in EDITABLE if name in fields]
    for name in changed:
        setattr(item, name, list(fields[name]) if name == "tags" else fields[name])
    full_clean_or_invalid(item)
    with transaction.atomic():
        item.save(update_fields=[*changed, "updated_at"])
        _record_uses([item], MemoryUseKind.EDITED, UseOrigin(actor=actor))
    return item


def memory_delete(item: MemoryItem) -> None:
    """Remove the item; its uses go with it."""
    with transaction.atomic():
        item.delete()


# --- reads ---------------------------------------------------------------------------------


def query_terms(query: str) -> list[str]:
    """The distinct lower-case words of ``query`` (at most ``MAX_TERMS``)."""
    terms: list[str] = []
    for word in query.lower().split():
        if word not in terms:
            terms.append(word)
    return terms[:MAX_TERMS]


def _matched(item: MemoryItem, terms: Sequence[str]) -> int:
    text = " ".join([item.content, *item.tags]).lower()
    return sum(1 for term in terms if term in text)


def memory_search(
    query: str, *, employee: str, user: str, scopes: Collection[str], limit: int
) -> list[MemoryItem]:
    """The visible items matching any term of ``query`` (case-insensitive, in the content or
    a tag), most terms matched first, then newest; at most ``limit``. An empty query gives the
    newest items."""
    if limit <= 0:
        return []
    visible = memory_visible(employee=employee, user=user, scopes=scopes)
    terms = query_terms(query)
    if not terms:
        return list(visible[:limit])
    any_term = Q(pk__in=[])
    for term in terms:
        any_term |= Q(content__icontains=term) | Q(tags__icontains=term)
    candidates = list(visible.filter(any_term)[:MAX_CANDIDATES])
    ranked = [(item, _matched(item, terms)) for item in candidates]
    # Stable sort: candidates are newest first, so ties keep that order.
    ranked.sort(key=lambda pair: pair[1], reverse=True)
    return [item for item, matched in ranked if matched][:limit]


def memory_filter(
    *,
    scope: str = "",
    username: str = "",
    employee: str = "",
    q: str = "",
) -> QuerySet[MemoryItem]:
    """Items for people to browse (the API, the Inspector): the given keys, and every term of
    ``q`` in the content or a tag; newest first."""
    items = MemoryItem.objects.all()
    if scope:
        items = items.filter(scope=scope)
    if username:
        items = items.filter(username=username)
    if employee:
        items = items.filter(employee=employee)
    return with_every_term(items, q)


def with_every_term(items: QuerySet[MemoryItem], q: str) -> QuerySet[MemoryItem]:
    """``items`` holding every term of ``q`` (case-insensitive) in their content or a tag."""
    for term in query_terms(q):
        items = items.filter(Q(content__icontains=term) | Q(tags__icontains=term))
    return items


# --- the prompt block ----------------------------------------------------------------------


def _line(item: MemoryItem) -> str:
    """One item as a line of the block; its own text cannot close or open the block."""
    text = item.content.strip().replace("\r\n", "\n").replace("\n", "\n  ")
    text = text.replace(BLOCK_CLOSE, "&lt;/agent_memory_context>")
    text = text.replace(BLOCK_OPEN, "&lt;agent_memory_context>")
    return f"- [{item.scope}] {text}"


def render_block(items: Sequence[MemoryItem], max_chars: int) -> tuple[str, list[uuid.UUID]]:
    """The block of ``items`` (in order) in at most ``max_chars`` characters, tags and line
    breaks included: whole items only, an item that does not fit in what is left is left out
    (a later, shorter one may still fit). ``("", [])`` when none fits."""
    room = max_chars - len(BLOCK_OPEN) - len(BLOCK_CLOSE) - 1
    lines: list[str] = []
    ids: list[uuid.UUID] = []
    for item in items:
        line = _line(item)
        if len(line) + 1 <= room:
            lines.append(line)
            ids.append(item.id)
            room -= len(line) + 1
    if not lines:
        return "", []
    return "\n".join([BLOCK_OPEN, *lines, BLOCK_CLOSE]), ids


def memory_context(
    *, employee: str, user: str, scopes: Collection[str], max_items: int, max_chars: int
) -> tuple[str, list[uuid.UUID]]:
    """The ``<agent_memory_context>`` block for ``employee`` working for ``user``: the newest
    ``max_items`` visible items under ``scopes``, trimmed to ``max_chars`` (see
    :func:`render_block`), and the ids of the items it holds. ``("", [])`` for nothing."""
    if max_items <= 0 or max_chars <= 0:
        return "", []
    return render_block(newest_visible(employee, user, scopes, max_items), max_chars)


def newest_visible(
    employee: str, user: str, scopes: Collection[str], limit: int
) -> list[MemoryItem]:
    """``memory_visible(...)[:limit]`` (scope and content only) in one hand-written statement:
    every chat and invocation reads it before its first model call, so the ORM's query
    building is left out, and on PostgreSQL it is prepared once per shape (docs/performance.md)."""
    where: list[str] = []
    params: list[Any] = []
    shape = ""  # which clauses the statement has: its prepared name
    if MemoryItemScope.PUBLIC in scopes:
        where.append("scope = %s")
        params.append(MemoryItemScope.PUBLIC.value)
        shape += "p"
    if user and MemoryItemScope.USER in scopes:
        where.append("(scope = %s AND username = %s)")
        params += [MemoryItemScope.USER.value, user]
        shape += "u"
    if user and employee and MemoryItemScope.AGENT_USER in scopes:
        where.append("(scope = %s AND username = %s AND employee = %s)")
        params += [MemoryItemScope.AGENT_USER.value, user, employee]
        shape += "a"
    if not where:
        return []
    table = MemoryItem._meta.db_table
    sql = (
        f"SELECT id, scope, content FROM {table} WHERE {' OR '.join(where)} "  # noqa: S608 (constants)
        "ORDER BY created_at DESC LIMIT %s"
    )
    rows = fetch_all_prepared(f"lw_memory_newest_{shape}", sql, [*params, limit])
    return [MemoryItem(id=uuid.UUID(str(i)), scope=s, content=c) for i, s, c in rows]


def memory_inject(
    *,
    employee: str,
    user: str,
    scopes: Collection[str],
    max_items: int,
    max_chars: int,
    origin: UseOrigin,
) -> str:
    """:func:`memory_context`, with one ``injected`` use recorded per item it holds (by id:
    the items are not read again)."""
    block, ids = memory_context(
        employee=employee, user=user, scopes=scopes, max_items=max_items, max_chars=max_chars
    )
    if ids:
        held = [MemoryItem(id=item_id) for item_id in ids]
        memory_uses_record(held, MemoryUseKind.INJECTED, origin)
    return block
