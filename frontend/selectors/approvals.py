"""Read-only queries of the approvals queue, an approval's page and a run's approvals."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

from django.db.models import Count, Max, Q, QuerySet
from django.http import Http404
from django.utils.dateparse import parse_datetime

from loops.models import ActionApproval, ApprovalStatus

#: Decided approvals the queue page lists below the pending ones.
RECENT_DECISIONS = 25
#: Pending approvals per page of the queue.
PENDING_PAGE = 20


def _approvals() -> QuerySet[ActionApproval]:
    return ActionApproval.objects.select_related("run__pattern")


def approval_of(approval_id: str) -> ActionApproval:
    """The approval in a URL, or a 404 (never a 500 for a malformed id)."""
    try:
        return _approvals().get(pk=uuid.UUID(approval_id))
    except (ValueError, ActionApproval.DoesNotExist):
        raise Http404(f"There is no approval {approval_id!r}.") from None


def run_approvals(run_id: uuid.UUID) -> list[ActionApproval]:
    """A run's approvals in step order."""
    return list(_approvals().filter(run_id=run_id).order_by("step_seq"))


def pending_approvals() -> list[ActionApproval]:
    """Approvals waiting for a decision, oldest first."""
    return list(_approvals().filter(status=ApprovalStatus.PENDING).order_by("created_at"))


@dataclass(frozen=True)
class PendingPage:
    approvals: list[ActionApproval]
    total: int
    next_cursor: str = ""
    previous_cursor: str = ""


def _cursor(approval: ActionApproval) -> str:
    return f"{approval.created_at.isoformat()}|{approval.id}"


def _decode(text: str) -> tuple[datetime, uuid.UUID] | None:
    at, _, ident = text.partition("|")
    try:
        parsed = parse_datetime(at)
        return (parsed, uuid.UUID(ident)) if parsed is not None else None
    except ValueError:
        return None


def pending_page(*, after: str = "", before: str = "", size: int = PENDING_PAGE) -> PendingPage:
    """One page of the pending approvals, oldest first, by keyset (``created_at``, ``id``)
    after or before a cursor; a cursor that does not decode gives the first page."""
    pending = _approvals().filter(status=ApprovalStatus.PENDING)
    total = pending.count()
    start = _decode(after or before)
    backwards = bool(before) and start is not None
    if start is not None:
        at, ident = start
        op = "lt" if backwards else "gt"
        pending = pending.filter(
            Q(**{f"created_at__{op}": at}) | Q(created_at=at, **{f"id__{op}": ident})
        )
    order = ("-created_at", "-id") if backwards else ("created_at", "id")
    rows = list(pending.order_by(*order)[: size + 1])
    more, rows = len(rows) > size, rows[:size]
    if backwards:
        rows.reverse()
    has_next = more if not backwards else True
    has_previous = (more if backwards else start is not None) and bool(rows)
    return PendingPage(
        approvals=rows,
        total=total,
        next_cursor=_cursor(rows[-1]) if has_next and rows else "",
        previous_cursor=_cursor(rows[0]) if has_previous else "",
    )


def recent_decisions() -> list[ActionApproval]:
    """The latest :data:`RECENT_DECISIONS` decided approvals, newest first."""
    decided = _approvals().exclude(status=ApprovalStatus.PENDING).order_by("-decided_at")
    return list(decided[:RECENT_DECISIONS])


def queue_version() -> str:
    """A fingerprint of the queue: it changes whenever an approval is added or decided."""
    figures = ActionApproval.objects.aggregate(
        pending=Count("id", filter=Q(status=ApprovalStatus.PENDING)),
        total=Count("id"),
        created=Max("created_at"),
        decided=Max("decided_at"),
    )
    return "|".join(str(figures[k]) for k in ("pending", "total", "created", "decided"))
