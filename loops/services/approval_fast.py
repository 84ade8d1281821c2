"""The batched path of a decision on an approval: one transaction of two round trips.

The first locks the run, the approval and its gated step (in the order the exact path and
``run_transition`` lock them) and counts the run's other pending approvals; the decision is
judged on those rows (``approval_decisions``); the second writes the approval, the step, the
decision's event and, when nothing else is pending, the run's re-queue with its event, and
commits. A run the exact path must judge (one in a wait, or still held by a worker) raises
:class:`loops.db.NotPlain` with nothing written.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.db import connection
from django.db.models import Model
from django.utils import timezone

from loops import db
from loops.models import ActionApproval, LoopEvent, LoopPattern, LoopRun, LoopStep, RunStatus
from loops.orm_private import set_clause
from loops.services.approval_decisions import (
    DECIDED_FIELDS,
    DecisionAsked,
    decided,
    step_rewritten,
)
from loops.services.nudges import nudge_run
from orchestrator import wakeups

#: The run's columns the decision reads (its lock, its checks, the answer's serializer).
_RUN_COLUMNS = (
    "id",
    "status",
    "event_seq",
    "wait",
    "lease_owner",
    "goal",
    "policy_snapshot",
    "harness_snapshots",
    "pattern_id",
)
_APPROVAL_COLUMNS = tuple(f.column for f in ActionApproval._meta.concrete_fields)
_STEP_COLUMNS = ("status", "request", "idempotency_key")

_LOCK_RUN = (
    f"SELECT {', '.join('r.' + c for c in _RUN_COLUMNS)}, p.key FROM loops_looprun r "  # noqa: S608 (constants)
    "JOIN loops_looppattern p ON p.id = r.pattern_id "
    "WHERE r.id = (SELECT a.run_id FROM loops_actionapproval a WHERE a.id = %s) FOR UPDATE OF r"
)
_LOCK_APPROVAL = (
    f"SELECT {', '.join(_APPROVAL_COLUMNS)} FROM loops_actionapproval "  # noqa: S608 (constants)
    "WHERE id = %s FOR UPDATE"
)
_LOCK_STEP = (
    f"SELECT {', '.join('s.' + c for c in _STEP_COLUMNS)} FROM loops_loopstep s "  # noqa: S608 (constants)
    "JOIN loops_actionapproval a ON s.run_id = a.run_id AND s.seq = a.step_seq "
    "WHERE a.id = %s FOR UPDATE OF s"
)
_OTHERS_PENDING = (
    "SELECT count(*) FROM loops_actionapproval o JOIN loops_actionapproval a "
    "ON o.run_id = a.run_id AND o.id <> a.id WHERE a.id = %s AND o.status = 'pending'"
)
_INSERT_EVENT = (
    "INSERT INTO loops_loopevent (run_id, seq, type, from_status, to_status, actor, data, "
    "created_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)"
)


def approval_decide_batched(
    approval_id: uuid.UUID, user: Any, asked: DecisionAsked
) -> ActionApproval:
    """:func:`loops.services.approvals.approval_decide` in two round trips (PostgreSQL, outside
    an atomic block). The approval comes back with its run (and the run's pattern key)."""
    with db.batch() as batch:
        run_row = batch.add(_LOCK_RUN, [approval_id])
        approval_row = batch.add(_LOCK_APPROVAL, [approval_id])
        step_row = batch.add(_LOCK_STEP, [approval_id])
        others = batch.add(_OTHERS_PENDING, [approval_id])
        batch.sync()
        if not run_row.rows or not approval_row.rows:
            raise ActionApproval.DoesNotExist(f"approval {approval_id} does not exist")
        run = _run_of(run_row.rows[0])
        if run.wait or run.lease_owner is not None:
            raise db.NotPlain
        approval = _model_of(ActionApproval, _APPROVAL_COLUMNS, approval_row.rows[0])
        approval.run = run
        outcome = decided(approval, run, user, asked)
        now = timezone.now()
        step = dict(zip(_STEP_COLUMNS, step_row.rows[0], strict=True)) if step_row.rows else None
        if step is None:
            raise LoopStep.DoesNotExist(f"the gated step of approval {approval_id} is missing")
        step["request"] = db.json_value(step["request"])
        fields = step_rewritten(
            step, approval, arguments=outcome.final, content=outcome.rejection, now=now
        )
        batch.add(
            *_update(ActionApproval, approval.id, {f: getattr(approval, f) for f in DECIDED_FIELDS})
        )
        batch.add(*_update_step(approval, fields))
        actor = user.username
        seq = run.event_seq + 1
        batch.add(
            _INSERT_EVENT, _event(run.id, seq, outcome.event_type, actor, outcome.event_data, now)
        )
        resumes = not others.rows[0][0]
        run_values: dict[str, Any] = {"event_seq": seq + 1 if resumes else seq}
        if resumes:
            run_values.update(
                status=RunStatus.QUEUED.value,
                updated_at=now,
                lease_owner=None,
                lease_expires_at=None,
                not_before=None,
            )
            batch.add(
                _INSERT_EVENT,
                _event(run.id, seq + 1, "approval.resumed", actor, {}, now, moved=True),
            )
        batch.add(*_update(LoopRun, run.id, run_values))
        wakeups.touched(run.id)
    if resumes:
        nudge_run(run.id)  # committed: the nudge goes out now
    return approval


def _run_of(row: tuple[Any, ...]) -> LoopRun:
    run = _model_of(LoopRun, _RUN_COLUMNS, row[:-1])
    run.pattern = LoopPattern.from_db(connection.alias, ["id", "key"], [run.pattern_id, row[-1]])
    return run


def _model_of(model: type[Model], columns: tuple[str, ...], row: tuple[Any, ...]) -> Any:
    """An instance of ``model`` from ``row`` (its ``columns``' values as the batch read them:
    JSON as its text); the fields not read are deferred."""
    read = dict(zip(columns, row, strict=True))
    names, values = [], []
    for field in model._meta.concrete_fields:  # from_db wants the fields' own order
        if field.column in read:
            value = read[field.column]
            if field.get_internal_type() == "JSONField":
                value = db.json_value(value)
            names.append(field.attname)
            values.append(value)
    return model.from_db(connection.alias, names, values)


def _update(model: type[Model], pk: Any, values: dict[str, Any]) -> tuple[str, list[Any]]:
    assignments, params = set_clause(model, values)
    return f"UPDATE {model._meta.db_table} SET {assignments} WHERE id = %s", [*params, pk]  # noqa: S608


def _update_step(approval: ActionApproval, fields: dict[str, Any]) -> tuple[str, list[Any]]:
    assignments, params = set_clause(LoopStep, fields)
    sql = f"UPDATE loops_loopstep SET {assignments} WHERE run_id = %s AND seq = %s"  # noqa: S608
    return sql, [*params, approval.run_id, approval.step_seq]


def _event(
    run_id: uuid.UUID,
    seq: int,
    type: str,
    actor: str,
    data: dict[str, Any],
    now: Any,
    *,
    moved: bool = False,
) -> list[Any]:
    """An event's values; ``moved``: the run's re-queue (from waiting_approval to queued)."""
    statuses = (RunStatus.WAITING_APPROVAL.value, RunStatus.QUEUED.value) if moved else ("", "")
    return [
        run_id,
        seq,
        type,
        *statuses,
        actor,
        db.prepared(LoopEvent, "data", data),
        db.prepared(LoopEvent, "created_at", now),
    ]
