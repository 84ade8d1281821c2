"""Read-only queries of the retrieval trace: a run's knowledge searches (the run page's
*Retrievals* panel) and the recent ones of every run and chat (``/knowledge/retrievals``).

Each row is one ``knowledge_search`` / ``external_rag_search`` call (or a test search of the
UI), as ``knowledge.search.knowledge_search`` recorded it: who searched (employee, the role's
invocation, the person the work was for), what (query, bases), what it found (hits with their
scores and sources), how long it took and why it failed, if it did.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.core.paginator import Page, Paginator

from frontend.selectors.runs import invocation_title
from knowledge.models import Retrieval

#: At most this many retrievals on the run page (the newest; the trace page has the rest).
RUN_PANEL_LIMIT = 200
TRACE_PAGE_SIZE = 50


@dataclass(frozen=True)
class RetrievalLine:
    """A retrieval as a page shows it: the row and the heading of the invocation that searched."""

    retrieval: Retrieval
    title: str

    @property
    def hits(self) -> list[dict[str, Any]]:
        hits = self.retrieval.hits
        return [h for h in hits if isinstance(h, dict)] if isinstance(hits, list) else []


def _title(retrieval: Retrieval, bindings: Mapping[str, Any]) -> str:
    if retrieval.chat:
        return "Chat"
    if not retrieval.invocation:
        return "Test search" if retrieval.run_id is None else "—"
    return invocation_title(retrieval.invocation.split("/", 1)[0], bindings)[0]


def run_retrievals(run_id: uuid.UUID, bindings: Mapping[str, Any]) -> list[RetrievalLine]:
    """The run's retrievals, oldest first (the newest :data:`RUN_PANEL_LIMIT`)."""
    newest = list(Retrieval.objects.filter(run_id=run_id).order_by("-created_at")[:RUN_PANEL_LIMIT])
    return [RetrievalLine(r, _title(r, bindings)) for r in reversed(newest)]


def retrieval_trace(
    *, employee: str = "", run_id: uuid.UUID | None = None, page: Any = 1
) -> Page[Any]:
    """The retrievals matching the filters, newest first, a page of :data:`TRACE_PAGE_SIZE`
    (``object_list`` of :class:`RetrievalLine`)."""
    found = Retrieval.objects.order_by("-created_at", "-pk")
    if employee:
        found = found.filter(employee=employee)
    if run_id is not None:
        found = found.filter(run_id=run_id)
    result: Page[Any] = Paginator(found, TRACE_PAGE_SIZE).get_page(page)
    result.object_list = [RetrievalLine(r, _title(r, {})) for r in result.object_list]
    return result


def retrieval_employees() -> list[str]:
    """Every employee that has searched, for the trace page's filter."""
    names = Retrieval.objects.exclude(employee="").values_list("employee", flat=True)
    return sorted(set(names))
