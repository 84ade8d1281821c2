"""The one function that changes a run's status, and fenced writes for lease holders.

``run_transition`` locks the run row, checks the transition table and (for a worker) the
fencing token, updates the row and appends the event — all in one transaction. Leaving an
active state releases the lease and bumps the token, so a worker that was driving the run
cannot write anything more (it gets :class:`LeaseLost`).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from loops import db, state
from loops.invokers import LeaseLost
from loops.models import LoopEvent, LoopRun, RunStatus
from loops.state import TransitionRefused

#: States that record a ``terminal_reason`` (and usually a ``failure_reason`` text).
REASONED = frozenset({*state.TERMINAL, RunStatus.WAITING_HUMAN, RunStatus.BLOCKED})


@dataclass(frozen=True)
class Lease:
    """A worker's hold on a run: every write it makes is conditional on ``token``."""

    run_id: uuid.UUID
    owner: str
    token: int


@dataclass(frozen=True)
class TransitionResult:
    run_id: uuid.UUID
    from_status: str
    to_status: str
    seq: int


def _lock_run(run_id: uuid.UUID) -> dict[str, Any]:
    found = (
        LoopRun.objects.select_for_update()
        .filter(pk=run_id)
        .values("status", "lease_owner", "lease_token", "event_seq", "pattern_id")
        .first()
    )
    if found is None:
        raise LoopRun.DoesNotExist(f"run {run_id} does not exist")
    return dict(found)


def _check_lease(row: dict[str, Any], lease: Lease | None) -> None:
    if lease is None:
        return
    if row["lease_owner"] != lease.owner or row["lease_token"] != lease.token:
        raise LeaseLost(f"lease on run {lease.run_id} is no longer held by {lease.owner}")


def _fields_for_target(
    target: RunStatus, lease: Lease | None, row: dict[str, Any]
) -> dict[str, Any]:
    now = timezone.now()
    fields: dict[str, Any] = {"status": target.value, "updated_at": now}
    if target not in state.ACTIVE:
        fields.update(lease_owner=None, lease_expires_at=None)
        if row["lease_owner"] is not None:
            # Take the run away from whoever held it: their token no longer matches.
            fields["lease_token"] = F("lease_token") + 1
        if lease is not None:
            fields["attempts"] = 0  # a clean release ends the streak of claims
    if target in state.TERMINAL:
        fields["finished_at"] = now
    if target == RunStatus.QUEUED:
        fields["not_before"] = None  # due at once (callers may set a later time)
    return fields


@transaction.atomic
def run_transition(
    *,
    run_id: uuid.UUID,
    to: RunStatus,
    actor: str,
    event_type: str = "status.changed",
    lease: Lease | None = None,
    expected_from: Iterable[RunStatus] | None = None,
    data: dict[str, Any] | None = None,
    fields: dict[str, Any] | None = None,
) -> TransitionResult:
    """Move a run to ``to`` and record the event, or refuse with the actual state.

    ``lease`` fences a worker's transition; ``expected_from`` narrows the allowed sources
    further than the table (human actions use it). ``fields`` are extra columns to set.
    """
    row = _lock_run(run_id)
    _check_lease(row, lease)
    current = row["status"]
    if expected_from is not None and current not in {s.value for s in expected_from}:
        raise TransitionRefused(current, to.value)
    if not state.can_transition(current, to.value):
        raise TransitionRefused(current, to.value)
    values = _fields_for_target(to, lease, row)
    values.update(fields or {})
    if to in REASONED and not values.get("terminal_reason"):
        # Every run that ends or waits for a human says why; a path that forgot falls back
        # to its event type (docs/runs.md lists the explicit reasons).
        values["terminal_reason"] = event_type.replace(".", "_")[:60]
    seq = row["event_seq"] + 1
    values["event_seq"] = seq
    LoopRun.objects.filter(pk=run_id).update(**values)
    data = dict(data or {})
    if to in state.TERMINAL:
        from loops.services.approvals import approvals_withdraw
        from loops.services.breakers import breaker_record_outcome, breaker_summary
        from loops.services.locks import path_locks_release

        path_locks_release(run_id=run_id)
        # In this transaction: the queue never shows a dead run's approvals.
        withdrawn = approvals_withdraw(run_id=run_id, actor=actor, status=to.value)
        if withdrawn:
            data["withdrawn_approvals"] = withdrawn
        changed = breaker_record_outcome(pattern_id=row["pattern_id"], run_id=run_id, status=to)
        if changed is not None:
            data["breaker"] = breaker_summary(changed)
    LoopEvent.objects.create(
        run_id=run_id,
        seq=seq,
        type=event_type,
        from_status=current,
        to_status=to.value,
        actor=actor,
        data=data,
    )
    if to == RunStatus.QUEUED:
        from loops.services.nudges import nudge_run

        nudge_run(run_id)
    return TransitionResult(run_id=run_id, from_status=current, to_status=to.value, seq=seq)


def fenced_touch(
    lease: Lease, *, step_increment: int = 0, event_increment: int = 0
) -> tuple[int, int]:
    """Check the lease inside the caller's transaction and bump counters.

    Returns the new (step_count, event_seq). The UPDATE takes the row lock on PostgreSQL, so
    a takeover claim waits for this transaction, and a stale holder matches no row.
    """
    sql = (
        "UPDATE loops_looprun SET step_count = step_count + %s, event_seq = event_seq + %s, "
        f"updated_at = {db.now_sql()} "
        "WHERE id = %s AND lease_owner = %s AND lease_token = %s "
        "RETURNING step_count, event_seq"
    )
    rows = db.fetch_all(
        sql,
        [step_increment, event_increment, db.uuid_param(lease.run_id), lease.owner, lease.token],
    )
    if not rows:
        raise LeaseLost(f"lease on run {lease.run_id} is no longer held by {lease.owner}")
    return int(rows[0][0]), int(rows[0][1])


@transaction.atomic
def run_event_append(
    *, run_id: uuid.UUID, type: str, actor: str, data: dict[str, Any], lease: Lease | None = None
) -> int:
    """Append a non-transition event (fenced when a lease is given); returns its seq."""
    if lease is not None:
        _, seq = fenced_touch(lease, event_increment=1)
    else:
        row = _lock_run(run_id)
        seq = row["event_seq"] + 1
        LoopRun.objects.filter(pk=run_id).update(event_seq=seq)
    LoopEvent.objects.create(run_id=run_id, seq=seq, type=type, actor=actor, data=data)
    return seq


@transaction.atomic
def run_update_fenced(lease: Lease, **fields: Any) -> None:
    """Set columns of a run the caller drives (cursor, result...), refused without the lease."""
    updated = LoopRun.objects.filter(
        pk=lease.run_id, lease_owner=lease.owner, lease_token=lease.token
    ).update(**fields, updated_at=timezone.now())
    if not updated:
        raise LeaseLost(f"lease on run {lease.run_id} is no longer held by {lease.owner}")


__all__ = [
    "Lease",
    "LeaseLost",
    "TransitionRefused",
    "TransitionResult",
    "fenced_touch",
    "run_event_append",
    "run_transition",
    "run_update_fenced",
]
