"""The figures of the Metrics page: runs by status, approval wait times, usage per day.

Read-only aggregate queries over the tables the engine writes anyway (runs, approvals, and the
budgets' day buckets for the usage, ``metrics_usage``), so the page needs no metrics store and
is correct on SQLite and PostgreSQL alike.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

from django.db.models import Count
from django.utils import timezone

from frontend.selectors.metrics_usage import DayUsage, usage_per_day
from loops.models import ActionApproval, LoopRun, RunStatus

#: Decided approvals looked at for the wait-time figures (newest first), to bound the page's cost.
WAIT_SAMPLE = 5000


@dataclass(frozen=True)
class StatusCount:
    status: str
    label: str
    count: int


@dataclass(frozen=True)
class ApprovalWaits:
    """How long approvals waited for a decision, over the approvals decided in the window."""

    decided: int
    median_seconds: float | None
    p90_seconds: float | None
    longest_seconds: float | None
    pending: int
    oldest_pending: datetime | None


@dataclass(frozen=True)
class Metrics:
    days: int
    since: datetime
    runs_by_status: list[StatusCount]
    runs_total: int
    approvals: ApprovalWaits
    usage: list[DayUsage]

    @property
    def invocations_total(self) -> int:
        return sum(day.invocations for day in self.usage)

    @property
    def tool_calls_total(self) -> int:
        return sum(day.tool_calls for day in self.usage)

    @property
    def tokens_total(self) -> int:
        return sum(day.tokens for day in self.usage)

    @property
    def cost_total(self) -> Decimal:
        return sum((day.cost for day in self.usage), Decimal(0))


def _percentile(sorted_values: list[float], fraction: float) -> float | None:
    """Nearest-rank percentile of an ascending list (None when it is empty)."""
    if not sorted_values:
        return None
    rank = max(1, min(len(sorted_values), math.ceil(fraction * len(sorted_values))))
    return sorted_values[rank - 1]


def runs_by_status(since: datetime) -> list[StatusCount]:
    """Runs created since ``since``, counted per status, in the state machine's order."""
    counts = dict(
        LoopRun.objects.filter(created_at__gte=since)
        .values_list("status")
        .annotate(n=Count("id"))
        .values_list("status", "n")
    )
    return [
        StatusCount(status=value, label=str(label), count=int(counts.get(value, 0)))
        for value, label in RunStatus.choices
    ]


def approval_waits(since: datetime) -> ApprovalWaits:
    decided = list(
        ActionApproval.objects.filter(decided_at__isnull=False, decided_at__gte=since)
        .order_by("-decided_at")
        .values_list("created_at", "decided_at")[:WAIT_SAMPLE]
    )
    waits = sorted(max(0.0, (done - asked).total_seconds()) for asked, done in decided if done)
    pending = ActionApproval.objects.filter(status="pending")
    oldest = pending.order_by("created_at").values_list("created_at", flat=True).first()
    return ApprovalWaits(
        decided=len(waits),
        median_seconds=_percentile(waits, 0.5),
        p90_seconds=_percentile(waits, 0.9),
        longest_seconds=waits[-1] if waits else None,
        pending=pending.count(),
        oldest_pending=oldest,
    )


def metrics_summary(days: int = 14, now: datetime | None = None) -> Metrics:
    now = now or timezone.now()
    since = now - timedelta(days=days)
    statuses = runs_by_status(since)
    return Metrics(
        days=days,
        since=since,
        runs_by_status=statuses,
        runs_total=sum(s.count for s in statuses),
        approvals=approval_waits(since),
        usage=usage_per_day(since, now),
    )
