"""Claiming runs with a lease and a fencing token; heartbeats; the reaper.

One transaction claims a batch: it picks claimable runs (``FOR UPDATE SKIP LOCKED`` on
PostgreSQL; SQLite serialises writers), skips patterns at their concurrency limit (re-counted
under the pattern's row lock, so two claimers cannot both take the last slot), then sets owner,
expiry (database clock) and a new token, and appends one event per claimed run, except for a
run in a wait (``LoopRun.wait``): its claim is one more poll of the wait and writes no event.
"""

from __future__ import annotations

import json
import uuid
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from loops import db, state
from loops.models import LoopEvent, LoopPattern, LoopRun, RunStatus
from loops.services import claim_sql
from loops.services.claims_failures import reaped_exhaustion_reason
from loops.services.endings import run_transition
from loops.services.locks import path_locks_sweep
from loops.services.nudges import nudge_run
from loops.services.transitions import Lease
from loops.services.workspaces import workspaces_root
from orchestrator import wakeups
from orchestrator.metrics import RUNS_REAPED
from orchestrator.sql import (
    fetch_all,
    is_postgres,
    now_plus_sql,
    now_sql,
    placeholders,
    seconds_param,
    skip_locked,
    uuid_param,
)
from runtime.invocation import ResumePoint

_CLAIMABLE = [s.value for s in state.CLAIMABLE]
_IN_FLIGHT = [s.value for s in state.IN_FLIGHT]


@dataclass(frozen=True)
class Claimed:
    lease: Lease
    from_status: str
    attempts: int
    #: The status the claim left the run in: ``preparing``, or ``running``/``verifying`` for a
    #: run the one-statement claim started (it needed no preparation).
    status: str = RunStatus.PREPARING.value
    #: The run's columns the engine needs (``claim_sql.RUN_COLUMNS``), when the claim read them.
    columns: dict[str, Any] | None = None
    #: For a run claimed before: the invocation it comes back to and where that invocation
    #: resumes (its checkpoint and the steps after it), read right after the claim
    #: (``engine.with_resume_steps``); None: not read.
    resume_steps: tuple[str, ResumePoint] | None = None


def _candidates(
    limit: int, run_ids: Sequence[uuid.UUID] | None
) -> tuple[list[tuple[Any, str, int, int | None]], set[str]]:
    """The candidates (id, status, pattern, its limit), and the ids of those in a wait."""
    rows = fetch_all(*_candidates_sql(limit, run_ids))
    waiting = {str(_as_uuid(row[0])) for row in rows if _in_wait(row[4])}
    return [(row[0], row[1], row[2], row[3]) for row in rows], waiting


def _in_wait(value: Any) -> bool:
    """Is a ``wait`` column as the database returned it (a dict, or JSON text) a wait?"""
    if isinstance(value, str):
        value = json.loads(value) if value.strip() else {}
    return bool(value)


def _candidates_sql(limit: int, run_ids: Sequence[uuid.UUID] | None) -> tuple[str, list[Any]]:
    """Claimable runs (of ``run_ids`` only, when given), locked (skipping those another
    claimer holds): id, status, pattern, its concurrency limit and the run's wait record."""
    in_flight = placeholders(_IN_FLIGHT)
    where_id = f"AND r.id IN ({placeholders(run_ids)}) " if run_ids is not None else ""
    sql = (
        "SELECT r.id, r.status, r.pattern_id, p.max_concurrency, r.wait "
        "FROM loops_looprun r JOIN loops_looppattern p ON p.id = r.pattern_id "
        f"WHERE r.status IN ({placeholders(_CLAIMABLE)}) "
        f"AND (r.not_before IS NULL OR r.not_before <= {now_sql()}) "
        f"AND (r.lease_expires_at IS NULL OR r.lease_expires_at < {now_sql()}) "
        f"{where_id}"
        "AND (p.max_concurrency IS NULL OR (SELECT count(*) FROM loops_looprun r2 "
        f"WHERE r2.pattern_id = r.pattern_id AND r2.status IN ({in_flight})) < p.max_concurrency) "
        "ORDER BY r.id LIMIT %s"
    )
    if is_postgres():
        sql += " FOR UPDATE OF r SKIP LOCKED"
    params: list[Any] = [*_CLAIMABLE]
    if run_ids is not None:
        params += [uuid_param(run_id) for run_id in run_ids]
    params += [*_IN_FLIGHT, limit]
    return sql, params


def _within_concurrency(rows: list[tuple[Any, str, int, int | None]]) -> list[tuple[Any, str]]:
    """Keep candidates whose pattern still has room, counted under the pattern row lock."""
    by_pattern: dict[int, list[tuple[Any, str]]] = defaultdict(list)
    limits: dict[int, int | None] = {}
    for run_id, status, pattern_id, limit in rows:
        by_pattern[pattern_id].append((run_id, status))
        limits[pattern_id] = limit
    accepted: list[tuple[Any, str]] = []
    for pattern_id, runs in by_pattern.items():
        limit = limits[pattern_id]
        if limit is None:
            accepted.extend(runs)
            continue
        list(LoopPattern.objects.select_for_update().filter(pk=pattern_id).values_list("pk"))
        busy = LoopRun.objects.filter(pattern_id=pattern_id, status__in=_IN_FLIGHT).count()
        accepted.extend(runs[: max(0, limit - busy)])
    return accepted


def _take(
    owner: str, lease_seconds: float, ids: list[Any], quiet: list[Any]
) -> list[tuple[Any, int, int, int]]:
    sql, params = _take_sql(owner, lease_seconds, ids, quiet)
    rows = fetch_all(f"{sql} RETURNING id, lease_token, event_seq, attempts", params)
    return [(r[0], int(r[1]), int(r[2]), int(r[3])) for r in rows]


def _take_sql(
    owner: str, lease_seconds: float, ids: list[Any], quiet: list[Any]
) -> tuple[str, list[Any]]:
    """The lease on locked candidates: owner, a new token (+1), expiry on the database
    clock, one more attempt and one more event (none for the ``quiet`` ones: runs in a wait)."""
    now = now_sql()
    events = f"CASE WHEN id IN ({placeholders(quiet)}) THEN 0 ELSE 1 END" if quiet else "1"
    sql = (
        "UPDATE loops_looprun SET status = %s, lease_owner = %s, lease_token = lease_token + 1, "
        f"lease_expires_at = {now_plus_sql()}, heartbeat_at = {now}, "
        f"attempts = attempts + 1, started_at = COALESCE(started_at, {now}), "
        f"event_seq = event_seq + {events}, updated_at = {now} "
        f"WHERE id IN ({placeholders(ids)})"
    )
    return sql, [RunStatus.PREPARING.value, owner, seconds_param(lease_seconds), *quiet, *ids]


def _as_uuid(value: Any) -> uuid.UUID:
    return value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))


def run_claim(
    *,
    owner: str,
    lease_seconds: float,
    limit: int | None = None,
    run_id: uuid.UUID | None = None,
    run_ids: Sequence[uuid.UUID] | None = None,
) -> list[Claimed]:
    """Claim runnable runs: up to ``limit`` due ones (1 by default), or those of ``run_ids``
    (or ``run_id``) that are runnable (the first ``limit`` of them, when given).

    On PostgreSQL, runs of patterns without a concurrency limit are claimed in one statement
    (``claim_sql``: picked, leased, logged, and started when they need no preparation); runs of
    limited patterns are counted under the pattern's row lock (:func:`_claim_exact`), which also
    takes whatever the one statement left of ``limit``.
    """
    if run_id is not None:
        run_ids = [run_id, *(run_ids or ())]
    if run_ids is not None:
        run_ids = list(dict.fromkeys(run_ids))[:limit]  # each once, in order
        if not run_ids:
            return []
        limit = len(run_ids)
    elif limit is None:
        limit = 1
    claims: list[Claimed] = []
    if db.batches_are_sent_together():
        claims = _claim_one_statement(owner, lease_seconds, limit, run_ids)
    if len(claims) < limit:
        # Runs the statement took are leased now: the exact path's candidates leave them out.
        claims += _claim_exact(
            owner=owner, lease_seconds=lease_seconds, limit=limit - len(claims), run_ids=run_ids
        )
    wakeups.runs_changed([claim.lease.run_id for claim in claims])  # committed: live streams
    return claims


def _claim_one_statement(
    owner: str, lease_seconds: float, limit: int, run_ids: Sequence[uuid.UUID] | None
) -> list[Claimed]:
    statement = claim_sql.claim_statement(
        owner=owner,
        lease_seconds=lease_seconds,
        limit=limit,
        run_ids=run_ids,
        workspaces=str(workspaces_root()),
    )
    with db.batch() as batch:
        taken = batch.add(*statement)
    return [
        Claimed(
            Lease(_as_uuid(row[0]), owner, int(row[3])),
            from_status=row[1],
            attempts=int(row[4]),
            status=row[2],
            columns=claim_sql.claimed_columns(row),
        )
        for row in taken.rows
    ]


def _claimed_event(lease: Lease, previous: str, seq: int, attempt: int) -> LoopEvent:
    return LoopEvent(
        run_id=lease.run_id,
        seq=seq,
        type="lease.claimed",
        from_status=previous,
        to_status=RunStatus.PREPARING.value,
        actor=lease.owner,
        data={"token": lease.token, "attempt": attempt},
    )


@transaction.atomic
def _claim_exact(
    *, owner: str, lease_seconds: float, limit: int, run_ids: Sequence[uuid.UUID] | None
) -> list[Claimed]:
    """:func:`run_claim`, concurrency limits counted under the patterns' row locks."""
    candidates, waiting = _candidates(limit, run_ids)
    accepted = _within_concurrency(candidates)
    if not accepted:
        return []
    from_status = {str(_as_uuid(rid)): status for rid, status in accepted}
    quiet = [rid for rid, _ in accepted if str(_as_uuid(rid)) in waiting]
    taken = _take(owner, lease_seconds, [rid for rid, _ in accepted], quiet)
    events, claims = [], []
    for rid, token, seq, attempts in taken:
        lease = Lease(_as_uuid(rid), owner, token)
        previous = from_status[str(lease.run_id)]
        if str(lease.run_id) not in waiting:
            events.append(_claimed_event(lease, previous, seq, attempts))
        claims.append(Claimed(lease, previous, attempts))
    LoopEvent.objects.bulk_create(events)
    return claims


def run_heartbeat(*, owner: str, run_ids: list[uuid.UUID], lease_seconds: float) -> set[uuid.UUID]:
    """Extend the leases this owner still holds; returns the ids it still holds."""
    if not run_ids:
        return set()
    sql = (
        f"UPDATE loops_looprun SET lease_expires_at = {now_plus_sql()}, "
        f"heartbeat_at = {now_sql()} "
        f"WHERE lease_owner = %s AND id IN ({placeholders(run_ids)}) RETURNING id"
    )
    params = [seconds_param(lease_seconds), owner, *[uuid_param(r) for r in run_ids]]
    with transaction.atomic():
        return {_as_uuid(row[0]) for row in fetch_all(sql, params)}


@dataclass
class ReapReport:
    requeued: list[uuid.UUID]
    failed: list[uuid.UUID]
    locks_freed: int = 0


def _expired_leases(limit: int) -> list[uuid.UUID]:
    sql = (
        "SELECT id FROM loops_looprun WHERE lease_owner IS NOT NULL "
        f"AND lease_expires_at < {now_sql()} ORDER BY lease_expires_at LIMIT %s" + skip_locked()
    )
    return [_as_uuid(row[0]) for row in fetch_all(sql, [limit])]


def _reap_one(run_id: uuid.UUID, report: ReapReport) -> None:
    with transaction.atomic():
        expired = _expired_leases_for(run_id)
        if expired is None:
            return
        attempts, max_attempts, status = expired
        if attempts >= max_attempts:
            run_transition(
                run_id=run_id,
                to=RunStatus.FAILED,
                actor="reaper",
                event_type="lease.expired",
                data={"attempts": attempts},
                fields={
                    "terminal_reason": "lease_attempts_exhausted",
                    # What really ended each attempt: deaths and driver errors, from events.
                    "failure_reason": reaped_exhaustion_reason(
                        run_id, attempts=attempts, max_attempts=max_attempts, status=status
                    ),
                },
            )
            report.failed.append(run_id)
        else:
            run_transition(
                run_id=run_id,
                to=RunStatus.QUEUED,
                actor="reaper",
                event_type="lease.expired",
                data={"attempts": attempts, "state": status},
            )
            report.requeued.append(run_id)


def _expired_leases_for(run_id: uuid.UUID) -> tuple[int, int, str] | None:
    sql = (
        "SELECT attempts, max_attempts, status FROM loops_looprun WHERE id = %s "
        f"AND lease_owner IS NOT NULL AND lease_expires_at < {now_sql()}" + skip_locked()
    )
    rows = fetch_all(sql, [uuid_param(run_id)])
    return (int(rows[0][0]), int(rows[0][1]), str(rows[0][2])) if rows else None


def runs_reap(*, limit: int = 500) -> ReapReport:
    """Re-queue runs whose lease expired (their worker died), or fail them past the limit."""
    report = ReapReport(requeued=[], failed=[])
    with transaction.atomic():
        candidates = _expired_leases(limit)
    for run_id in candidates:
        _reap_one(run_id, report)
    for outcome, reaped in (("requeued", report.requeued), ("failed", report.failed)):
        if reaped:
            RUNS_REAPED.labels(outcome=outcome).inc(len(reaped))
    report.locks_freed = path_locks_sweep()
    _renudge_stale_queued()
    return report


def _renudge_stale_queued(older_than_seconds: float = 10.0, limit: int = 200) -> None:
    """Queued runs that nobody picked up (their nudge was lost) get a new nudge."""
    cutoff = timezone.now() - timedelta(seconds=older_than_seconds)
    due = LoopRun.objects.filter(
        Q(not_before__isnull=True) | Q(not_before__lte=cutoff),
        status__in=_CLAIMABLE,
        updated_at__lte=cutoff,
        lease_owner__isnull=True,
    ).values_list("id", flat=True)[:limit]
    with transaction.atomic():
        for run_id in due:
            nudge_run(run_id)
