"""The exact paths of the step writes: every limit judged, one statement after the other.

A store function in ``loops.services.steps`` takes one when its batched path (``step_fast``)
does not apply; each is one fenced transaction, so a refusal rolls back all of the write.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from loops.models import LoopEvent, LoopStep, StepStatus
from loops.policy import ToolLoopPolicy
from loops.services import budget_rules, budgets, step_sql, tool_repeats
from loops.services.approvals import approval_record_execution
from loops.services.harness_limits import HarnessLimits, tightened
from loops.services.step_records import ToolStart, cost_of
from loops.services.transitions import Lease, fenced_touch
from orchestrator.sql import execute, fetch_all


def _insert_step(lease: Lease, **values: Any) -> datetime:
    """INSERT one step row of the fenced run, its seq the run's current ``step_count`` (the
    caller's fence just raised it); returns its ``started_at``."""
    row = step_sql.step_row(**values)
    execute(*step_sql.insert_step(lease, row))
    started: datetime = row["started_at"]
    return started


def _occurrence(lease: Lease, digest: str) -> int:
    """:func:`tool_repeats.occurrence` in one plain statement (earlier tool steps of the run with
    the same call hash, + 1)."""
    rows = fetch_all(*step_sql.occurrences(lease, digest))
    return int(rows[0][0]) + 1


def _touch(
    lease: Lease, *, step_increment: int = 0, release_admission: bool = False
) -> tuple[int, budget_rules.RunLimits]:
    """The fence and the run's limits in one statement (:func:`budgets.fenced_limits`)."""
    seq, _, limits = budgets.fenced_limits(
        lease, step_increment=step_increment, release_admission=release_admission
    )
    return seq, limits


@transaction.atomic
def tool_step_begin_exact(
    lease: Lease, *, row: dict[str, Any], digest: str, harness: HarnessLimits | None = None
) -> ToolStart:
    """``steps.tool_step_begin`` with every limit judged, one statement after the other (the
    role's ``harness`` limits with the budgets, when given)."""
    seq, limits = _touch(lease, step_increment=1)
    name = row["name"]
    count = _occurrence(lease, digest)
    verdict = tool_repeats.judge(count, limits.tool_loop)
    policy = limits.tool_loop
    if verdict is tool_repeats.RepeatVerdict.ESCALATE:
        raise tool_repeats.escalation(name, count, policy)
    if verdict is tool_repeats.RepeatVerdict.BLOCK:
        # Never run, so not a tool call for the budgets; the model gets the refusal.
        content = tool_repeats.block_message(name, count, policy)
        blocked = {
            **row,
            "status": StepStatus.FAILED.value,
            "error": content,
            "response": {"content": content, "disposition": "blocked"},
            "finished_at": timezone.now(),
        }
        _insert_step(lease, **blocked)
        step_event(
            lease, type="toolloop.blocked", data=tool_repeats.event_data(name, count, policy, seq)
        )
        return ToolStart(seq, refused=content)
    started_at = _insert_step(lease, **row)
    # The counts last: the pattern's day is a row every run of the pattern writes, so its lock
    # is taken as late as possible (a refusal rolls the step back with the rest).
    judged = tightened(limits, harness)
    budgets.budget_take(judged, budget_rules.TOOL_CALL_AMOUNTS)
    budgets.require_room(judged)
    if verdict is tool_repeats.RepeatVerdict.WARN:
        step_event(
            lease, type="toolloop.warning", data=tool_repeats.event_data(name, count, policy, seq)
        )
        notice = tool_repeats.warning_notice(name, count, policy)
        return ToolStart(seq, notice=notice, started_at=started_at)
    return ToolStart(seq, started_at=started_at)


@transaction.atomic
def step_complete_exact(
    lease: Lease, seq: int, *, response: Any, error: str, tokens: tuple[int, int], cost: float
) -> None:
    """``steps.step_complete`` for a step with something to charge or an approval to record."""
    fenced_touch(lease)
    tokens_in, tokens_out = tokens
    step_id, status, finished_at, began = (
        LoopStep.objects.select_for_update()
        .filter(run_id=lease.run_id, seq=seq)
        .values_list("id", "status", "finished_at", "started_at")
        .get()
    )
    if finished_at is None and (tokens_in or tokens_out or cost):
        budgets.budget_charge(
            budgets.run_limits(lease.run_id), tokens=tokens_in + tokens_out, cost=cost
        )
    if status == StepStatus.APPROVED:
        request = LoopStep.objects.values_list("request", flat=True).get(pk=step_id)
        approval_record_execution(
            run_id=lease.run_id, step_seq=seq, arguments=(request or {}).get("arguments")
        )
    result = step_sql.step_result(
        lease,
        now=timezone.now(),
        started_at=began,
        response=response,
        error=error,
        tokens_in=tokens_in,
        tokens_out=tokens_out,
        cost=cost_of(cost),
    )
    LoopStep.objects.filter(pk=step_id).update(**result)


@transaction.atomic
def step_record_exact(lease: Lease, row: dict[str, Any]) -> int:
    """``steps.step_record`` of a step the tool-loop policy counts (a tool call answered
    without running) or a notice."""
    seq, limits = _touch(lease, step_increment=1)
    digest = row["call_hash"]
    if digest is not None:
        _judge_answered(lease, row["name"], digest, seq, limits.tool_loop)
    _insert_step(lease, **row)
    return seq


def _judge_answered(lease: Lease, name: str, digest: str, seq: int, policy: ToolLoopPolicy) -> None:
    """The tool-loop policy for a call the invoker answered without running it: it counts,
    warns from ``warnAt`` and escalates at ``escalateAt`` (there is nothing to block)."""
    count = tool_repeats.occurrence(lease.run_id, digest)
    verdict = tool_repeats.judge(count, policy)
    if verdict is tool_repeats.RepeatVerdict.ESCALATE:
        raise tool_repeats.escalation(name, count, policy)
    if verdict is not tool_repeats.RepeatVerdict.OK:
        step_event(
            lease,
            type="toolloop.warning",
            data=tool_repeats.event_data(name, count, policy, seq),
        )


@transaction.atomic
def step_event(lease: Lease, *, type: str, data: dict[str, Any]) -> int:
    _, seq = fenced_touch(lease, event_increment=1)
    LoopEvent.objects.create(run_id=lease.run_id, seq=seq, type=type, actor=lease.owner, data=data)
    return seq
