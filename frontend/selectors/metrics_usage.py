"""The Metrics page's usage per UTC day, read from the budgets' day buckets, not from the steps.

The engine counts every run's usage in ``UsageBucket`` rows as it writes it (``loops.services.
budgets``, docs/runs.md "Budgets"), per pattern and UTC day in scope
``pattern:<pattern id>:<YYYY-MM-DD>``, so a day's figures are the sum of those rows over every
pattern: indexed lookups per (pattern, day, metric), whatever the years of history behind
them. The ``<metric>:max_call`` high-water rows kept beside them are not usage: left out.

What each figure is (the day is the UTC day the engine wrote it, in the same transaction):
``invocations`` the invocations started (leader, each maker, verifier; a resumed one is not
counted again), ``tool_calls`` the tool calls begun or gated for approval, ``tokens`` prompt +
completion tokens of the model steps recorded (and any a tool step reported on completion),
``cost`` their cost. Only runs are counted: calls to the OpenAI-compatible endpoint
(``/v1/chat/completions``) charge the calling token's and employee's quotas, not a pattern.
Patterns are never deleted while they have runs (``LoopRun.pattern`` is ``PROTECT``), so the
patterns table names every pattern with buckets, disabled ones included.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

from loops.services.budget_rules import amount
from orchestrator.sql import fetch_all

#: The bucket metrics the page shows (``budget_rules.METRICS`` but ``verifications``).
SHOWN = ("invocations", "toolCalls", "tokens", "cost")


@dataclass(frozen=True)
class DayUsage:
    """One UTC day's usage over every pattern."""

    day: date
    invocations: int
    tool_calls: int
    tokens: int
    cost: Decimal


def usage_days(since: datetime, now: datetime) -> list[date]:
    """Every UTC day from ``since``'s to ``now``'s, oldest first: the buckets count whole
    days, so the window's first day counts in full."""
    first, last = since.astimezone(UTC).date(), now.astimezone(UTC).date()
    return [first + timedelta(days=n) for n in range((last - first).days + 1)]


def day_buckets_sql(days: list[date]) -> tuple[str, list[Any]]:
    """Per day, the sums of the :data:`SHOWN` metrics (in that order) over every pattern's day
    scope, built in the statement from the patterns table and the days.

    Each (scope, metric) is a correlated lookup on the unique (scope, metric) index, so the
    plan cannot turn into a scan of the table: a plain join was hashed over every bucket row
    on PostgreSQL once the history grew (3 years, a 90-day window: 580 ms, against 43 ms;
    docs/performance.md)."""
    day_rows = ", ".join(["(CAST(%s AS TEXT))"] * len(days))
    sums = ", ".join(
        ["SUM((SELECT b.value FROM loops_usagebucket b WHERE b.scope = s.scope AND b.metric = %s))"]
        * len(SHOWN)
    )
    sql = (
        f"SELECT s.day, {sums} FROM (SELECT d.column1 AS day, "  # noqa: S608 (constants and placeholders only)
        "'pattern:' || CAST(p.id AS TEXT) || ':' || d.column1 AS scope "
        f"FROM loops_looppattern p CROSS JOIN (VALUES {day_rows}) AS d) s GROUP BY s.day"
    )
    return sql, [*SHOWN, *(day.isoformat() for day in days)]


def usage_per_day(since: datetime, now: datetime) -> list[DayUsage]:
    """The usage of each UTC day of the window that has any, newest day first."""
    rows = fetch_all(*day_buckets_sql(usage_days(since, now)))
    found = []
    for day, *totals in rows:
        invocations, tool_calls, tokens, cost = (amount(total or 0) for total in totals)
        if invocations or tool_calls or tokens or cost:
            found.append(
                DayUsage(
                    day=date.fromisoformat(str(day)),
                    invocations=int(invocations),
                    tool_calls=int(tool_calls),
                    tokens=int(tokens),
                    cost=cost,
                )
            )
    return sorted(found, key=lambda usage: usage.day, reverse=True)
