"""Fenced, durable step writes: each is one transaction that first proves the lease is held.

The engine's journal goes through :func:`tool_step_begin` for tool calls and
:func:`step_record` for finished steps; in the same transaction they apply the run's limits
(budgets: ``loops.services.budgets``; the tool-loop policy: ``loops.services.tool_repeats``), so a
crash never leaves a step without its count or a count without its step.

Each write with two paths chooses here, once: its batched path (``step_fast``) when the fast
path is available and the write is plain, else its exact path (``step_exact``).
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import Count
from django.utils import timezone

from loops import db
from loops.models import LoopStep, StepKind, StepStatus
from loops.services import budget_rules, budgets, step_exact, step_fast, step_sql, tool_repeats
from loops.services.harness_limits import HarnessLimits
from loops.services.step_fast import model_step_write
from loops.services.step_records import (
    ModelStep,
    ReadRule,
    ToolStart,
    finished_step,
    hash_of,
)
from loops.services.transitions import Lease, fenced_touch
from orchestrator.sql import fetch_all, uuid_param
from runtime.invocation import StepRecord


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
        call_hash=hash_of(kind, name, request),
    )
    return seq


def invocation_begin(
    lease: Lease,
    *,
    role: str,
    invocation: str,
    expected: budget_rules.RunLimits | None = None,
    harness: HarnessLimits | None = None,
) -> tuple[budget_rules.InvocationStart, dict[str, int]]:
    """:func:`budgets.budget_invocation_begin`, and the run's tool calls so far by hash (the
    journal's :meth:`ReadRule.runs_first` needs them).

    ``expected`` is the run's limits as the caller last read them: when they let the start go
    without a judgement, the batched path proves them unchanged in one statement. ``harness``:
    the role's harness limits, which the start must be judged by (the exact path)."""
    if db.fast_path_available() and harness is None:
        try:
            return step_fast.invocation_start(lease, role, invocation, expected)
        except db.NotPlain:
            pass
    start = budgets.budget_invocation_begin(
        lease, role=role, invocation=invocation, harness=harness
    )
    return start, call_counts(lease.run_id)


def call_counts(run_id: uuid.UUID) -> dict[str, int]:
    """How often each tool call (name and arguments, hashed) made more than once in the run
    so far was made: any other was made at most once (what ``DbJournal.runs_first`` needs,
    without reading a long run's every call at each start)."""
    rows = (
        LoopStep.objects.filter(run_id=run_id, kind=StepKind.TOOL, call_hash__isnull=False)
        .values_list("call_hash")
        .annotate(n=Count("id"))
        .filter(n__gt=1)
    )
    return {str(digest): int(n) for digest, n in rows}


def tool_step_begin(
    lease: Lease,
    *,
    role: str,
    invocation: str,
    name: str,
    request: dict[str, Any],
    idempotency_key: str = "",
    status: StepStatus = StepStatus.STARTED,
    model_step: ModelStep | None = None,
    expected: ReadRule | None = None,
    harness: HarnessLimits | None = None,
) -> ToolStart:
    """Persist a tool call about to run (or gated), under the run's limits.

    In order: the tool-loop policy (escalate raises ToolLoopEscalated; block persists the call
    as failed with the refusal as its result and returns it in ``refused``), then the budgets
    (a tool call; metered budgets must not be used up), raising BudgetExhausted.
    A raise persists and counts nothing of the call.

    ``model_step`` is the finished model step that made the call, numbered by the journal and
    written in the same transaction, before the call's step (it is persisted even when the call
    is refused or raises). ``expected`` is the run's rule as the caller last saw it;
    ``harness``: the role's harness limits, which the call must be judged by (the exact path).
    """
    digest = tool_repeats.call_hash(name, tool_repeats.arguments_of(request))
    row = step_sql.step_row(
        role=role,
        invocation=invocation,
        kind=StepKind.TOOL.value,
        status=status.value if isinstance(status, StepStatus) else status,
        name=name,
        idempotency_key=idempotency_key,
        request=request,
        lease_token=lease.token,
        call_hash=digest,
    )
    if db.fast_path_available() and harness is None:
        try:
            amounts = budget_rules.TOOL_CALL_AMOUNTS
            seq, rule = step_fast.tool_step(lease, row, digest, amounts, model_step, expected)
            return ToolStart(seq, started_at=row["started_at"], rule=rule)
        except db.NotPlain:
            pass
    if model_step is not None:
        model_step_write(lease, model_step)
    return step_exact.tool_step_begin_exact(lease, row=row, digest=digest, harness=harness)


def tool_step_record(
    lease: Lease,
    *,
    role: str,
    invocation: str,
    name: str,
    request: dict[str, Any],
    idempotency_key: str,
    response: Any,
    error: str,
    started_at: datetime,
    model_step: ModelStep | None = None,
    expected: ReadRule | None = None,
    harness: HarnessLimits | None = None,
) -> ToolStart:
    """Persist a read-effect call that has already run, with its result, in one write.

    A call that changes nothing needs no durable start (after a crash it simply runs again),
    so its step is written once, completed, with the model step that made it
    (``model_step``): one transaction for the whole tool-loop step. The run's limits are
    applied exactly as :func:`tool_step_begin` applies them, the result of a refused call
    being discarded: blocked, the step records the refusal (``refused``); escalated or out of
    budget, it raises and persists nothing of the call.

    A call with something to judge (a warning, a limit) takes the exact path: it comes back
    begun but not completed (``started_at`` set), and the caller completes it with the run's
    notice in its result.
    """
    now = timezone.now()
    digest = tool_repeats.call_hash(name, tool_repeats.arguments_of(request))
    row = step_sql.step_row(
        role=role,
        invocation=invocation,
        kind=StepKind.TOOL.value,
        status=(StepStatus.FAILED if error else StepStatus.COMPLETED).value,
        name=name,
        idempotency_key=idempotency_key,
        request=request,
        response=response,
        error=error,
        lease_token=lease.token,
        call_hash=digest,
        started_at=started_at,
        finished_at=now,
        duration_ms=max(0, int((now - started_at).total_seconds() * 1000)),
    )
    if db.fast_path_available() and harness is None:
        try:
            amounts = budget_rules.TOOL_CALL_AMOUNTS
            seq, rule = step_fast.tool_step(lease, row, digest, amounts, model_step, expected)
            return ToolStart(seq, rule=rule)
        except db.NotPlain:
            pass
    if model_step is not None:
        model_step_write(lease, model_step)
    begun = {**row, "status": StepStatus.STARTED.value, "response": None, "error": ""}
    return step_exact.tool_step_begin_exact(
        lease,
        row={**begun, "finished_at": None, "duration_ms": None},
        digest=digest,
        harness=harness,
    )


def step_complete(
    lease: Lease,
    seq: int,
    *,
    response: Any,
    error: str = "",
    tokens_in: int = 0,
    tokens_out: int = 0,
    cost: float = 0.0,
    started_at: datetime | None = None,
) -> None:
    """Record a step's result; a stale holder's result is refused by the fence.

    Tokens and cost a step reports are charged to the budgets once, when it first finishes.
    A caller that began the step itself passes its ``started_at``: a step with nothing to
    charge that was not approved (no approval to record) then takes the batched path."""
    if db.fast_path_available():
        try:
            charged = bool(tokens_in or tokens_out or cost)
            step_fast.step_complete(
                lease, seq, response=response, error=error, started_at=started_at, charged=charged
            )
            return
        except db.NotPlain:
            pass
    step_exact.step_complete_exact(
        lease, seq, response=response, error=error, tokens=(tokens_in, tokens_out), cost=cost
    )


@transaction.atomic
def step_ask(lease: Lease, seq: int, *, question: str) -> None:
    """A started or approved tool call asked a person a question: its step becomes ``gated``
    again, its ``request`` carrying the question (``input_request``, ``gate_reason``) and no
    earlier answer. The engine then parks the run as for any gated call."""
    fenced_touch(lease)
    step = LoopStep.objects.select_for_update().get(run_id=lease.run_id, seq=seq)
    if step.status not in (StepStatus.STARTED, StepStatus.APPROVED):
        raise ValueError(f"step {seq} is {step.status}: only a running call can ask")
    request = {k: v for k, v in (step.request or {}).items() if k != "answer"}
    step.request = {**request, "input_request": question, "gate_reason": question}
    step.status = StepStatus.GATED
    step.save(update_fields=["request", "status"])


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
    a shared daily budget): :func:`model_step_write`. A tool step (a call answered without
    running) counts for the tool-loop policy and may raise ToolLoopEscalated, persisting
    nothing."""
    step = finished_step(
        lease,
        role=role,
        invocation=invocation,
        kind=kind,
        name=name,
        request=request,
        response=response,
        error=error,
        tokens_in=tokens_in,
        tokens_out=tokens_out,
        cost=cost,
        duration_ms=duration_ms,
    )
    if kind != StepKind.MODEL:
        return step_exact.step_record_exact(lease, step.row)
    seq, _ = model_step_write(lease, step)
    return seq


def steps_of_invocation(run_id: uuid.UUID, invocation: str) -> list[StepRecord]:
    """The invocation's journal in order (a resume replays it): the columns it needs, read
    as rows and their JSON decoded here, with no model instances and none of the ORM's
    per-value converters."""
    rows = fetch_all(step_sql.STEPS_OF_INVOCATION, [uuid_param(run_id), invocation])
    return [record_of_row(row) for row in rows]


def record_of_row(row: tuple[Any, ...]) -> StepRecord:
    """A row of ``step_sql.STEPS_OF_INVOCATION``'s columns as the journal returns it."""
    seq, kind, status, name, key, request, response, error = row
    return StepRecord(
        seq, kind, status, name, key, db.json_value(request), db.json_value(response), error
    )
