"""The role's compiled harness at the engine's checkpoints (``loops.services.harness_limits``).

At an invocation's start, on the database threads (:func:`invocation_open`): the run's working
time against ``limits.timeoutMs`` (the invocation's deadline is what is left of it), the run's
usage of the metrics the harness bounds (the journal's tally), and the start itself, judged by
``limits.maxInvocations`` when the tally says it could reach it. Around the invocation
(:func:`within`): the deadline. At the run's start: ``isolation`` (:func:`isolation_fail`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, TypeVar

from django.utils import timezone

from loops.models import RunStatus
from loops.services import budget_rules, budgets
from loops.services import steps as step_services
from loops.services.endings import run_transition
from loops.services.harness_limits import (
    TIMEOUT,
    Deadline,
    HarnessLimits,
    bound_of,
    harness_limits_of,
    isolation_refusal,
    working_seconds,
)
from loops.services.transitions import Lease, run_status_changes
from runtime.invocation import HarnessLimitReached, LoopRole

T = TypeVar("T")

#: The event of a run a harness limit ended.
HARNESS_EVENT = "harness.limit_reached"
#: The code of a run whose working time ran out (``within`` stopped its invocation).
TIMEOUT_CODE = f"harness_limit:{TIMEOUT}"


@dataclass(frozen=True)
class Opened:
    """What an invocation's start found: the start (``step_services.invocation_begin``), the
    run's tool calls by hash, its usage of the harness-bound metrics (None: none bound) and
    the invocation's deadline (None: no ``limits.timeoutMs``)."""

    start: budget_rules.InvocationStart
    calls: dict[str, int]
    usage: dict[str, Decimal] | None
    deadline: Deadline | None


def worked(run_id: Any) -> float:
    """Seconds the run has worked so far (running, verifying), from its status changes."""
    return working_seconds(run_status_changes(run_id), timezone.now())


def invocation_open(
    lease: Lease,
    role: LoopRole,
    name: str,
    expected: budget_rules.RunLimits | None,
    harness: HarnessLimits,
    snapshot: dict[str, Any],
) -> Opened:
    """Start (or resume) an invocation under its role's harness: past ``limits.timeoutMs`` of
    working time it raises HarnessLimitReached before anything is counted."""
    deadline = None
    timeout = bound_of(snapshot, TIMEOUT)
    if timeout is not None:
        deadline = Deadline(timeout, worked(lease.run_id))
        if deadline.seconds <= 0:
            raise deadline.reached(deadline.worked)
    usage = None
    judge = None
    amounts = budget_rules.invocation_amounts(role.value)
    if harness.bounds:
        usage = budgets.usage(budget_rules.run_scope(lease.run_id), sorted(harness.bounds))
        # As the budgets judge a start: its units, and room left in tokens and cost.
        judge = harness if harness.near(usage, {**amounts, "tokens": 0, "cost": 0}) else None
    start, calls = step_services.invocation_begin(
        lease, role=role.value, invocation=name, expected=expected, harness=judge
    )
    if start.started and usage is not None:
        for metric, n in amounts.items():
            if metric in usage:
                usage[metric] += n
    return Opened(start, calls, usage, deadline)


async def within(deadline: Deadline | None, work: Awaitable[T]) -> T:
    """``work``, stopped at the invocation's deadline (HarnessLimitReached)."""
    if deadline is None:
        return await work
    try:
        async with asyncio.timeout(deadline.seconds) as scope:
            return await work
    except TimeoutError:
        if scope.expired():
            raise deadline.reached(deadline.worked + deadline.seconds) from None
        raise


def isolation_fail(lease: Lease, snapshots: dict[str, Any], repository: dict[str, Any]) -> bool:
    """End the run failed when a role's snapshot requires a git worktree and the pattern has
    no repository (:func:`harness_limits.isolation_refusal`); whether it did."""
    refusal = isolation_refusal(snapshots or {}, repository or {})
    if refusal is None:
        return False
    harness_fail(lease, refusal)
    return True


def harness_fail(lease: Lease, halt: HarnessLimitReached) -> None:
    run_transition(
        run_id=lease.run_id,
        to=RunStatus.FAILED,
        actor=lease.owner,
        lease=lease,
        event_type=HARNESS_EVENT,
        data={"code": halt.code, "reason": halt.reason, **halt.data},
        fields={"terminal_reason": halt.code, "failure_reason": halt.reason},
    )


__all__ = [
    "HARNESS_EVENT",
    "TIMEOUT_CODE",
    "Opened",
    "harness_fail",
    "harness_limits_of",
    "invocation_open",
    "isolation_fail",
    "within",
    "worked",
]
