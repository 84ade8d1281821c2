"""The journal's statements, built without the ORM and guarded by the lease fence.

The journal writes two step rows and completes one per tool-loop step; building those through
the ORM (model instance, compiler) costs more CPU than the database takes to run them. These
write the same rows: each value is prepared by its model field (``get_db_prep_save``: JSON,
dates, decimals, UUIDs as the vendor stores them), only the statement is built once.

Every statement here carries the fence itself (``FROM loops_looprun r WHERE r.id = … AND
r.lease_owner = … AND r.lease_token = …``): sent in one batch after the fenced ``UPDATE`` of the
run (which takes the run's row lock), a batch whose lease was lost writes nothing at all, so it
can be committed in the same round trip without waiting to look at the fence's answer.
"""

from __future__ import annotations

import functools
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connection, connections
from django.utils import timezone

from loops import db
from loops.models import LoopEvent, LoopStep, StepStatus
from loops.services.budget_sql import number_param
from loops.services.transitions import Lease
from orchestrator.sql import now_sql, uuid_param

Statement = tuple[str, list[Any]]

_STEP_COLUMNS = (
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
#: The fence, for a statement that reads ``loops_looprun r``.
FENCE = "r.id = %s AND r.lease_owner = %s AND r.lease_token = %s"


def fence_params(lease: Lease) -> list[Any]:
    return [uuid_param(lease.run_id), lease.owner, lease.token]


@functools.cache
def _field(name: str) -> Any:
    return LoopStep._meta.get_field(name)


def _column(name: str) -> str:
    return str(connection.ops.quote_name(_field(name).column))


def _prepared(values: dict[str, Any], names: tuple[str, ...]) -> list[Any]:
    wrapper = connections[DEFAULT_DB_ALIAS]  # this thread's, looked up once (not per field)
    return [_field(name).get_db_prep_save(values[name], wrapper) for name in names]


def step_row(**values: Any) -> dict[str, Any]:
    """A step row with every column the model would default filled in (``run`` and ``seq``
    come from the fenced run row when it is inserted)."""
    return {
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


#: The fence, and the run's step count as a guarded fence (``budget_sql.fence_unchanged_sql``)
#: leaves it when it matched: a statement with it writes nothing after a fence that did not.
FENCE_AT_COUNT = f"{FENCE} AND r.step_count = %s"


@functools.cache
def _insert_sql(guarded: bool) -> str:
    columns = ", ".join(["run_id", "seq", *(_column(name) for name in _STEP_COLUMNS)])
    values = ", ".join(["%s"] * len(_STEP_COLUMNS))
    fence = FENCE_AT_COUNT if guarded else FENCE
    return (
        f"INSERT INTO {LoopStep._meta.db_table} ({columns}) "
        f"SELECT r.id, r.step_count - %s, {values} FROM loops_looprun r WHERE {fence}"
    )


def insert_step(
    lease: Lease, row: dict[str, Any], *, seq_back: int = 0, step_count: int | None = None
) -> Statement:
    """INSERT a step of the fenced run whose seq is the run's ``step_count`` (as the fence just
    raised it) minus ``seq_back``; nothing when the lease is lost (or, with ``step_count``,
    when the run does not have exactly that many steps)."""
    params = [seq_back, *_prepared(row, _STEP_COLUMNS), *fence_params(lease)]
    if step_count is None:
        return _insert_sql(False), params
    return _insert_sql(True), [*params, step_count]


def step_result(
    lease: Lease,
    *,
    now: datetime,
    started_at: datetime,
    response: Any,
    error: str,
    tokens_in: int = 0,
    tokens_out: int = 0,
    cost: Decimal = Decimal(0),
) -> dict[str, Any]:
    """The columns a step's completion sets."""
    return {
        "status": (StepStatus.FAILED if error else StepStatus.COMPLETED).value,
        "response": response,
        "error": error,
        "tokens_in": tokens_in,
        "tokens_out": tokens_out,
        "cost": cost,
        "finished_at": now,
        "duration_ms": max(0, int((now - started_at).total_seconds() * 1000)),
        "lease_token": lease.token,
    }


@functools.cache
def _complete_sql() -> str:
    assignments = ", ".join(f"{_column(name)} = %s" for name in _RESULT_COLUMNS)
    return (
        f"UPDATE {LoopStep._meta.db_table} SET {assignments} "
        "WHERE run_id = %s AND seq = %s AND status <> %s "
        f"AND EXISTS (SELECT 1 FROM loops_looprun r WHERE {FENCE})"
    )


def complete_unless_approved(lease: Lease, seq: int, result: dict[str, Any]) -> Statement:
    """Set a step's result unless it is an approved call (whose execution must be recorded
    too, the caller's slower path); one row when it was set."""
    params = [*_prepared(result, _RESULT_COLUMNS), uuid_param(lease.run_id), seq]
    return _complete_sql(), [*params, StepStatus.APPROVED.value, *fence_params(lease)]


def insert_event(lease: Lease, type: str, data: dict[str, Any]) -> Statement:
    """INSERT an event of the fenced run whose seq is the run's ``event_seq`` (as the fence
    just raised it); nothing when the lease is lost."""
    values = [
        db.prepared(LoopEvent, name, value)
        for name, value in (("data", data), ("created_at", timezone.now()))
    ]
    sql = (
        "INSERT INTO loops_loopevent "
        "(run_id, seq, type, from_status, to_status, actor, data, created_at) "
        "SELECT r.id, r.event_seq, %s, '', '', %s, %s, %s "
        f"FROM loops_looprun r WHERE {FENCE}"
    )
    return sql, [type, lease.owner, *values, *fence_params(lease)]


def occurrences(lease: Lease, digest: str) -> Statement:
    """Earlier tool steps of the run with the same call hash (the tool-loop policy's count)."""
    sql = (
        f"SELECT COUNT(*) FROM {LoopStep._meta.db_table} "
        "WHERE run_id = %s AND call_hash = %s AND kind = 'tool'"
    )
    return sql, [uuid_param(lease.run_id), digest]


def usage_add(
    lease: Lease,
    amounts: dict[str, Decimal],
    day: str,
    *,
    high_water: tuple[str, ...] = (),
    step_count: int | None = None,
) -> Statement:
    """Add ``amounts`` (metric → n) to the run's buckets and to its pattern's day ``day`` (an
    ISO date), whatever their limits, in the one order every writer takes them: the run's
    scope first, then the day, metrics sorted. The day's scope is
    ``pattern:<pattern id>:<day>``, the pattern id read from the fenced run row.

    ``high_water`` (metered metrics charged here) also keeps each one's largest single charge
    of the day (``<metric>:max_call``, which admissions on a shared daily budget weigh), after
    the counts. ``step_count`` guards it as it guards :func:`insert_step`.
    """
    fence = FENCE if step_count is None else FENCE_AT_COUNT
    sql, params = _usage_upsert(lease, amounts, day, high_water, "loops_looprun r", fence)
    guard = [] if step_count is None else [step_count]
    return sql, [*params, *fence_params(lease), *guard]


def _usage_upsert(
    lease: Lease,
    amounts: dict[str, Decimal],
    day: str,
    high_water: tuple[str, ...],
    source: str,
    where: str,
) -> Statement:
    """The upsert of :func:`usage_add`, the pattern id read from ``r.pattern_id`` of
    ``source`` (the fenced run row, or a CTE that returned it) where ``where`` holds (its
    parameters follow the ones returned)."""
    metrics = sorted(amounts)
    day_rows = [("", metric, amounts[metric]) for metric in metrics]
    day_rows += [("", f"{metric}:max_call", amounts[metric]) for metric in sorted(high_water)]
    rows = [(f"run:{lease.run_id}", metric, amounts[metric]) for metric in metrics] + day_rows
    values = ", ".join(["(%s, %s, %s, %s)"] * len(rows))
    now = now_sql()
    sql = (
        "INSERT INTO loops_usagebucket (scope, metric, value, updated_at) "
        "SELECT CASE WHEN v.column2 = '' THEN 'pattern:' || CAST(r.pattern_id AS TEXT) || %s "
        f"ELSE v.column2 END, v.column3, CAST(v.column4 AS NUMERIC), {now} "
        f"FROM (VALUES {values}) AS v, {source} "
        f"WHERE {where} "
        "ORDER BY CAST(v.column1 AS INTEGER) "
        "ON CONFLICT (scope, metric) DO UPDATE SET value = CASE WHEN excluded.metric LIKE "
        "'%%:max_call' THEN (CASE WHEN excluded.value > loops_usagebucket.value THEN "
        "excluded.value ELSE loops_usagebucket.value END) "
        f"ELSE loops_usagebucket.value + excluded.value END, updated_at = {now}"
    )
    params: list[Any] = [f":{day}"]
    for ordinal, (scope, metric, n) in enumerate(rows):
        params += [ordinal, scope, metric, number_param(n)]
    return sql, params


def invocation_started(lease: Lease, invocation: str) -> Statement:
    """Whether the run's invocation was started (its ``invocation.started`` event)."""
    sql = (
        "SELECT EXISTS (SELECT 1 FROM loops_loopevent WHERE run_id = %s "
        "AND type = 'invocation.started' AND data->>'invocation' = %s)"
    )
    return sql, [lease.run_id, invocation]


def call_counts(lease: Lease) -> Statement:
    """The run's repeated tool calls counted by call hash (``steps.call_counts``)."""
    sql = (
        "SELECT call_hash, COUNT(*) FROM loops_loopstep WHERE run_id = %s AND kind = 'tool' "
        "AND call_hash IS NOT NULL GROUP BY call_hash HAVING COUNT(*) > 1"
    )
    return sql, [lease.run_id]


#: The journal of one invocation in order: the columns a resume replays.
STEPS_OF_INVOCATION = (
    "SELECT seq, kind, status, name, idempotency_key, request, response, error "
    "FROM loops_loopstep WHERE run_id = %s AND invocation = %s ORDER BY seq"
)
#: The same columns, of the steps after seq ``%s`` (a resume from a checkpoint).
STEPS_AFTER = (
    "SELECT seq, kind, status, name, idempotency_key, request, response, error "
    "FROM loops_loopstep WHERE run_id = %s AND invocation = %s AND seq > %s ORDER BY seq"
)


#: Whether the run's invocation ``%s`` was started (its ``invocation.started`` event).
_STARTED = (
    "EXISTS (SELECT 1 FROM loops_loopevent e WHERE e.run_id = r.id "
    "AND e.type = 'invocation.started' AND e.data->>'invocation' = %s)"
)


def invocation_start_unchanged(
    lease: Lease,
    fingerprint: tuple[str, str],
    *,
    invocation: str,
    role: str,
    amounts: dict[str, Decimal],
    day: str,
) -> Statement:
    """An invocation's start in one statement (PostgreSQL), for a caller whose limits
    (``fingerprint``: the MD5s of the run's policy snapshot and its pattern's policy, as
    ``budget_rules.RunLimits`` has them) let it start without a judgement. The fence requires the
    lease, those policy texts unchanged and the invocation not started yet; when it matches,
    the run's event seq is raised, the ``invocation.started`` event written and ``amounts``
    counted (:func:`usage_add`), all from the fence's row. Whatever the fence did, the one row
    returned (none: the lease is lost) says: the new event seq (NULL when the fence did not
    match), whether the invocation had started already, the run's step count, its limit
    columns (``budget_sql.LIMIT_COLUMNS``) and its tool calls so far by hash (JSON pairs), as the
    statement found them."""
    data = {"invocation": invocation, "role": role}
    event = [
        db.prepared(LoopEvent, name, value)
        for name, value in (("data", data), ("created_at", timezone.now()))
    ]
    upsert, upsert_params = _usage_upsert(lease, amounts, day, (), "fence r", "TRUE")
    sql = (
        "WITH fence AS (UPDATE loops_looprun r SET event_seq = r.event_seq + 1, "
        f"updated_at = {now_sql()} WHERE {FENCE} "
        "AND md5(COALESCE(r.policy_snapshot::text, '')) = %s "
        "AND md5(COALESCE((SELECT p.policy::text FROM loops_looppattern p "
        f"WHERE p.id = r.pattern_id), '')) = %s AND NOT {_STARTED} "
        "RETURNING r.id, r.event_seq, r.pattern_id), "
        "logged AS (INSERT INTO loops_loopevent "
        "(run_id, seq, type, from_status, to_status, actor, data, created_at) "
        "SELECT id, event_seq, 'invocation.started', '', '', %s, %s, %s FROM fence), "
        f"counted AS ({upsert}) "
        f"SELECT (SELECT event_seq FROM fence), {_STARTED}, r.step_count, r.pattern_id, "
        "r.policy_snapshot, (SELECT p.policy FROM loops_looppattern p WHERE p.id = r.pattern_id), "
        "(SELECT jsonb_agg(jsonb_build_array(c.call_hash, c.n)) FROM (SELECT call_hash, "
        "COUNT(*) AS n FROM loops_loopstep WHERE run_id = r.id AND kind = 'tool' "
        "AND call_hash IS NOT NULL GROUP BY call_hash HAVING COUNT(*) > 1) c) "
        f"FROM loops_looprun r WHERE {FENCE}"
    )
    params = [*fence_params(lease), *fingerprint, invocation, lease.owner, *event]
    return sql, [*params, *upsert_params, invocation, *fence_params(lease)]
