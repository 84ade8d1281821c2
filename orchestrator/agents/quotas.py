"""Daily quotas of an AI employee: tokens and cost of its model calls per UTC day, its runs and
its chats together (docs/runs.md, "Quotas").

Usage is added after each model call (``quota_charge``, one upsert); a call is admitted while
the day's usage is below the quota (``quota_spent``), so the day overshoots by at most the calls
in flight when it was reached. A run whose employee is out of quota stops with a budget stop
naming the quota; the chat endpoint answers 429 with ``Retry-After`` (the seconds to the next UTC
midnight).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from django.db.models import F
from django.utils import timezone

from orchestrator.agents.models import EmployeeUsageDay


@dataclass(frozen=True)
class EmployeeQuota:
    """An employee's quotas (None: no quota on that metric)."""

    username: str
    tokens: int | None = None
    cost: Decimal | None = None

    @property
    def binds(self) -> bool:
        return self.tokens is not None or self.cost is not None


@dataclass(frozen=True)
class QuotaSpent:
    """A used-up quota: which, how much was used, and when it resets."""

    username: str
    metric: str
    used: Decimal
    limit: Decimal
    resets_at: datetime

    @property
    def code(self) -> str:
        return f"quota:employee:{self.metric}"

    def message(self) -> str:
        shown = (
            f"{self.limit:,.4f}".rstrip("0").rstrip(".")
            if self.metric == "cost"
            else (f"{int(self.limit):,}")
        )
        return (
            f'employee "{self.username}" has used its daily {self.metric} quota ({shown}; '
            f"{self.used.normalize():,f} today); it resets at {self.resets_at.isoformat()}"
        )

    def retry_after_seconds(self, now: datetime | None = None) -> int:
        return max(1, int((self.resets_at - (now or timezone.now())).total_seconds()) + 1)


def _day(now: datetime) -> tuple[datetime, datetime]:
    start = now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return start, start + timedelta(days=1)


def quota_spent(quota: EmployeeQuota, now: datetime | None = None) -> QuotaSpent | None:
    """The first of ``quota``'s limits used up today, if any (one indexed read)."""
    if not quota.binds:
        return None
    start, end = _day(now or timezone.now())
    row = (
        EmployeeUsageDay.objects.filter(username=quota.username, day=start.date())
        .values_list("tokens", "cost")
        .first()
    )
    tokens, cost = (Decimal(row[0]), Decimal(row[1])) if row else (Decimal(0), Decimal(0))
    if quota.tokens is not None and tokens >= quota.tokens:
        return QuotaSpent(quota.username, "tokens", tokens, Decimal(quota.tokens), end)
    if quota.cost is not None and cost >= quota.cost:
        return QuotaSpent(quota.username, "cost", cost, quota.cost, end)
    return None


def quota_charge(
    username: str, *, tokens: int, cost: float | Decimal, now: datetime | None = None
) -> None:
    """Add one model call's tokens and cost to the employee's day."""
    if not tokens and not cost:
        return
    day = _day(now or timezone.now())[0].date()
    amount = Decimal(str(cost))
    updated = EmployeeUsageDay.objects.filter(username=username, day=day).update(
        tokens=F("tokens") + tokens, cost=F("cost") + amount
    )
    if not updated:
        _, created = EmployeeUsageDay.objects.get_or_create(
            username=username, day=day, defaults={"tokens": tokens, "cost": amount}
        )
        if not created:  # a parallel call made the row first
            EmployeeUsageDay.objects.filter(username=username, day=day).update(
                tokens=F("tokens") + tokens, cost=F("cost") + amount
            )
