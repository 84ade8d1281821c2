"""The Skills section of the Metrics page: skill executions requested in the window.

Per skill: calls, failures, timeouts, median and 90th percentile duration; per caller (the
execution's ``principal``, ``employee:<name>`` for AI employees, ``user:<name>`` for people):
calls and failures per skill; and calls per UTC day by outcome. Counts are aggregates in the
database; durations come from the newest :data:`DURATION_SAMPLE` finished executions.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import date, datetime

from django.db.models import Count, Q

from frontend.selectors.metrics import _percentile
from frontend.selectors.metrics_series import Series, status_per_day
from skillhub.models import ExecutionStatus, SkillExecution

#: Finished executions read (newest first) for the duration percentiles, to bound the page's cost.
DURATION_SAMPLE = 5000
#: Rows of the per-caller table (the busiest caller-skill pairs).
CALLER_ROWS = 50
#: How the calls chart groups executions: the two ends, and everything not ended (queued, running).
OUTCOMES = ("succeeded", "failed", "other")
_FAILED = Q(status=ExecutionStatus.FAILED)


@dataclass(frozen=True)
class SkillCalls:
    tool_name: str
    calls: int
    failures: int
    timeouts: int
    median_ms: float | None
    p90_ms: float | None


@dataclass(frozen=True)
class CallerCalls:
    kind: str  # "employee", "user" or "" when the principal has no kind
    name: str
    tool_name: str
    calls: int
    failures: int


@dataclass(frozen=True)
class SkillUsage:
    skills: list[SkillCalls]
    callers: list[CallerCalls]
    #: Caller-skill pairs beyond :data:`CALLER_ROWS` (not listed).
    callers_left_off: int
    duration_sample: int = DURATION_SAMPLE

    @property
    def calls(self) -> int:
        return sum(s.calls for s in self.skills)

    @property
    def failures(self) -> int:
        return sum(s.failures for s in self.skills)


def _durations(since: datetime) -> dict[str, list[float]]:
    rows = (
        SkillExecution.objects.filter(created_at__gte=since, duration_ms__isnull=False)
        .order_by("-created_at")
        .values_list("tool_name", "duration_ms")[:DURATION_SAMPLE]
    )
    found: dict[str, list[float]] = defaultdict(list)
    for tool_name, ms in rows:
        found[tool_name].append(float(ms or 0))  # never None: excluded by the filter
    return {name: sorted(values) for name, values in found.items()}


def _caller(principal: str) -> tuple[str, str]:
    kind, sep, name = principal.partition(":")
    return (kind, name) if sep else ("", principal)


def skill_usage(since: datetime) -> SkillUsage:
    """Skill executions created since ``since``: per skill (most called first) and per caller."""
    window = SkillExecution.objects.filter(created_at__gte=since)
    per_skill = (
        window.values("tool_name")
        .annotate(
            calls=Count("id"),
            failures=Count("id", filter=_FAILED),
            timeouts=Count("id", filter=Q(timed_out=True)),
        )
        .order_by("-calls", "tool_name")
    )
    durations = _durations(since)
    skills = [
        SkillCalls(
            tool_name=row["tool_name"],
            calls=int(row["calls"]),
            failures=int(row["failures"]),
            timeouts=int(row["timeouts"]),
            median_ms=_percentile(durations.get(row["tool_name"], []), 0.5),
            p90_ms=_percentile(durations.get(row["tool_name"], []), 0.9),
        )
        for row in per_skill
    ]
    pairs = window.values("principal", "tool_name")
    per_caller = pairs.annotate(calls=Count("id"), failures=Count("id", filter=_FAILED)).order_by(
        "-calls", "principal", "tool_name"
    )
    callers = [
        CallerCalls(*_caller(row["principal"]), row["tool_name"], row["calls"], row["failures"])
        for row in per_caller[:CALLER_ROWS]
    ]
    left_off = (
        pairs.order_by().distinct().count() - len(callers) if len(callers) == CALLER_ROWS else 0
    )
    return SkillUsage(skills=skills, callers=callers, callers_left_off=left_off)


def skill_calls_per_day(days: list[date], since: datetime) -> Series:
    """Skill executions per UTC day of their request, by outcome (succeeded, failed, other)."""
    return status_per_day(
        SkillExecution.objects.filter(created_at__gte=since),
        days,
        lambda status: status if status in OUTCOMES else "other",
        list(OUTCOMES),
    )
