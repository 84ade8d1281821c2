"""Usage charged to the budgets' buckets through the engine's own service, for pages that read
them (the Metrics page) without driving a whole run."""

from __future__ import annotations

from datetime import datetime

from loops.models import LoopRun
from loops.services import budget_rules, budgets


def charge(
    run: LoopRun,
    *,
    tokens: int = 0,
    cost: float = 0.0,
    tool_calls: int = 0,
    invocations: int = 0,
    at: datetime | None = None,
) -> None:
    """Charge the run and its pattern's UTC day of ``at`` (now by default) as the step writes
    do: ``budgets.budget_charge`` for tokens and cost, ``budgets.budget_take`` for the counts."""
    limits = budgets.run_limits(run.id, now=at)
    for _ in range(tool_calls):
        budgets.budget_take(limits, budget_rules.TOOL_CALL_AMOUNTS)
    for _ in range(invocations):
        budgets.budget_take(limits, budget_rules.invocation_amounts("maker"))
    if tokens or cost:
        budgets.budget_charge(limits, tokens=tokens, cost=cost, release_admission=False)
