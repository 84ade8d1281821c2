"""Daily quotas of an API token at ``/v1/chat/completions`` (docs/openai-endpoint.md, "Quotas").

Holds: every chat completion made with a token adds its tokens and cost to the token's UTC day
in one upsert (:func:`token_usage_add`); a request is admitted while the day's usage is below
each of the token's quotas, as read with the request's stamp (:mod:`gateway.prepared_cache`), so
a day overshoots by at most the requests in flight when it was reached. Refused: a 429
``quota_exceeded`` with ``Retry-After`` (the seconds to the next UTC midnight).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

from django.utils import timezone

from gateway.models import TokenUsageDay
from orchestrator.accounts.models import TOKEN_PREFIX
from orchestrator.agents.quotas import QuotaSpent, first_spent
from orchestrator.sql import usage_day_add


def usage_day(now: datetime) -> date:
    """The UTC day ``now`` falls on (the day a usage row counts for)."""
    return now.astimezone(UTC).date()


def _amount(value: Any) -> Decimal:
    return Decimal(0) if value is None else Decimal(str(value))


@dataclass(frozen=True)
class TokenQuota:
    """One token's daily quotas (None: none on that metric) and what it used on ``day``, as
    read with the request."""

    token_id: int
    prefix: str
    tokens: int | None
    cost: Decimal | None
    day: date
    used_tokens: int = 0
    used_cost: Decimal = Decimal(0)

    @classmethod
    def of_row(
        cls, token_id: Any, prefix: str, day: date, limits: tuple[Any, Any], used: tuple[Any, Any]
    ) -> TokenQuota:
        """From raw columns: ``limits`` (tokens, cost) and ``used`` (tokens, cost; None: no
        usage row yet)."""
        tokens, cost = limits
        return cls(
            token_id=int(token_id),
            prefix=prefix,
            tokens=None if tokens is None else int(tokens),
            cost=None if cost is None else _amount(cost),
            day=day,
            used_tokens=int(used[0] or 0),
            used_cost=_amount(used[1]),
        )


def token_quota_spent(quota: TokenQuota) -> QuotaSpent | None:
    """The first of the token's quotas used up on the day it was read for, if any (no query)."""
    start = datetime(quota.day.year, quota.day.month, quota.day.day, tzinfo=UTC)
    holder = f'API token "{TOKEN_PREFIX}_{quota.prefix}_…"'
    used = (Decimal(quota.used_tokens), quota.used_cost)
    return first_spent("token", holder, (quota.tokens, quota.cost), used, start + timedelta(days=1))


def token_usage_add(
    token_id: int, *, tokens: int, cost: float | Decimal, now: datetime | None = None
) -> None:
    """Add one chat completion's tokens and cost to the token's day (one atomic upsert; call on
    a thread with a database connection)."""
    if tokens <= 0 and not cost:
        return
    day = usage_day(now or timezone.now())
    amount = _amount(cost).quantize(Decimal("0.000001"))  # the column's places
    table = TokenUsageDay._meta.db_table
    usage_day_add(table, "token_id", token_id, day.isoformat(), max(0, tokens), amount)
