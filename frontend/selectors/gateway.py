"""The gateway's settings as the Gateway page shows them (docs/gateway.md): model aliases, the
daily quotas in force with today's usage (per pattern, per employee), and each employee's chat
guardrails. Read-only; every figure comes from the rows the enforcing code reads."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from pydantic import ValidationError

from frontend.selectors.budgets import figure_text
from gateway.models import EmployeeChatSettings
from loops.models import LoopPattern, UsageBucket
from loops.policy import PatternPolicy
from loops.services import budget_rules
from orchestrator.agents.models import Employee, EmployeeUsageDay, ModelAlias
from orchestrator.agents.serializers import ModelAliasSerializer


@dataclass(frozen=True)
class QuotaRow:
    """One holder's daily quotas: ``[(metric, used today, limit)]`` as display text."""

    name: str
    figures: list[tuple[str, str, str]]
    #: The pattern policy's gateway settings this page summarises (``semanticCache`` …).
    extras: dict[str, Any]


def aliases() -> list[dict[str, Any]]:
    return list(
        ModelAliasSerializer(ModelAlias.objects.prefetch_related("employees"), many=True).data
    )


def _policy(pattern: LoopPattern) -> PatternPolicy | None:
    try:
        return PatternPolicy.model_validate(pattern.policy or {})
    except ValidationError:  # a row written before a rule it now breaks: shown as unreadable
        return None


def pattern_quotas(now: datetime | None = None) -> list[QuotaRow]:
    """Patterns with a daily budget (``policy.budgets.daily``), used today against it."""
    now = now or datetime.now(UTC)
    rows: list[tuple[LoopPattern, dict[str, Decimal], str]] = []
    for pattern in LoopPattern.objects.order_by("key"):
        policy = _policy(pattern)
        limits = budget_rules.limits_of(policy.budgets.daily) if policy else {}
        if limits:
            rows.append((pattern, limits, budget_rules.daily_scope(pattern.pk, now)))
    used = {
        (bucket.scope, bucket.metric): bucket.value
        for bucket in UsageBucket.objects.filter(scope__in=[scope for _, _, scope in rows])
    }
    return [
        QuotaRow(
            name=pattern.key,
            figures=[
                (
                    metric,
                    figure_text(metric, used.get((scope, metric), Decimal(0))),
                    figure_text(metric, limit),
                )
                for metric, limit in limits.items()
            ],
            extras={},
        )
        for pattern, limits, scope in rows
    ]


def employee_quotas(now: datetime | None = None) -> list[QuotaRow]:
    """Employees with a daily token or cost quota, used today against it."""
    day = (now or datetime.now(UTC)).astimezone(UTC).date()
    holders = list(
        Employee.objects.filter(daily_token_quota__isnull=False)
        | Employee.objects.filter(daily_cost_quota__isnull=False)
    )
    usage = {
        row.username: row
        for row in EmployeeUsageDay.objects.filter(
            day=day, username__in=[e.username for e in holders]
        )
    }
    rows = []
    for employee in sorted(holders, key=lambda e: e.username):
        today = usage.get(employee.username)
        figures = []
        if employee.daily_token_quota is not None:
            used = today.tokens if today else 0
            figures.append(
                (
                    "tokens",
                    figure_text("tokens", used),
                    figure_text("tokens", employee.daily_token_quota),
                )
            )
        if employee.daily_cost_quota is not None:
            cost = today.cost if today else Decimal(0)
            figures.append(
                ("cost", figure_text("cost", cost), figure_text("cost", employee.daily_cost_quota))
            )
        rows.append(QuotaRow(name=employee.username, figures=figures, extras={}))
    return rows


def chat_guardrails() -> list[tuple[str, int, int]]:
    """``(employee, input rules, output rules)`` of every employee with chat guardrails."""
    out = []
    for row in EmployeeChatSettings.objects.select_related("employee").order_by(
        "employee__username"
    ):
        config = row.guardrails or {}
        counts = (len(config.get("input") or []), len(config.get("output") or []))
        if any(counts):
            out.append((row.employee.username, *counts))
    return out
