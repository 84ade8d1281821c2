"""Fenced, durable step writes: each is one transaction that first proves the lease is held."""

from __future__ import annotations

import uuid
from decimal import Decimal
from typing import Any

from django.db import transaction
from django.utils import timezone

from loops.invokers import StepRecord
from loops.models import LoopEvent, LoopStep, StepStatus
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
    """Persist a step before its effect happens (or a gated call); returns its seq."""
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
    )
    return seq


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
    """Record a step's result; a stale holder's result is refused by the fence."""
    fenced_touch(lease)
    step = LoopStep.objects.select_for_update().get(run_id=lease.run_id, seq=seq)
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
    """Persist an already finished step in one write (model calls, reads)."""
    seq, _ = fenced_touch(lease, step_increment=1)
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
    )
    return seq


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
