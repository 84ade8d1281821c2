"""Read-only queries of the approvals queue, an approval's page and a run's approvals."""

from __future__ import annotations

import uuid

from django.db.models import Count, Max, Q, QuerySet
from django.http import Http404

from loops.models import ActionApproval, ApprovalStatus

#: Decided approvals the queue page lists below the pending ones.
RECENT_DECISIONS = 25


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
