"""The one function that changes a run's status, and fenced writes for lease holders.

``run_transition`` locks the run row, checks the transition table and (for a worker) the
fencing token, updates the row and appends the event — all in one transaction. Leaving an
active state releases the lease and bumps the token, so a worker that was driving the run
cannot write anything more (it gets :class:`LeaseLost`). What an end touches besides the row
is the caller's ``on_end`` (:mod:`loops.services.endings`); an end without it is refused.

A run in a wait (``LoopRun.wait``, :mod:`loops.services.waits`) is parked by :func:`run_wait`:
the poll that starts the wait writes its event, later polls update only the row. Any transition
that leaves the wait (:func:`wait_goes_on`) writes ``wait.ended`` with the wait's summary before
its own event and clears the record; a run's quiet re-claim within a wait is restarted quietly.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from loops import db, state
from loops.models import LoopEvent, LoopRun, RunStatus
from loops.orm_private import NeedsCompiler, set_clause, update_sql
from loops.services.nudges import nudge_run
from loops.services.waits import WAIT_ENDED_EVENT, WaitPoll, wait_poll, wait_summary
from loops.state import TransitionRefused
from orchestrator import wakeups
from orchestrator.sql import (
    fetch_all,
    fetch_all_prepared,
    is_postgres,
    now_sql,
    placeholders,
    uuid_param,
)
from runtime.invocation import LeaseLost

#: States that record a ``terminal_reason`` (and usually a ``failure_reason`` text).
REASONED = frozenset({*state.TERMINAL, RunStatus.WAITING_HUMAN, RunStatus.BLOCKED})

#: The states a run reaches without leaving its wait, by the wait's kind: its parking and its
#: claim (and a worker's death on the way), and for a model wait its next try of the model.
_WITHIN_WAIT: dict[str, frozenset[RunStatus]] = {
    "lock": frozenset({RunStatus.WAITING_LOCK, RunStatus.QUEUED, RunStatus.PREPARING}),
    "model": frozenset(
        {RunStatus.QUEUED, RunStatus.PREPARING, RunStatus.RUNNING, RunStatus.VERIFYING}
    ),
}
_RESTARTS = frozenset({RunStatus.RUNNING, RunStatus.VERIFYING})


def wait_goes_on(wait: dict[str, Any] | None, to: RunStatus) -> bool:
    """Does a run in ``wait`` stay in it when it moves to ``to``? (No wait: nothing goes on.)"""
    return bool(wait) and to in _WITHIN_WAIT.get(str((wait or {}).get("kind")), frozenset())


class RunEnd(Protocol):
    """What a run's end touches besides its row, done in the transaction that ends it with the
    row locked; returns what the end's event records of it."""

    def __call__(
        self, *, run_id: uuid.UUID, pattern_id: int, actor: str, status: RunStatus
    ) -> dict[str, Any]: ...


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
        .values("status", "lease_owner", "lease_token", "event_seq", "pattern_id", "wait")
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
    on_end: RunEnd | None = None,
) -> TransitionResult:
    """Move a run to ``to`` and record the event, or refuse with the actual state.

    ``lease`` fences a worker's transition; ``expected_from`` narrows the allowed sources
    further than the table (human actions use it). ``fields`` are extra columns to set.
    ``on_end`` is required for a terminal ``to`` (``endings.run_transition`` passes it).

    A worker's transition with nothing else to do (for an end: ``on_end`` would write nothing)
    is one statement on PostgreSQL; everything else goes through :func:`_run_transition_exact`.
    """
    if to in state.TERMINAL and on_end is None:
        raise ValueError(f"ending run {run_id} needs on_end: use loops.services.endings")
    sources = None if expected_from is None else frozenset(s.value for s in expected_from)
    change = _Change(
        run_id, to, actor, event_type, lease, sources, dict(data or {}), fields or {}, on_end
    )
    if lease is not None and db.batches_are_sent_together():
        try:
            return _run_transition_batched(change)
        except db.NotPlain:
            pass
    return _run_transition_exact(change)


@dataclass(frozen=True)
class _Change:
    run_id: uuid.UUID
    to: RunStatus
    actor: str
    event_type: str
    lease: Lease | None
    sources: frozenset[str] | None
    data: dict[str, Any]
    fields: dict[str, Any]
    on_end: RunEnd | None


def _run_transition_batched(change: _Change) -> TransitionResult:
    """A lease holder's transition in one statement (PostgreSQL): lock the run if it is still
    held, in no wait and in a state the target may be reached from (and, for an end, has no path
    locks or pending approvals and leaves its pattern's breaker as it is), update it, append the
    event.
    When it matches nothing the exact path runs, and says why (or does the rest)."""
    assert change.lease is not None
    with db.batch() as batch:
        written = batch.add(*_transition_statement(change))
        wakeups.touched(change.run_id)
    if not written.rows:
        raise db.NotPlain
    current, seq = written.rows[0]
    if change.to == RunStatus.QUEUED:
        nudge_run(change.run_id)  # committed: the nudge goes out now
    return TransitionResult(change.run_id, current, change.to.value, int(seq))


def _transition_statement(change: _Change) -> tuple[str, list[Any]]:
    """One UPDATE of the run, conditional on the lease, a source state and (for an end) a
    clean end, and the INSERT of its event, as one statement. The UPDATE's own conditions are
    re-checked on the row it waited for, and the subquery in its RETURNING reads the row as
    the statement found it (its status before the transition)."""
    assert change.lease is not None
    sources = [s.value for s in state.sources_of(change.to)]
    if change.sources is not None:
        sources = [s for s in sources if s in change.sources]
    # An end that touches more (a failure, locks, approvals, a moving breaker) matches nothing.
    ends = _ENDS_CLEANLY.get(change.to, " AND FALSE") if change.to in state.TERMINAL else ""
    values, _ = _values({"lease_owner": change.lease.owner, "event_seq": 0}, change)
    values["event_seq"] = F("event_seq") + 1
    try:
        assignments, set_params = set_clause(LoopRun, values)
    except NeedsCompiler as unusual:  # a value only the ORM's compiler builds
        raise db.NotPlain from unusual
    prepared = [
        db.prepared(LoopEvent, name, value)
        for name, value in (
            ("type", change.event_type),
            ("to_status", change.to.value),
            ("actor", change.actor),
            ("data", change.data),
            ("created_at", timezone.now()),
        )
    ]
    sql = (
        f"WITH moved AS (UPDATE loops_looprun r SET {assignments} "
        "WHERE r.id = %s AND r.lease_owner = %s AND r.lease_token = %s "
        # A run in a wait takes the exact path, which ends the wait or keeps it.
        "AND r.wait = '{}'::jsonb "
        f"AND r.status IN ({placeholders(sources)}){ends} "
        "RETURNING r.id, r.event_seq, "
        "(SELECT o.status FROM loops_looprun o WHERE o.id = r.id) AS previous), "
        "logged AS (INSERT INTO loops_loopevent "
        "(run_id, seq, type, from_status, to_status, actor, data, created_at) "
        "SELECT id, event_seq, %s, previous, %s, %s, %s, %s FROM moved) "
        "SELECT previous, event_seq FROM moved"
    )
    held = [change.run_id, change.lease.owner, change.lease.token, *sources]
    return sql, [*set_params, *held, *prepared]


#: What an end needs to be written in one statement: what ``endings.run_end`` would write
#: nothing for. No path locks to free, no pending approvals to withdraw, and the pattern's
#: breaker left as it is (``breakers.records_nothing``); a failure always counts on the
#: breaker. tests/loops/test_run_endings.py holds the two rules to each other.
_CLEAN_END = (
    " AND NOT EXISTS (SELECT 1 FROM loops_pathlock l WHERE l.run_id = r.id)"
    " AND NOT EXISTS (SELECT 1 FROM loops_actionapproval a WHERE a.run_id = r.id"
    " AND a.status = 'pending')"
)
_PATTERN_BREAKER = (
    "SELECT 1 FROM loops_circuitstate c JOIN loops_looppattern p "
    "ON c.key = 'pattern:' || p.key WHERE p.id = r.pattern_id"
)
_ENDS_CLEANLY = {
    RunStatus.SUCCEEDED: (
        f"{_CLEAN_END} AND NOT EXISTS ({_PATTERN_BREAKER} "
        "AND (c.state <> 'closed' OR c.consecutive_failures > 0))"
    ),
    RunStatus.CANCELED: (
        f"{_CLEAN_END} AND NOT EXISTS ({_PATTERN_BREAKER} AND c.probe_owner = CAST(r.id AS TEXT))"
    ),
}


def _check(row: dict[str, Any], change: _Change) -> None:
    _check_lease(row, change.lease)
    current = row["status"]
    if change.sources is not None and current not in change.sources:
        raise TransitionRefused(current, change.to.value)
    if not state.can_transition(current, change.to.value):
        raise TransitionRefused(current, change.to.value)


def _values(row: dict[str, Any], change: _Change) -> tuple[dict[str, Any], int]:
    """The run's columns after the transition, and its event's seq."""
    values = _fields_for_target(change.to, change.lease, row)
    values.update(change.fields)
    if change.to in REASONED and not values.get("terminal_reason"):
        # Every run that ends or waits for a human says why; a path that forgot falls back
        # to its event type (docs/runs.md lists the explicit reasons).
        values["terminal_reason"] = change.event_type.replace(".", "_")[:60]
    seq = row["event_seq"] + 1
    values["event_seq"] = seq
    return values, seq


def _event(change: _Change, current: str, seq: int, data: dict[str, Any]) -> LoopEvent:
    return LoopEvent(
        run_id=change.run_id,
        seq=seq,
        type=change.event_type,
        from_status=current,
        to_status=change.to.value,
        actor=change.actor,
        data=data,
    )


@transaction.atomic
def _run_transition_exact(change: _Change) -> TransitionResult:
    """:func:`run_transition` one statement after the other, with the run's end (``on_end``)
    in the same transaction, and the end of the run's wait (``wait.ended``) when it leaves it."""
    run_id, to, actor = change.run_id, change.to, change.actor
    row = _lock_run(run_id)
    _check(row, change)
    current = row["status"]
    values, seq = _values(row, change)
    wait = row.get("wait") or {}
    events: list[LoopEvent] = []
    if wait and not wait_goes_on(wait, to):
        events.append(_wait_ended(change, wait, seq, current))
        values["wait"] = {}
        seq += 1
    elif wait and current == RunStatus.PREPARING and to in _RESTARTS:
        seq -= 1  # restarted after its quiet claim, within the wait: no event
    values["event_seq"] = seq
    LoopRun.objects.filter(pk=run_id).update(**values)
    data = dict(change.data)
    if to in state.TERMINAL and change.on_end is not None:
        ended = change.on_end(run_id=run_id, pattern_id=row["pattern_id"], actor=actor, status=to)
        data.update(ended)
    if seq > row["event_seq"]:
        events.append(_event(change, current, seq, data))
    LoopEvent.objects.bulk_create(events)
    wakeups.run_changed(run_id)
    if to == RunStatus.QUEUED:
        nudge_run(run_id)
    return TransitionResult(run_id=run_id, from_status=current, to_status=to.value, seq=seq)


def _wait_ended(change: _Change, wait: dict[str, Any], seq: int, status: str) -> LoopEvent:
    """The ``wait.ended`` event of a wait the change leaves (``ended_by`` its event type, to
    ``to``), written while the run is in ``status`` (its from and to status: a status event)."""
    summary = wait_summary(wait, timezone.now()) or {}
    return LoopEvent(
        run_id=change.run_id,
        seq=seq,
        type=WAIT_ENDED_EVENT,
        from_status=status,
        to_status=status,
        actor=change.actor,
        data={**summary, "ended_by": change.event_type, "to": change.to.value},
    )


@transaction.atomic
def run_wait(
    *,
    lease: Lease,
    to: RunStatus,
    kind: str,
    event_type: str,
    detail: dict[str, Any],
    data: dict[str, Any] | None = None,
    fields: dict[str, Any] | None = None,
) -> WaitPoll:
    """Park the lease holder's run in a ``kind`` wait (``waits.WAIT_KINDS``) in state ``to``,
    releasing the lease: the poll that starts the wait writes ``event_type`` (data: ``detail``
    and ``data``), every later poll updates only the row (status, ``fields``, the ``wait``
    record). A wait of another kind ends first (its ``wait.ended``). Returns the poll."""
    if to in state.TERMINAL:
        raise ValueError("a wait parks a run; ending it is run_transition's")
    change = _Change(
        lease.run_id,
        to,
        lease.owner,
        event_type,
        lease,
        None,
        {**detail, **(data or {})},
        fields or {},
        None,
    )
    row = _lock_run(lease.run_id)
    _check(row, change)
    previous = row.get("wait") or {}
    poll = wait_poll(previous, kind, timezone.now(), detail)
    values, seq = _values(row, change)
    events: list[LoopEvent] = []
    if poll.started and previous:
        events.append(_wait_ended(change, previous, seq, row["status"]))
        seq += 1
    if poll.started:
        events.append(_event(change, row["status"], seq, change.data))
    else:
        seq -= 1
    values.update(wait=poll.record, event_seq=seq)
    LoopRun.objects.filter(pk=lease.run_id).update(**values)
    LoopEvent.objects.bulk_create(events)
    wakeups.run_changed(lease.run_id)
    if to == RunStatus.QUEUED:
        nudge_run(lease.run_id)
    return poll


@transaction.atomic
def run_wait_end(*, lease: Lease, ended_by: str) -> int | None:
    """End the wait of a run its lease holder drives (a model answered again): ``wait.ended``
    (``ended_by`` names what ended it) and the record cleared. Returns the event's seq, or None
    when the run was in no wait. Raises LeaseLost when the lease is no longer held."""
    row = _lock_run(lease.run_id)
    _check_lease(row, lease)
    wait = row.get("wait") or {}
    if not wait:
        return None
    seq = row["event_seq"] + 1
    change = _Change(
        lease.run_id, RunStatus(row["status"]), lease.owner, ended_by, lease, None, {}, {}, None
    )
    LoopRun.objects.filter(pk=lease.run_id).update(
        wait={}, event_seq=seq, updated_at=timezone.now()
    )
    _wait_ended(change, wait, seq, row["status"]).save(force_insert=True)
    wakeups.run_changed(lease.run_id)
    return seq


def fence_touch_sql(
    lease: Lease, *, step_increment: int = 0, event_increment: int = 0
) -> tuple[str, list[Any]]:
    """The statement of :func:`fenced_touch`, for a caller that sends it in a batch."""
    sql = (
        "UPDATE loops_looprun SET step_count = step_count + %s, event_seq = event_seq + %s, "
        f"updated_at = {wakeups.touched_sql(now_sql(), lease.run_id)} "
        "WHERE id = %s AND lease_owner = %s AND lease_token = %s "
        "RETURNING step_count, event_seq"
    )
    return sql, [
        step_increment,
        event_increment,
        uuid_param(lease.run_id),
        lease.owner,
        lease.token,
    ]


def fenced_touch(
    lease: Lease, *, step_increment: int = 0, event_increment: int = 0
) -> tuple[int, int]:
    """Check the lease inside the caller's transaction and bump counters.

    Returns the new (step_count, event_seq). The UPDATE takes the row lock on PostgreSQL, so
    a takeover claim waits for this transaction, and a stale holder matches no row.
    """
    rows = fetch_all(
        *fence_touch_sql(lease, step_increment=step_increment, event_increment=event_increment)
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
        wakeups.run_changed(run_id)
    LoopEvent.objects.create(run_id=run_id, seq=seq, type=type, actor=actor, data=data)
    return seq


def run_update_fenced(lease: Lease, **fields: Any) -> None:
    """Set columns of a run the caller drives (cursor, result...), refused without the lease.
    One prepared statement (values prepared by their fields), not the ORM's compiler."""
    values = {**fields, "updated_at": timezone.now()}
    try:
        assignments, params = set_clause(LoopRun, values)
        sql = (
            f"UPDATE loops_looprun SET {assignments} "
            "WHERE id = %s AND lease_owner = %s AND lease_token = %s"
        )
        params += [uuid_param(lease.run_id), lease.owner, lease.token]
    except NeedsCompiler:
        sql, params = update_sql(
            LoopRun, values, pk=lease.run_id, lease_owner=lease.owner, lease_token=lease.token
        )
    with db.batch() as batch:  # its own transaction: one round trip on PostgreSQL
        written = batch.add(sql, params)
    if not written.rowcount:
        raise LeaseLost(f"lease on run {lease.run_id} is no longer held by {lease.owner}")


_STATUS_CHANGES_SQL = (
    "SELECT to_status, created_at FROM loops_loopevent "
    "WHERE run_id = %s AND to_status <> '' ORDER BY seq"
)


def run_status_changes(run_id: uuid.UUID) -> list[tuple[str, Any]]:
    """The run's status changes in order: ``(to_status, created_at)`` (aware datetimes). On
    PostgreSQL one prepared read (an invocation's start asks, for the working time); SQLite's
    stored text needs the ORM's conversion."""
    if is_postgres():
        return fetch_all_prepared("lw_run_status_changes", _STATUS_CHANGES_SQL, [run_id])
    changes = (
        LoopEvent.objects.filter(run_id=run_id)
        .exclude(to_status="")
        .order_by("seq")
        .values_list("to_status", "created_at")
    )
    return list(changes)
