"""Budgets as the UI shows them: used against the limit, with a cue near and at the limit.

The figures come from ``loops.services.budgets``, as the API's: a run page reads
:func:`~loops.services.budgets.run_budget_usage` (what ``GET /api/runs/<id>`` reports as
``budget_usage``); the monitor, which may not query per row, parses each listed run's per-run
limits with :func:`~loops.services.budgets.limits_from_row` and reads the usage buckets of all
listed runs in one query. Read-only.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from loops.models import LoopRun, UsageBucket
from loops.services import budget_rules, budgets

#: From this share of a limit on, a figure is marked as near its limit.
NEAR = Decimal("0.8")
LABELS = {
    "invocations": "Invocations",
    "toolCalls": "Tool calls",
    "verifications": "Verifications",
    "tokens": "Tokens",
    "cost": "Cost",
}
#: The figures a monitor row shows against the run's own limits.
ROW_METRICS = budget_rules.METERED


def figure_text(metric: str, value: Decimal | float | int) -> str:
    """``1,471`` for units, ``0.0125`` / ``0.50`` for cost (4 decimals at most, 2 at least)."""
    number = Decimal(str(value))
    if metric != "cost":
        return f"{int(number):,}"
    text = f"{number.quantize(Decimal('0.0001')):f}".rstrip("0")
    whole, _, decimals = text.partition(".")
    return f"{whole}.{decimals.ljust(2, '0')}"


@dataclass(frozen=True)
class Figure:
    """One metric of one budget: used, and the limit (None: unbounded)."""

    metric: str
    used: Decimal
    limit: Decimal | None

    @property
    def label(self) -> str:
        return LABELS.get(self.metric, self.metric)

    @property
    def used_text(self) -> str:
        return figure_text(self.metric, self.used)

    @property
    def limit_text(self) -> str:
        return "" if self.limit is None else figure_text(self.metric, self.limit)

    @property
    def ratio(self) -> float:
        """Share of the limit used, 0..1 (a zero limit is used up from the start)."""
        if self.limit is None:
            return 0.0
        if self.limit <= 0:
            return 1.0
        return float(min(self.used / self.limit, Decimal(1)))

    @property
    def state(self) -> str:
        """``exhausted`` (no room left), ``near`` (≥ 80 %), or ``ok``."""
        if self.limit is None:
            return "ok"
        if self.used >= self.limit:
            return "exhausted"
        if self.limit > 0 and self.used >= self.limit * NEAR:
            return "near"
        return "ok"

    @property
    def percent(self) -> int:
        """Share of the limit used in percent (past 100 when a metered call crossed it)."""
        if self.limit is None or self.limit <= 0:
            return round(self.ratio * 100)
        return round(self.used / self.limit * 100)


@dataclass(frozen=True)
class Section:
    """The limited metrics of one budget scope (the run, or its pattern's day)."""

    kind: str
    title: str
    scope: str
    figures: list[Figure]


def _decimal(value: Any) -> Decimal:
    return budget_rules.amount(value or 0)


def run_budget_sections(run: LoopRun) -> list[Section]:
    """The run's budgets that have limits, per run then for its pattern's day (the API's
    figures: ``run_budget_usage``). Empty when neither has any limit."""
    usage = budgets.run_budget_usage(run)
    out = []
    titles = {budget_rules.PER_RUN: "This run", budget_rules.DAILY: "Pattern today (UTC)"}
    for kind in (budget_rules.PER_RUN, budget_rules.DAILY):
        section = usage.get(kind) or {}
        figures = [
            Figure(metric, _decimal(entry["used"]), _decimal(entry["limit"]))
            for metric in budget_rules.METRICS
            if (entry := section.get(metric)) and entry.get("limit") is not None
        ]
        if figures:
            out.append(Section(kind, titles[kind], str(section.get("scope", "")), figures))
    return out


def _per_run_limits(run: LoopRun) -> dict[str, Decimal]:
    """The run's own limits, from ``per_run_budget`` (annotated: the snapshot's
    ``budgets.perRun``), parsed by the same service as the engine's checks."""
    per_run = getattr(run, "per_run_budget", None)
    if not per_run:
        return {}
    snapshot = {"budgets": {"perRun": per_run}}
    return budget_rules.limits_from_row(run.id, run.pattern_id, snapshot, None).per_run


def attach_row_budgets(runs: Iterable[LoopRun]) -> None:
    """Set ``run.budget`` (metric → :class:`Figure`, limited metrics only) on each run: one
    query for the usage buckets of every listed run that has a tokens or cost limit."""
    listed = list(runs)
    limits = {run.id: _per_run_limits(run) for run in listed}
    bounded = {
        run_id: {m: v for m, v in found.items() if m in ROW_METRICS}
        for run_id, found in limits.items()
    }
    scopes = {budget_rules.run_scope(run_id): run_id for run_id, found in bounded.items() if found}
    used: dict[tuple[str, str], Decimal] = {}
    if scopes:
        rows = UsageBucket.objects.filter(
            scope__in=list(scopes), metric__in=list(ROW_METRICS)
        ).values_list("scope", "metric", "value")
        used = {(scope, metric): _decimal(value) for scope, metric, value in rows}
    for run in listed:
        scope = budget_rules.run_scope(run.id)
        run.budget = {  # type: ignore[attr-defined]
            metric: Figure(metric, used.get((scope, metric), Decimal(0)), limit)
            for metric, limit in bounded[run.id].items()
        }
