"""Fenced, durable step writes: each is one transaction that first proves the lease is held.

The engine's journal goes through :func:`tool_step_begin` for tool calls and
:func:`step_record` for finished steps; in the same transaction they apply the run's limits
(budgets: ``loops.services.budgets``; the tool-loop policy: ``loops.services.toolloop``), so a
crash never leaves a step without its count or a count without its step.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from loops import db
from loops.invokers import StepRecord
from loops.models import LoopEvent, LoopStep, StepKind, StepStatus
from loops.policy import ToolLoopPolicy
from loops.services import budgets, toolloop
from loops.services.transitions import Lease, fenced_touch


def _cost(value: float) -> Decimal:
    return Decimal(str(round(value, 6)))


# --- step rows without the ORM's per-statement overhead ------------------------------------------
#
# The journal writes two step rows and completes one per tool-loop step; building those through
# the ORM (model instance, compiler) costs more CPU than the database takes to run them. These
# write the same rows: each value is prepared by its model field (``get_db_prep_save``: JSON,
# dates, decimals, UUIDs as the vendor stores them), only the statement is built once.

_STEP_COLUMNS = (
    "run",
    "seq",
    "role",
    "invocation",
    "kind",
    "status",
    "name",
    "idempotency_key",
    "request",
    "response",
    "error",
    "tokens_in",
    "tokens_out",
    "cost",
    "lease_token",
    "call_hash",
    "started_at",
    "finished_at",
    "duration_ms",
)
_RESULT_COLUMNS = (
    "status",
    "response",
    "error",
    "tokens_in",
    "tokens_out",
    "cost",
    "finished_at",
    "duration_ms",
    "lease_token",
)


def _field(name: str) -> Any:
    return LoopStep._meta.get_field(name)


def _column(name: str) -> str:
    return str(connection.ops.quote_name(_field(name).column))


def _prepared(values: dict[str, Any], names: tuple[str, ...]) -> list[Any]:
    return [_field(name).get_db_prep_save(values[name], connection) for name in names]


def _insert_step(**values: Any) -> datetime:
    """INSERT one step row (every column given or defaulted as the model does); returns its
    ``started_at``."""
    row: dict[str, Any] = {
        "name": "",
        "idempotency_key": "",
        "request": {},
        "response": None,
        "error": "",
        "tokens_in": 0,
        "tokens_out": 0,
        "cost": Decimal(0),
        "lease_token": 0,
        "call_hash": None,
        "started_at": timezone.now(),
        "finished_at": None,
        "duration_ms": None,
        **values,
    }
    columns = ", ".join(_column(name) for name in _STEP_COLUMNS)
    sql = (
        f"INSERT INTO {LoopStep._meta.db_table} ({columns}) "  # noqa: S608 (model metadata)
        f"VALUES ({db.placeholders(_STEP_COLUMNS)})"
    )
    db.execute(sql, _prepared(row, _STEP_COLUMNS))
    started: datetime = row["started_at"]
    return started


def _complete_unless_approved(lease: Lease, seq: int, result: dict[str, Any]) -> bool:
    """Set a step's result in one UPDATE unless it is an approved call (whose execution must
    be recorded too); True when it was set."""
    assignments = ", ".join(f"{_column(name)} = %s" for name in _RESULT_COLUMNS)
    sql = (
        f"UPDATE {LoopStep._meta.db_table} SET {assignments} "  # noqa: S608 (model metadata)
        "WHERE run_id = %s AND seq = %s AND status <> %s"
    )
    params = [*_prepared(result, _RESULT_COLUMNS), db.uuid_param(lease.run_id), seq]
    return db.execute(sql, [*params, StepStatus.APPROVED.value]) == 1


def _occurrence(run_id: uuid.UUID, digest: str) -> int:
    """:func:`toolloop.occurrence` in one plain statement (earlier tool steps of the run with
    the same call hash, + 1)."""
    rows = db.fetch_all(
        f"SELECT COUNT(*) FROM {LoopStep._meta.db_table} "  # noqa: S608 (model metadata)
        "WHERE run_id = %s AND call_hash = %s AND kind = %s",
        [db.uuid_param(run_id), digest, StepKind.TOOL.value],
    )
    return int(rows[0][0]) + 1


def _touch(
    lease: Lease, *, step_increment: int = 0, release_admission: bool = False
) -> tuple[int, budgets.RunLimits]:
    """The fence and the run's limits in one statement (:func:`budgets.fenced_limits`)."""
    seq, _, limits = budgets.fenced_limits(
        lease, step_increment=step_increment, release_admission=release_admission
    )
    return seq, limits


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
    #: When the step began (its ``started_at``), for :func:`step_complete`'s one-statement path.
    started_at: datetime | None = None


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
    seq, limits = _touch(lease, step_increment=1)
    digest = toolloop.call_hash(name, toolloop.arguments_of(request))
    count = _occurrence(lease.run_id, digest)
    verdict = toolloop.judge(count, limits.tool_loop)
    step: dict[str, Any] = {
        "run": lease.run_id,
        "seq": seq,
        "role": role,
        "invocation": invocation,
        "kind": StepKind.TOOL.value,
        "status": status.value if isinstance(status, StepStatus) else status,
        "name": name,
        "idempotency_key": idempotency_key,
        "request": request,
        "lease_token": lease.token,
        "call_hash": digest,
    }
    policy = limits.tool_loop
    if verdict is toolloop.Verdict.ESCALATE:
        raise toolloop.escalation(name, count, policy)
    if verdict is toolloop.Verdict.BLOCK:
        # Never run, so not a tool call for the budgets; the model gets the refusal.
        content = toolloop.block_message(name, count, policy)
        blocked = {
            **step,
            "status": StepStatus.FAILED.value,
            "error": content,
            "response": {"content": content, "disposition": "blocked"},
            "finished_at": timezone.now(),
        }
        _insert_step(**blocked)
        step_event(
            lease, type="toolloop.blocked", data=toolloop.event_data(name, count, policy, seq)
        )
        return ToolStart(seq, refused=content)
    started_at = _insert_step(**step)
    # The counts last: the pattern's day is a row every run of the pattern writes, so its lock
    # is taken as late as possible (a refusal rolls the step back with the rest).
    budgets.budget_take(limits, budgets.tool_call_amounts(name))
    budgets.require_room(limits)
    if verdict is toolloop.Verdict.WARN:
        step_event(
            lease, type="toolloop.warning", data=toolloop.event_data(name, count, policy, seq)
        )
        notice = toolloop.warning_notice(name, count, policy)
        return ToolStart(seq, notice=notice, started_at=started_at)
    return ToolStart(seq, started_at=started_at)


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
    started_at: datetime | None = None,
) -> None:
    """Record a step's result; a stale holder's result is refused by the fence.

    Tokens and cost a step reports are charged to the budgets once, when it first finishes.
    A caller that began the step itself passes its ``started_at``: a step with nothing to
    charge that was not approved (no approval to record) is then completed in one UPDATE."""
    fenced_touch(lease)
    now = timezone.now()
    if started_at is not None and not (tokens_in or tokens_out or cost):
        result = _result(lease, now, started_at, response, error, tokens_in, tokens_out, 0.0)
        if _complete_unless_approved(lease, seq, result):
            return
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
        from loops.services.approvals import approval_record_execution

        request = LoopStep.objects.values_list("request", flat=True).get(pk=step_id)
        approval_record_execution(
            run_id=lease.run_id, step_seq=seq, arguments=(request or {}).get("arguments")
        )
    LoopStep.objects.filter(pk=step_id).update(
        **_result(lease, now, began, response, error, tokens_in, tokens_out, cost)
    )


def _result(
    lease: Lease,
    now: datetime,
    started_at: datetime,
    response: Any,
    error: str,
    tokens_in: int,
    tokens_out: int,
    cost: float,
) -> dict[str, Any]:
    """The columns a step's completion sets."""
    return {
        "status": (StepStatus.FAILED if error else StepStatus.COMPLETED).value,
        "response": response,
        "error": error,
        "tokens_in": tokens_in,
        "tokens_out": tokens_out,
        "cost": _cost(cost),
        "finished_at": now,
        "duration_ms": max(0, int((now - started_at).total_seconds() * 1000)),
        "lease_token": lease.token,
    }


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
    is_model = kind == StepKind.MODEL
    seq, limits = _touch(lease, step_increment=1, release_admission=is_model)
    digest = _hash_of(kind, name, request)
    if not is_model and digest is not None:
        _judge_answered(lease, name, digest, seq, limits.tool_loop)
    now = timezone.now()
    _insert_step(
        run=lease.run_id,
        seq=seq,
        role=role,
        invocation=invocation,
        kind=kind,
        status=(StepStatus.FAILED if error else StepStatus.COMPLETED).value,
        name=name,
        request=request,
        response=response,
        error=error,
        tokens_in=tokens_in,
        tokens_out=tokens_out,
        cost=_cost(cost),
        lease_token=lease.token,
        started_at=now,
        finished_at=now,
        duration_ms=duration_ms,
        call_hash=digest,
    )
    if is_model:
        # Last, like every count: the pattern's day is a row all its runs write.
        budgets.budget_charge(
            limits, tokens=tokens_in + tokens_out, cost=cost, release_admission=False
        )
    return seq


def _judge_answered(lease: Lease, name: str, digest: str, seq: int, policy: ToolLoopPolicy) -> None:
    """The tool-loop policy for a call the invoker answered without running it: it counts,
    warns from ``warnAt`` and escalates at ``escalateAt`` (there is nothing to block)."""
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
