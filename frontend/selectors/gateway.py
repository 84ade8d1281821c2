"""The gateway's settings as the Gateway page shows them (docs/gateway.md): model aliases, the
daily quotas in force with today's usage (per pattern, per employee), and each employee's chat
guardrails. Read-only; every figure comes from the rows the enforcing code reads."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from pydantic import ValidationError

from frontend.selectors.budgets import figure_text
from gateway.models import EmployeeChatSettings, TokenUsageDay
from loops.models import LoopPattern, UsageBucket
from loops.policy import PatternPolicy
from loops.services import budget_rules
from orchestrator.accounts.models import ApiToken
from orchestrator.agents.models import Employee, EmployeeUsageDay, ModelAlias
from orchestrator.agents.serializers import ModelAliasSerializer


@dataclass(frozen=True)
class QuotaRow:
    """One holder's daily quotas: ``[(metric, used today, limit)]`` as display text."""

    name: str
    figures: list[tuple[str, str, str]]


@dataclass(frozen=True)
class PatternGateway:
    """A pattern's gateway policies: its daily budgets used today, its semantic cache and its
    content-safety rules, as display text ("" where it sets none)."""

    key: str
    figures: list[tuple[str, str, str]]
    cache: str
    safety: str


def aliases() -> list[dict[str, Any]]:
    return list(
        ModelAliasSerializer(ModelAlias.objects.prefetch_related("employees"), many=True).data
    )


def _policy(pattern: LoopPattern) -> PatternPolicy | None:
    try:
        return PatternPolicy.model_validate(pattern.policy or {})
    except ValidationError:  # a row written before a rule it now breaks: shown as unreadable
        return None


def pattern_policies(now: datetime | None = None) -> list[PatternGateway]:
    """Patterns with a daily budget (``policy.budgets.daily``, used today against it), a
    semantic cache or content-safety rules."""
    now = now or datetime.now(UTC)
    found: list[tuple[LoopPattern, PatternPolicy, dict[str, Decimal], str]] = []
    for pattern in LoopPattern.objects.order_by("key"):
        policy = _policy(pattern)
        if policy is None:
            continue
        limits = budget_rules.limits_of(policy.budgets.daily)
        if limits or policy.semanticCache.enabled or policy.contentSafety:
            found.append((pattern, policy, limits, budget_rules.daily_scope(pattern.pk, now)))
    used = {
        (bucket.scope, bucket.metric): bucket.value
        for bucket in UsageBucket.objects.filter(scope__in=[row[3] for row in found])
    }
    return [
        PatternGateway(
            key=pattern.key,
            figures=_figures(limits, {metric: used.get((scope, metric)) for metric in limits}),
            cache=_cache_text(policy),
            safety=_safety_text(policy.contentSafety),
        )
        for pattern, policy, limits, scope in found
    ]


def _cache_text(policy: PatternPolicy) -> str:
    cache = policy.semanticCache
    if not cache.enabled:
        return ""
    return (
        f"similarity ≥ {cache.threshold}, kept {cache.ttlSeconds} s, embeddings by "
        f"{cache.embeddingEndpoint} ({cache.embeddingModel})"
    )


def _safety_text(config: dict[str, Any] | None) -> str:
    if not config:
        return ""
    return f"{len(config.get('input') or [])} input, {len(config.get('output') or [])} output rules"


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
        limits = {"tokens": employee.daily_token_quota, "cost": employee.daily_cost_quota}
        rows.append(QuotaRow(name=employee.username, figures=_figures(limits, _used(today))))
    return rows


def _figures(limits: Mapping[str, Any], used: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """``(metric, used today, limit)`` as display text, for each metric with a limit."""
    return [
        (metric, figure_text(metric, used.get(metric) or 0), figure_text(metric, limit))
        for metric, limit in limits.items()
        if limit is not None
    ]


def _used(today: EmployeeUsageDay | TokenUsageDay | None) -> dict[str, Any]:
    return {"tokens": today.tokens, "cost": today.cost} if today else {}


def token_quotas(now: datetime | None = None) -> list[QuotaRow]:
    """Live API tokens with a daily quota (named ``user/name (prefix)``), used today."""
    day = (now or datetime.now(UTC)).astimezone(UTC).date()
    holders = list(
        (
            ApiToken.objects.filter(daily_token_quota__isnull=False)
            | ApiToken.objects.filter(daily_cost_quota__isnull=False)
        )
        .filter(revoked_at__isnull=True)
        .select_related("user")
        .order_by("user__username", "name")
    )
    usage = {row.token_id: row for row in TokenUsageDay.objects.filter(day=day, token__in=holders)}
    rows = []
    for token in holders:
        today = usage.get(token.pk)
        limits = {"tokens": token.daily_token_quota, "cost": token.daily_cost_quota}
        name = f"{token.user.get_username()}/{token.name} ({token.prefix})"
        rows.append(QuotaRow(name=name, figures=_figures(limits, _used(today))))
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
