"""Fenced, durable step writes: each is one transaction that first proves the lease is held.

The engine's journal goes through :func:`tool_step_begin` for tool calls and
:func:`step_record` for finished steps; in the same transaction they apply the run's limits
(budgets: ``loops.services.budgets``; the tool-loop policy: ``loops.services.toolloop``), so a
crash never leaves a step without its count or a count without its step.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.db import transaction
from django.utils import timezone

from loops.invokers import StepRecord
from loops.models import LoopEvent, LoopStep, StepKind, StepStatus
from loops.services import budgets, toolloop
from loops.services.transitions import Lease, fenced_touch


def _cost(value: float) -> Decimal:
    return Decimal(str(round(value, 6)))


@transaction.atomic
def step_begin(
    lease: Lease,
    *,
    role: str,
    invocation: str,
    kind: str,
    name: str,
    request: dict[str, Any],
    idempotency_key: str = "",
    status: StepStatus = StepStatus.STARTED,
) -> int:
    """Persist a step before its effect happens (or a gated call); returns its seq.

    No limits are applied here: the engine's journal begins tool calls with
    :func:`tool_step_begin`."""
    seq, _ = fenced_touch(lease, step_increment=1)
    LoopStep.objects.create(
        run_id=lease.run_id,
        seq=seq,
        role=role,
        invocation=invocation,
        kind=kind,
        status=status,
        name=name,
        idempotency_key=idempotency_key,
        request=request,
        lease_token=lease.token,
        call_hash=_hash_of(kind, name, request),
    )
    return seq


def _hash_of(kind: str, name: str, request: Any) -> str | None:
    if kind != StepKind.TOOL:
        return None
    return toolloop.call_hash(
        name, toolloop.arguments_of(request if isinstance(request, dict) else {})
    )


@dataclass(frozen=True)
class ToolStart:
    """What :func:`tool_step_begin` made of a call: its step, and either the result the model
    gets instead of running it (``refused``) or a notice for its result."""

    seq: int
    refused: str = ""
    notice: str = ""


@transaction.atomic
def tool_step_begin(
    lease: Lease,
    *,
    role: str,
    invocation: str,
    name: str,
    request: dict[str, Any],
    idempotency_key: str = "",
    status: StepStatus = StepStatus.STARTED,
) -> ToolStart:
    """Persist a tool call about to run (or gated), under the run's limits.

    In order: the tool-loop policy (escalate raises ToolLoopEscalated; block persists the call
    as failed with the refusal as its result and returns it in ``refused``), then the budgets
    (a tool call, a delegation; metered budgets must not be used up), raising BudgetExhausted.
    A raise persists and counts nothing.
    """
    seq, _ = fenced_touch(lease, step_increment=1)
    limits = budgets.run_limits(lease.run_id)
    digest = toolloop.call_hash(name, toolloop.arguments_of(request))
    count = toolloop.occurrence(lease.run_id, digest)
    verdict = toolloop.judge(count, limits.tool_loop)
    step = LoopStep(
        run_id=lease.run_id,
        seq=seq,
        role=role,
        invocation=invocation,
        kind=StepKind.TOOL,
        status=status,
        name=name,
        idempotency_key=idempotency_key,
        request=request,
        lease_token=lease.token,
        call_hash=digest,
    )
    policy = limits.tool_loop
    if verdict is toolloop.Verdict.ESCALATE:
        raise toolloop.escalation(name, count, policy)
    if verdict is toolloop.Verdict.BLOCK:
        # Never run, so not a tool call for the budgets; the model gets the refusal.
        content = toolloop.block_message(name, count, policy)
        step.status, step.error = StepStatus.FAILED, content
        step.response = {"content": content, "disposition": "blocked"}
        step.finished_at = timezone.now()
        step.save(force_insert=True)
        step_event(
            lease, type="toolloop.blocked", data=toolloop.event_data(name, count, policy, seq)
        )
        return ToolStart(seq, refused=content)
    budgets.budget_take(limits, budgets.tool_call_amounts(name))
    budgets.require_room(limits)
    step.save(force_insert=True)
    if verdict is toolloop.Verdict.WARN:
        step_event(
            lease, type="toolloop.warning", data=toolloop.event_data(name, count, policy, seq)
        )
        return ToolStart(seq, notice=toolloop.warning_notice(name, count, policy))
    return ToolStart(seq)


@transaction.atomic
def step_complete(
    lease: Lease,
    seq: int,
    *,
    response: Any,
    error: str = "",
    tokens_in: int = 0,
    tokens_out: int = 0,
    cost: float = 0.0,
) -> None:
    """Record a step's result; a stale holder's result is refused by the fence.

    Tokens and cost a step reports are charged to the budgets once, when it first finishes."""
    fenced_touch(lease)
    step = LoopStep.objects.select_for_update().get(run_id=lease.run_id, seq=seq)
    if step.finished_at is None and (tokens_in or tokens_out or cost):
        budgets.budget_charge(
            budgets.run_limits(lease.run_id), tokens=tokens_in + tokens_out, cost=cost
        )
    if step.status == StepStatus.APPROVED:
        from loops.services.approvals import approval_record_execution

        approval_record_execution(
            run_id=lease.run_id, step_seq=seq, arguments=step.request.get("arguments")
        )
    now = timezone.now()
    step.status = StepStatus.FAILED if error else StepStatus.COMPLETED
    step.response = response
    step.error = error
    step.tokens_in, step.tokens_out, step.cost = tokens_in, tokens_out, _cost(cost)
    step.finished_at = now
    step.duration_ms = max(0, int((now - step.started_at).total_seconds() * 1000))
    step.lease_token = lease.token
    step.save(
        update_fields=[
            "status",
            "response",
            "error",
            "tokens_in",
            "tokens_out",
            "cost",
            "finished_at",
            "duration_ms",
            "lease_token",
        ]
    )


@transaction.atomic
def step_record(
    lease: Lease,
    *,
    role: str,
    invocation: str,
    kind: str,
    name: str,
    request: dict[str, Any],
    response: Any,
    error: str = "",
    tokens_in: int = 0,
    tokens_out: int = 0,
    cost: float = 0.0,
    duration_ms: int | None = None,
) -> int:
    """Persist an already finished step in one write (model calls, reads).

    A model step charges its tokens and cost to the budgets (and ends the run's admission on
    a shared daily budget). A tool step (a call answered without running) counts for the
    tool-loop policy and may raise ToolLoopEscalated, persisting nothing."""
    seq, _ = fenced_touch(lease, step_increment=1)
    digest = _hash_of(kind, name, request)
    if kind == StepKind.MODEL:
        budgets.budget_charge(
            budgets.run_limits(lease.run_id), tokens=tokens_in + tokens_out, cost=cost
        )
    elif digest is not None:
        _judge_answered(lease, name, digest, seq)
    LoopStep.objects.create(
        run_id=lease.run_id,
        seq=seq,
        role=role,
        invocation=invocation,
        kind=kind,
        status=StepStatus.FAILED if error else StepStatus.COMPLETED,
        name=name,
        request=request,
        response=response,
        error=error,
        tokens_in=tokens_in,
        tokens_out=tokens_out,
        cost=_cost(cost),
        lease_token=lease.token,
        finished_at=timezone.now(),
        duration_ms=duration_ms,
        call_hash=digest,
    )
    return seq


def _judge_answered(lease: Lease, name: str, digest: str, seq: int) -> None:
    """The tool-loop policy for a call the invoker answered without running it: it counts,
    warns from ``warnAt`` and escalates at ``escalateAt`` (there is nothing to block)."""
    policy = budgets.run_limits(lease.run_id).tool_loop
    count = toolloop.occurrence(lease.run_id, digest)
    verdict = toolloop.judge(count, policy)
    if verdict is toolloop.Verdict.ESCALATE:
        raise toolloop.escalation(name, count, policy)
    if verdict is not toolloop.Verdict.OK:
        step_event(
            lease,
            type="toolloop.warning",
            data=toolloop.event_data(name, count, policy, seq),
        )


@transaction.atomic
def step_event(lease: Lease, *, type: str, data: dict[str, Any]) -> int:
    _, seq = fenced_touch(lease, event_increment=1)
    LoopEvent.objects.create(run_id=lease.run_id, seq=seq, type=type, actor=lease.owner, data=data)
    return seq


def steps_of_invocation(run_id: uuid.UUID, invocation: str) -> list[StepRecord]:
    rows = LoopStep.objects.filter(run_id=run_id, invocation=invocation).order_by("seq")
    return [
        StepRecord(
            seq=s.seq,
            kind=s.kind,
            status=s.status,
            name=s.name,
            idempotency_key=s.idempotency_key,
            request=s.request,
            response=s.response,
            error=s.error,
        )
        for s in rows
    ]
