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

from django.utils import timezone

from orchestrator.agents.models import EmployeeUsageDay
from orchestrator.sql import usage_day_add


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
    """A used-up daily quota: whose (``kind``: ``employee``, ``token``; ``holder`` as named in
    the message), which metric, how much was used, and when it resets."""

    kind: str
    holder: str
    metric: str
    used: Decimal
    limit: Decimal
    resets_at: datetime

    @property
    def code(self) -> str:
        return f"quota:{self.kind}:{self.metric}"

    def message(self) -> str:
        shown = (
            f"{self.limit:,.4f}".rstrip("0").rstrip(".")
            if self.metric == "cost"
            else (f"{int(self.limit):,}")
        )
        return (
            f"{self.holder} has used its daily {self.metric} quota ({shown}; "
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
    holder = f'employee "{quota.username}"'
    return first_spent("employee", holder, (quota.tokens, quota.cost), (tokens, cost), end)


def first_spent(
    kind: str,
    holder: str,
    limits: tuple[int | None, Decimal | None],
    used: tuple[Decimal, Decimal],
    resets_at: datetime,
) -> QuotaSpent | None:
    """The first of the ``limits`` (tokens, cost; None: no quota) that ``used`` reached."""
    for metric, limit, amount in zip(("tokens", "cost"), limits, used, strict=True):
        if limit is not None and amount >= limit:
            return QuotaSpent(kind, holder, metric, amount, Decimal(limit), resets_at)
    return None


def quota_charge(
    username: str, *, tokens: int, cost: float | Decimal, now: datetime | None = None
) -> None:
    """Add one model call's tokens and cost to the employee's day (one atomic upsert)."""
    if not tokens and not cost:
        return
    day = _day(now or timezone.now())[0].date()
    amount = Decimal(str(cost)).quantize(Decimal("0.000001"))  # the column's places
    table = EmployeeUsageDay._meta.db_table
    usage_day_add(table, "username", username, day.isoformat(), tokens, amount)
